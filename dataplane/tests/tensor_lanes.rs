//! The lane abstraction: a kernel writes once into the buffer its lane hands
//! out on its core; small tensors and tensors the lane cannot take go inline
//! (the latter flagged as fallbacks); a shm tensor's lease frees its slot
//! when dropped and renews its name after a worker consumed it. The last
//! test runs the real image kernel on a data-plane core straight into a shm
//! slot and compares the file's bytes with the kernel's own output.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use smg_dataplane::lanes::{
    InlineLane, LaneChoice, LaneKind, SealedTensor, ShmLane, ShmLaneConfig, WirePayload,
    WriteError, write_through,
};
use smg_dataplane::preprocess::{ImageLimits, Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_dataplane::runtime::{DataPlane, DataPlaneConfig, IoBackend};
use smg_shared::tensor::DType;

fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

fn shm_lane(dir: &Path, keep_free_bytes: u64) -> Arc<ShmLane> {
    Arc::new(
        ShmLane::create(
            &ShmLaneConfig {
                dir: dir.to_path_buf(),
                slot_bytes: 4096,
                slots_per_core: 1,
                reclaim_after: Duration::from_secs(60),
                keep_free_bytes,
            },
            2,
        )
        .unwrap(),
    )
}

fn choice(lane: Arc<ShmLane>, min_bytes: usize) -> LaneChoice {
    LaneChoice { lane, min_bytes }
}

fn fill(byte: u8) -> impl FnOnce(&mut [u8]) -> Result<(), ()> {
    move |dst: &mut [u8]| {
        dst.fill(byte);
        Ok(())
    }
}

fn written(choice: Option<&LaneChoice>, core: usize, nbytes: usize, byte: u8) -> SealedTensor {
    write_through(choice, core, nbytes, fill(byte)).unwrap()
}

/// Reads the handle's `nbytes` from offset 0 and unlinks the name, as a
/// worker does (a slot's file is the slot's size, not the tensor's).
fn worker_reads(dir: &Path, payload: &WirePayload) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let WirePayload::Shm { name, nbytes } = payload else {
        panic!("not a shm payload: {payload:?}");
    };
    let path: PathBuf = dir.join(name);
    let mut bytes = vec![0u8; *nbytes as usize];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact_at(&mut bytes, 0)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

#[test]
fn without_a_lane_the_tensor_is_inline_bytes() {
    let sealed = written(None, 0, 10, 7);
    assert_eq!(sealed.lane, LaneKind::Inline);
    assert_eq!(
        sealed.payload,
        WirePayload::Inline(Bytes::from(vec![7; 10]))
    );
    assert!(sealed.lease.is_none() && sealed.fallback.is_none());
    let inline = LaneChoice {
        lane: Arc::new(InlineLane),
        min_bytes: 0,
    };
    assert_eq!(written(Some(&inline), 0, 3, 1).fallback, None);
}

#[test]
fn the_shm_lane_takes_tensors_from_the_threshold_up_and_frees_on_drop() {
    let dir = scratch_dir();
    let lane = shm_lane(dir.path(), 0);
    let choice = choice(Arc::clone(&lane), 100);

    let small = written(Some(&choice), 0, 99, 1);
    assert_eq!(small.lane, LaneKind::Inline, "under the threshold");
    assert_eq!(small.fallback, None, "by policy, not a fallback");

    let sealed = written(Some(&choice), 1, 1000, 2);
    assert_eq!(sealed.lane, LaneKind::Shm);
    assert_eq!(lane.occupancy().slots_in_use, 1);
    assert!(worker_reads(dir.path(), &sealed.payload) == vec![2; 1000]);
    let lease = sealed.lease.unwrap();
    let held = lease.clone();
    drop(lease);
    assert_eq!(lane.occupancy().slots_in_use, 1, "a clone still holds it");
    drop(held);
    assert_eq!(lane.occupancy().slots_in_use, 0);
    assert_eq!(lane.occupancy().slots_total, 2, "one slot per core");
}

#[test]
fn a_renewed_lease_names_the_same_bytes_again() {
    let dir = scratch_dir();
    let lane = shm_lane(dir.path(), 0);
    let sealed = written(Some(&choice(Arc::clone(&lane), 0)), 0, 64, 9);
    let lease = sealed.lease.clone().unwrap();
    assert_eq!(lease.renew().unwrap(), None, "the name still exists");
    assert!(worker_reads(dir.path(), &sealed.payload) == vec![9; 64]);
    let renewed = lease.renew().unwrap().expect("a fresh name");
    assert_ne!(renewed, sealed.payload);
    assert!(worker_reads(dir.path(), &renewed) == vec![9; 64]);
    drop(sealed);
    drop(lease);
    assert_eq!(lane.occupancy().slots_in_use, 0);
}

#[test]
fn a_tensor_the_tmpfs_has_no_room_for_goes_inline_as_a_fallback() {
    let dir = scratch_dir();
    let lane = shm_lane(dir.path(), u64::MAX);
    let choice = choice(lane, 0);
    // Larger than a slot, and no one-off file may eat into the reserve.
    let sealed = written(Some(&choice), 0, 10_000, 5);
    assert_eq!(sealed.lane, LaneKind::Inline);
    assert_eq!(
        sealed.payload,
        WirePayload::Inline(Bytes::from(vec![5; 10_000]))
    );
    let fallback = sealed.fallback.unwrap();
    assert_eq!(
        (fallback.requested, fallback.reason),
        (LaneKind::Shm, "shm_no_space")
    );
}

#[test]
fn a_failing_kernel_returns_the_slot() {
    let dir = scratch_dir();
    let lane = shm_lane(dir.path(), 0);
    let choice = choice(Arc::clone(&lane), 0);
    let failed = write_through(Some(&choice), 0, 100, |_| Err("corrupt"));
    assert!(matches!(failed, Err(WriteError::Write("corrupt"))));
    assert_eq!(lane.occupancy().slots_in_use, 0);
}

#[tokio::test]
async fn the_kernel_writes_an_image_straight_into_a_shm_slot() {
    let config = VisionPreprocessConfig::from_model_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model"),
    )
    .unwrap();
    let processor = Arc::new(Qwen2VlImageProcessor::new(config, ImageLimits::default()).unwrap());
    let image = Bytes::from(
        std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/images/rgba_150x100.png"),
        )
        .unwrap(),
    );
    let expected = processor.preprocess(&image, DType::BFloat16).unwrap();
    let dir = scratch_dir();
    let lane = Arc::new(
        ShmLane::create(
            &ShmLaneConfig {
                dir: dir.path().to_path_buf(),
                slot_bytes: 1 << 20,
                slots_per_core: 1,
                reclaim_after: Duration::from_secs(60),
                keep_free_bytes: 0,
            },
            1,
        )
        .unwrap(),
    );
    let dataplane = DataPlane::start(DataPlaneConfig {
        io: IoBackend::Plain,
        ..DataPlaneConfig::default()
    })
    .unwrap();
    let done = dataplane
        .preprocess_into_lane(
            processor,
            image,
            DType::BFloat16,
            LaneChoice {
                lane: lane.clone(),
                min_bytes: 0,
            },
        )
        .await
        .unwrap();
    assert_eq!(done.plan, expected.plan);
    assert_eq!(done.tensor.lane, LaneKind::Shm);
    assert!(worker_reads(dir.path(), &done.tensor.payload) == expected.data);
    drop(done);
    assert_eq!(lane.occupancy().slots_in_use, 0);
    drop(dataplane);
}
