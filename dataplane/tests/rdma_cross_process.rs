//! The RDMA lane's loopback backend across a process boundary: this test
//! publishes tensors and runs its own binary again as the reader (the
//! ignored `reader_child` test), which reads them by descriptor with the same
//! `LoopbackReader` a worker uses and reports a digest of what it got.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use smg_dataplane::lanes::rdma::{LoopbackReader, RdmaArena, RdmaConfig};

const DESCRIPTORS: &str = "SMG_RDMA_CHILD_DESCRIPTORS";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Runs this binary's `reader_child` with `descriptors` (`hex:nbytes`,
/// comma-separated) and returns one line per descriptor: a blake3 hex
/// digest of the bytes read, or `error <code>`.
fn read_in_child(descriptors: &[(Vec<u8>, u64)]) -> Vec<String> {
    let arg: Vec<String> = descriptors
        .iter()
        .map(|(descriptor, nbytes)| format!("{}:{nbytes}", hex(descriptor)))
        .collect();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "reader_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DESCRIPTORS, arg.join(","))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        // The harness prints "test reader_child ... " before the first line.
        .filter_map(|line| line.split_once("read: ").map(|(_, read)| read.to_owned()))
        .collect()
}

#[test]
#[ignore = "the reader process of another_process_reads_the_exact_bytes"]
fn reader_child() {
    let reader = LoopbackReader::new(smg_shared::shm::SHM_DIR);
    for item in std::env::var(DESCRIPTORS).unwrap().split(',') {
        let (descriptor, nbytes) = item.split_once(':').unwrap();
        match reader.read(&unhex(descriptor), nbytes.parse().unwrap()) {
            Ok(bytes) => println!("read: {}", blake3::hash(&bytes).to_hex()),
            Err(err) => println!("read: error {}", err.code()),
        }
    }
}

#[test]
fn another_process_reads_the_exact_bytes_and_sees_released_slots_stale() {
    let arena = RdmaArena::loopback(&RdmaConfig {
        slot_bytes: 4 << 20,
        slots: 3,
        ..RdmaConfig::default()
    })
    .unwrap();
    let tensors: Vec<Vec<u8>> = (0..3u8)
        .map(|seed| {
            (0..(3 << 20) + usize::from(seed))
                .map(|i| (i as u8) ^ seed.wrapping_mul(77))
                .collect()
        })
        .collect();
    let mut guards: Vec<_> = tensors
        .iter()
        .map(|bytes| {
            let mut writer = arena.reserve(bytes.len()).unwrap();
            writer.buffer().copy_from_slice(bytes);
            writer.publish(Duration::from_secs(60))
        })
        .collect();
    let handles: Vec<(Vec<u8>, u64)> = guards
        .iter()
        .map(|tensor| (tensor.descriptor().to_vec(), tensor.nbytes()))
        .collect();
    let digests: Vec<String> = tensors
        .iter()
        .map(|bytes| blake3::hash(bytes).to_hex().to_string())
        .collect();
    assert_eq!(read_in_child(&handles), digests);

    // The first tensor's RPC returned: its descriptor is stale for any
    // process; the others still read.
    drop(guards.remove(0));
    let lines = read_in_child(&handles);
    assert_eq!(lines[0], "error rdma_stale_descriptor");
    assert_eq!(&lines[1..], &digests[1..]);
    drop(guards);
    assert_eq!(arena.occupancy().slots_in_use, 0);
}
