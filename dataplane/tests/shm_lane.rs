//! The shm lane against real tmpfs files: slots get fresh names, are reused
//! only once the reader unlinked the name and the RPC returned, lingering
//! names are reclaimed after the deadline, oversize tensors get one-off
//! files, orphans of dead gateway processes are swept and a live process's
//! names are not (its owner-file lock proves it alive). Each test works
//! in its own directory under /dev/shm (or the temp dir where /dev/shm is
//! missing) and counts the names in it.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use smg_dataplane::lanes::shm::{
    OWNER_SUFFIX, Occupancy, ShmError, ShmPool, ShmPoolConfig, SweepSummary, boot_tag,
    instance_stem, instance_stem_of, sweep_orphans,
};

fn scratch_dir() -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    if base.is_dir() {
        tempfile::tempdir_in(base).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn pool(dir: &Path, slots: usize, slot_bytes: usize, reclaim_after: Duration) -> ShmPool {
    ShmPool::create(ShmPoolConfig {
        dir: dir.to_path_buf(),
        slot_bytes,
        slots,
        reclaim_after,
        keep_free_bytes: 0,
    })
    .unwrap()
}

/// Names in `dir` beyond `baseline` (the pool's private slot files).
fn extra(dir: &Path, baseline: &[String]) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|name| !baseline.contains(name))
        .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// What a TokenSpeed worker does: open without following links, read,
/// unlink the name.
fn worker_reads(dir: &Path, name: &str) -> Vec<u8> {
    let path: PathBuf = dir.join(name);
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

fn write_tensor(pool: &ShmPool, bytes: &[u8]) -> smg_dataplane::lanes::shm::ShmTensor {
    let mut writer = pool.acquire(bytes.len()).unwrap();
    writer.buffer().copy_from_slice(bytes);
    writer.publish().unwrap()
}

#[test]
fn a_published_tensor_is_a_private_name_holding_exactly_its_bytes() {
    let dir = scratch_dir();
    let pool = pool(dir.path(), 2, 4096, Duration::from_secs(60));
    let slots = names(dir.path());
    assert_eq!(
        slots.len(),
        3,
        "one private file per slot, and the owner file"
    );
    assert!(slots.contains(&format!("{}{OWNER_SUFFIX}", instance_stem())));
    let tensor = write_tensor(&pool, b"pixels!");
    assert_eq!(extra(dir.path(), &slots), [tensor.name().to_owned()]);
    assert!(tensor.name().starts_with(&format!("{}-", instance_stem())));
    assert_eq!(tensor.nbytes(), 7);
    let meta = std::fs::metadata(dir.path().join(tensor.name())).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // The file is the slot's full size; the handle's nbytes says how much
    // is the tensor.
    assert_eq!(&worker_reads(dir.path(), tensor.name())[..7], b"pixels!");
    drop(tensor);
    assert!(extra(dir.path(), &slots).is_empty());
    assert_eq!(
        pool.occupancy(),
        Occupancy {
            free: 2,
            busy: 0,
            one_off_files: 0
        }
    );
    drop(pool);
    assert!(
        names(dir.path()).is_empty(),
        "a dropped pool removes its files"
    );
}

#[test]
fn every_publication_gets_a_fresh_name() {
    let dir = scratch_dir();
    let pool = pool(dir.path(), 1, 64, Duration::from_secs(60));
    let slots = names(dir.path());
    let mut seen = std::collections::HashSet::new();
    for round in 0..20u8 {
        let tensor = write_tensor(&pool, &[round; 8]);
        assert!(seen.insert(tensor.name().to_owned()), "name reused");
        assert_eq!(worker_reads(dir.path(), tensor.name())[..8], [round; 8]);
    }
    assert!(extra(dir.path(), &slots).is_empty());
}

#[test]
fn a_slot_is_not_reused_while_its_name_exists_or_its_rpc_is_in_flight() {
    let dir = scratch_dir();
    let pool = pool(dir.path(), 1, 64, Duration::from_secs(60));
    let slots = names(dir.path());
    let first = write_tensor(&pool, &[1; 8]);
    // RPC in flight, name present: the only slot is busy, so a second tensor
    // goes to a one-off file instead of overwriting the first.
    let second = write_tensor(&pool, &[2; 8]);
    assert_eq!(
        pool.occupancy(),
        Occupancy {
            free: 0,
            busy: 1,
            one_off_files: 1
        }
    );
    // The worker read and unlinked, but the RPC has not returned: still busy.
    assert_eq!(worker_reads(dir.path(), first.name())[..8], [1; 8]);
    assert_eq!(pool.occupancy().free, 0);
    drop(first);
    assert_eq!(pool.occupancy().free, 1);
    // The one-off file is unlinked by its guard, not reused.
    assert_eq!(worker_reads(dir.path(), second.name()), [2; 8]);
    drop(second);
    assert_eq!(
        pool.occupancy(),
        Occupancy {
            free: 1,
            busy: 0,
            one_off_files: 0
        }
    );
    assert!(extra(dir.path(), &slots).is_empty());
}

#[test]
fn returned_rpc_whose_name_remains_waits_for_the_deadline_then_is_reclaimed() {
    let dir = scratch_dir();
    let reclaim_after = Duration::from_secs(60);
    let pool = pool(dir.path(), 1, 64, reclaim_after);
    let slots = names(dir.path());
    let tensor = write_tensor(&pool, &[7; 8]);
    let name = tensor.name().to_owned();
    // A worker that died: it never unlinks. The RPC returns (with an error).
    drop(tensor);
    let returned = Instant::now();
    assert_eq!(
        pool.occupancy().free,
        0,
        "name still there, deadline not reached"
    );
    assert_eq!(
        pool.occupancy_at(returned + reclaim_after / 2).free,
        0,
        "half the deadline later"
    );
    assert_eq!(extra(dir.path(), &slots), std::slice::from_ref(&name));
    assert_eq!(
        pool.occupancy_at(returned + reclaim_after + Duration::from_secs(1))
            .free,
        1,
        "reclaimed after the deadline"
    );
    assert!(
        extra(dir.path(), &slots).is_empty(),
        "the lingering name was removed"
    );
    drop(pool);
    assert!(
        names(dir.path()).is_empty(),
        "a dropped pool removes its files"
    );
}

#[test]
fn an_unpublished_writer_returns_its_slot() {
    let dir = scratch_dir();
    let pool = pool(dir.path(), 1, 64, Duration::from_secs(60));
    let slots = names(dir.path());
    let mut writer = pool.acquire(16).unwrap();
    writer.buffer().fill(3);
    assert_eq!(pool.occupancy().busy, 1);
    drop(writer); // e.g. the kernel failed on a corrupt image
    assert_eq!(
        pool.occupancy(),
        Occupancy {
            free: 1,
            busy: 0,
            one_off_files: 0
        }
    );
    assert!(extra(dir.path(), &slots).is_empty());
}

#[test]
fn oversize_tensors_use_a_one_off_file_removed_when_the_rpc_returns() {
    let dir = scratch_dir();
    let pool = pool(dir.path(), 1, 64, Duration::from_secs(60));
    let slots = names(dir.path());
    let big: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let tensor = write_tensor(&pool, &big);
    assert_eq!(
        pool.occupancy(),
        Occupancy {
            free: 1,
            busy: 0,
            one_off_files: 1
        }
    );
    let path = dir.path().join(tensor.name());
    assert_eq!(std::fs::read(&path).unwrap(), big);
    // The worker never unlinks; the guard removes the name anyway.
    drop(tensor);
    assert!(!path.exists());
    assert!(extra(dir.path(), &slots).is_empty());
    assert_eq!(pool.occupancy().one_off_files, 0);
}

#[test]
fn a_directory_too_small_is_refused_up_front() {
    let dir = scratch_dir();
    let err = ShmPool::create(ShmPoolConfig {
        dir: dir.path().to_path_buf(),
        slot_bytes: usize::MAX / 4,
        slots: 2,
        reclaim_after: Duration::from_secs(1),
        keep_free_bytes: 0,
    })
    .unwrap_err();
    assert!(matches!(err, ShmError::NoSpace { .. }), "{err:?}");
    assert_eq!(err.code(), "shm_no_space");
    let pool = pool(dir.path(), 1, 64, Duration::from_secs(60));
    let slots = names(dir.path());
    let err = pool.acquire(usize::MAX / 4).unwrap_err();
    assert_eq!(err.code(), "shm_no_space");
    assert!(extra(dir.path(), &slots).is_empty());
}

#[test]
fn the_sweep_removes_names_of_dead_gateways_only() {
    let dir = scratch_dir();
    let pool = pool(dir.path(), 1, 64, Duration::from_secs(60));
    let slots = names(dir.path());
    let live = write_tensor(&pool, &[1; 4]);
    // A gone instance of this boot: an owner file nobody holds locked.
    let dead = instance_stem_of(boot_tag(), b"gone-gateway");
    let orphan = format!("{dead}-{}", "ab".repeat(16));
    let dead_owner = format!("{dead}{OWNER_SUFFIX}");
    let unrelated = "someone-elses-segment".to_owned();
    // An older gateway's pid-based name: nothing proves its owner gone.
    let old_format = format!("smg-4242-12345-{}", "ab".repeat(16));
    for name in [&orphan, &dead_owner, &unrelated, &old_format] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    assert_eq!(
        sweep_orphans(dir.path()).unwrap(),
        SweepSummary {
            removed: 2,
            // Our slot, its public name and owner file, and the old name.
            kept: 4,
            errors: 0
        }
    );
    let mut expected = vec![live.name().to_owned(), old_format, unrelated];
    expected.sort();
    assert_eq!(extra(dir.path(), &slots), expected);
}

#[test]
fn concurrent_writers_never_share_a_slot() {
    let dir = scratch_dir();
    let pool = pool(dir.path(), 4, 256, Duration::from_secs(60));
    let slots = names(dir.path());
    std::thread::scope(|scope| {
        for thread in 0..4u8 {
            let pool = pool.clone();
            let dir = dir.path();
            scope.spawn(move || {
                for round in 0..200u32 {
                    let stamp = [thread, (round % 251) as u8];
                    let body: Vec<u8> = stamp.iter().copied().cycle().take(256).collect();
                    let tensor = write_tensor(&pool, &body);
                    assert_eq!(worker_reads(dir, tensor.name()), body);
                }
            });
        }
    });
    assert_eq!(
        pool.occupancy(),
        Occupancy {
            free: 4,
            busy: 0,
            one_off_files: 0
        }
    );
    assert!(extra(dir.path(), &slots).is_empty());
}

/// The directory [`child_holding_a_pool_until_killed`] makes its pool in.
const CHILD_DIR: &str = "SMG_SHM_LANE_CHILD_DIR";

/// Run as a child process by `a_live_processs_names_survive_the_sweep_and_a_killed_ones_do_not`
/// (with `--ignored --exact`): makes a pool, publishes a tensor, says so,
/// and waits to be killed. Run on its own it fails.
#[test]
#[ignore = "helper run as a child process by a_live_processs_names_survive_the_sweep_and_a_killed_ones_do_not"]
fn child_holding_a_pool_until_killed() {
    let dir = std::env::var(CHILD_DIR).expect("run by the sweep test");
    let pool = pool(Path::new(&dir), 2, 4096, Duration::from_secs(60));
    let tensor = write_tensor(&pool, &[9; 64]);
    println!("published {}", tensor.name());
    // Wait for SIGKILL: nothing is ever sent on stdin, so this returns only
    // if the parent went away (its end of the pipe closed).
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    panic!("the parent went away without killing this child");
}

/// Another process (another instance, as a gateway in another PID
/// namespace would be) holds a pool: its owner lock keeps every name of it
/// through a sweep; once it is killed, the next sweep removes them all.
#[test]
fn a_live_processs_names_survive_the_sweep_and_a_killed_ones_do_not() {
    use std::io::BufRead;
    let dir = scratch_dir();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_holding_a_pool_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // libtest prints the test's name on the same line before its output.
    let published = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|line| line.contains("published smg-"));
    assert!(published.is_some(), "the child published a tensor");
    // Two private slot files, one public name and the owner file.
    let held = names(dir.path());
    assert_eq!(held.len(), 4, "{held:?}");
    assert!(
        held.iter().all(|name| !name.starts_with(&instance_stem())),
        "the child is another instance: {held:?}"
    );
    let summary = sweep_orphans(dir.path()).unwrap();
    assert_eq!((summary.removed, summary.kept), (0, 4), "{summary:?}");
    assert_eq!(names(dir.path()), held, "a live owner's names stay");
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    assert_eq!(names(dir.path()), held, "a killed process leaves its files");
    assert_eq!(sweep_orphans(dir.path()).unwrap().removed, 4);
    assert!(names(dir.path()).is_empty());
}
