//! Timing helpers the data plane's scripted benchmarks share.

use std::time::Instant;

/// Rounds per measurement; the median is reported.
const ROUNDS: usize = 7;

/// Seconds per operation, median over `ROUNDS` rounds of `iterations` each
/// (after one untimed warm-up call).
pub fn measure(iterations: usize, mut op: impl FnMut()) -> f64 {
    op();
    let mut samples: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..iterations {
                op();
            }
            started.elapsed().as_secs_f64() / iterations as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
