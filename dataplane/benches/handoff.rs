//! Ring hand-off latency: how long a job takes to get to a data-plane core
//! and its result back, with nothing to do in between.
//!
//! Rows:
//! - `ring ping-pong`: our ring alone, between two spinning threads (one
//!   ring each way): the floor every hand-off stands on.
//! - `dataplane ping, back-to-back`: `DataPlane::ping` from a tokio task,
//!   one after another (the core is still spinning when the next arrives;
//!   the reactor on tokio sleeps on its doorbell between completions).
//! - `dataplane ping, 1 ms apart`: the core has gone to sleep each time, so
//!   both doorbells (eventfd) are on the path.
//!
//! Each data-plane row runs with io_uring and with the plain fallback loop.
//! With two or more cores the tokio thread is pinned to core 0 and the data
//! plane (or the ring's echo thread) to core 1.
//!
//! Run: `cargo bench -p smg-dataplane --bench handoff`. Not a test: nothing
//! here asserts a speed.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use core_affinity::CoreId;
use smg_dataplane::runtime::{DataPlane, DataPlaneConfig, IoBackend};
use smg_shared::ring;

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn report(name: &str, mut micros: Vec<f64>) {
    micros.sort_by(f64::total_cmp);
    println!(
        "| {name} | {} | {:.2} | {:.2} | {:.2} |",
        micros.len(),
        percentile(&micros, 0.5),
        percentile(&micros, 0.99),
        percentile(&micros, 0.999),
    );
}

fn ring_ping_pong(rounds: usize, echo_core: Option<CoreId>) -> Vec<f64> {
    let (to_echo, mut echo_in) = ring::bounded::<u64>(64);
    let (to_main, mut main_in) = ring::bounded::<u64>(64);
    let echo = std::thread::spawn(move || {
        if let Some(core) = echo_core {
            core_affinity::set_for_current(core);
        }
        let mut left = rounds;
        while left > 0 {
            if let Some(value) = echo_in.try_pop() {
                while to_main.try_push(value).is_err() {}
                left -= 1;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut micros = Vec::with_capacity(rounds);
    for round in 0..rounds as u64 {
        let start = Instant::now();
        to_echo.try_push(round).unwrap();
        loop {
            if main_in.try_pop().is_some() {
                break;
            }
            std::hint::spin_loop();
        }
        micros.push(start.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().unwrap();
    micros
}

fn dataplane_pings(io: IoBackend, pin: Vec<CoreId>, rounds: usize, gap: Duration) -> Vec<f64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let dataplane = DataPlane::start(DataPlaneConfig {
            io,
            pin,
            ..DataPlaneConfig::default()
        })
        .unwrap();
        for _ in 0..1000 {
            dataplane.ping().await.unwrap();
        }
        let mut micros = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            if !gap.is_zero() {
                // A blocking sleep: the data plane sees real idle time, the
                // timer's own wake-up is not measured.
                std::thread::sleep(gap);
            }
            let start = Instant::now();
            dataplane.ping().await.unwrap();
            micros.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let stopping = dataplane.clone();
        drop(dataplane);
        tokio::task::spawn_blocking(move || stopping.shutdown())
            .await
            .unwrap();
        micros
    })
}

fn main() {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let (main_core, far_core) = match cores.as_slice() {
        [first, second, ..] => (Some(*first), Some(*second)),
        _ => (None, None),
    };
    if let Some(core) = main_core {
        core_affinity::set_for_current(core);
    }
    println!(
        "\n{} cores; caller on {:?}, data plane / echo thread on {:?}\n",
        cores.len(),
        main_core.map(|c| c.id),
        far_core.map(|c| c.id)
    );
    println!("| hand-off | round trips | p50 µs | p99 µs | p99.9 µs |");
    println!("|---|---:|---:|---:|---:|");
    report(
        "ring ping-pong, two spinning threads",
        ring_ping_pong(200_000, far_core),
    );
    let pin: Vec<CoreId> = far_core.into_iter().collect();
    for (io, name) in [(IoBackend::Uring, "io_uring"), (IoBackend::Plain, "plain")] {
        report(
            &format!("dataplane ping, back-to-back ({name})"),
            dataplane_pings(io, pin.clone(), 20_000, Duration::ZERO),
        );
        report(
            &format!("dataplane ping, 1 ms apart ({name})"),
            dataplane_pings(io, pin.clone(), 2_000, Duration::from_millis(1)),
        );
    }
}
