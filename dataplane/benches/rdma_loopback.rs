//! RDMA lane (loopback backend) bandwidth against a plain memcpy, measured
//! in the same run.
//!
//! For each tensor size: a heap-to-heap memcpy into a warm buffer (the
//! ceiling); the gateway side alone (reserve a slot, write the tensor,
//! publish the descriptor, drop the guard); and the round trip a worker
//! adds, the emulated one-sided READ (stamp, copy out of the read-only
//! arena mapping into a warm buffer, stamp). Each figure is the median of
//! several rounds, in GB/s of tensor bytes, with its ratio to memcpy.
//!
//! Run: `cargo bench -p smg-dataplane --bench rdma_loopback`. Not a test.

use std::path::Path;
use std::time::Duration;

use smg_dataplane::lanes::rdma::{Descriptor, LoopbackReader, RdmaArena, RdmaConfig};

mod common;

use common::measure;

fn main() {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() { shm } else { Path::new("/tmp") };
    let reader = LoopbackReader::new(dir);
    println!(
        "\n{:>10} {:>12} {:>14} {:>7} {:>20} {:>7}",
        "tensor", "memcpy GB/s", "publish GB/s", "ratio", "publish+read GB/s", "ratio"
    );
    for mib in [1usize, 4, 16, 64] {
        let bytes = mib << 20;
        let source: Vec<u8> = (0..bytes).map(|i| (i * 31) as u8).collect();
        let mut heap = vec![0u8; bytes];
        let mut landing = vec![0u8; bytes];
        let iterations = (256 / mib).max(2);

        let memcpy = measure(iterations, || {
            heap.copy_from_slice(&source);
            std::hint::black_box(&heap);
        });

        let arena = RdmaArena::loopback(&RdmaConfig {
            slot_bytes: bytes,
            slots: 2,
            loopback_dir: dir.to_path_buf(),
        })
        .expect("arena");
        let publish = measure(iterations, || {
            let mut writer = arena.reserve(bytes).expect("reserve");
            writer.buffer().copy_from_slice(&source);
            let tensor = writer.publish(Duration::from_secs(60));
            std::hint::black_box(tensor.descriptor());
        });

        let round_trip = measure(iterations, || {
            let mut writer = arena.reserve(bytes).expect("reserve");
            writer.buffer().copy_from_slice(&source);
            let tensor = writer.publish(Duration::from_secs(60));
            let descriptor = Descriptor::decode(tensor.descriptor()).expect("descriptor");
            reader
                .read_into(&descriptor, &mut landing)
                .expect("loopback read");
            std::hint::black_box(&landing);
        });
        assert!(landing == source, "the read returned other bytes");

        let gbps = |secs: f64| bytes as f64 / secs / 1e9;
        println!(
            "{:>7} MiB {:>12.2} {:>14.2} {:>7.2} {:>20.2} {:>7.2}",
            mib,
            gbps(memcpy),
            gbps(publish),
            memcpy / publish,
            gbps(round_trip),
            memcpy / round_trip
        );
    }
}
