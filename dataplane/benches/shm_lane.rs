//! shm lane bandwidth against a plain memcpy, measured in the same run.
//!
//! For each tensor size: a heap-to-heap memcpy into a warm buffer (the
//! ceiling); the lane's gateway side (acquire a pre-faulted slot, write the
//! tensor, publish a fresh name, the reader unlinks it, the guard drops);
//! and the naive lane, a fresh tmpfs file per tensor (create, size, map,
//! write, unmap, unlink). Each figure is the median of several rounds, in
//! GB/s of tensor bytes, with its ratio to memcpy.
//!
//! Run: `cargo bench -p smg-dataplane --bench shm_lane`. Not a test.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use smg_dataplane::lanes::shm::{ShmPool, ShmPoolConfig};

mod common;

use common::measure;

fn fresh_file_per_tensor(dir: &Path, source: &[u8], sequence: &mut u64) {
    *sequence += 1;
    let path = dir.join(format!("bench-fresh-{}-{sequence}", std::process::id()));
    let mut file = std::fs::File::create(&path).expect("create");
    // The straightforward way: size the file and write the bytes (the
    // kernel allocates and zeroes each page on first touch).
    file.write_all(source).expect("write");
    drop(file);
    std::fs::remove_file(&path).expect("unlink");
}

fn main() {
    let shm = Path::new("/dev/shm");
    let dir = tempfile::tempdir_in(if shm.is_dir() { shm } else { Path::new("/tmp") })
        .expect("scratch dir");
    println!(
        "\n{:>10} {:>14} {:>14} {:>8} {:>16} {:>8}",
        "tensor", "memcpy GB/s", "shm slot GB/s", "ratio", "fresh file GB/s", "ratio"
    );
    for mib in [1usize, 4, 16, 64] {
        let bytes = mib << 20;
        let source: Vec<u8> = (0..bytes).map(|i| (i * 31) as u8).collect();
        let mut heap = vec![0u8; bytes];
        let iterations = (256 / mib).max(2);

        let memcpy = measure(iterations, || {
            heap.copy_from_slice(&source);
            std::hint::black_box(&heap);
        });

        let pool = ShmPool::create(ShmPoolConfig {
            dir: dir.path().to_path_buf(),
            slot_bytes: bytes,
            slots: 2,
            reclaim_after: Duration::from_secs(60),
            keep_free_bytes: 0,
        })
        .expect("pool");
        let slot = measure(iterations, || {
            let mut writer = pool.acquire(bytes).expect("acquire");
            writer.buffer().copy_from_slice(&source);
            let tensor = writer.publish().expect("publish");
            // The worker's unlink after reading (its read is its own cost).
            std::fs::remove_file(dir.path().join(tensor.name())).expect("unlink");
        });

        let mut sequence = 0;
        let fresh = measure(iterations, || {
            fresh_file_per_tensor(dir.path(), &source, &mut sequence)
        });

        let gbps = |secs: f64| bytes as f64 / secs / 1e9;
        println!(
            "{:>7} MiB {:>14.2} {:>14.2} {:>8.2} {:>16.2} {:>8.2}",
            mib,
            gbps(memcpy),
            gbps(slot),
            memcpy / slot,
            gbps(fresh),
            memcpy / fresh
        );
    }
}
