//! Periodic gRPC HealthCheck probes that mark workers healthy or not.
//!
//! A worker turns unhealthy after `failure_threshold` failed probes in a row
//! and healthy again after `success_threshold` good ones. Policies only see
//! healthy workers. (The full state machine and circuit breaker come with the
//! worker-lifecycle work.)

use std::sync::Arc;
use std::time::Duration;

use super::Worker;

/// Probe settings (SMG's `--health-check-*` flags).
#[derive(Debug, Clone, Copy)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

/// Starts one probe loop per worker; they stop when the runtime does.
pub fn spawn_health_checks(workers: Vec<Arc<Worker>>, config: HealthConfig) {
    for worker in workers {
        tokio::spawn(probe_loop(worker, config));
    }
}

async fn probe_loop(worker: Arc<Worker>, config: HealthConfig) {
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut failures, mut successes) = (0u32, 0u32);
    loop {
        ticker.tick().await;
        let healthy = matches!(
            tokio::time::timeout(config.timeout, worker.client().health_check()).await,
            Ok(Ok(true))
        );
        if healthy {
            failures = 0;
            successes = successes.saturating_add(1);
            if !worker.is_healthy() && successes >= config.success_threshold {
                tracing::info!(worker = worker.url(), "worker healthy again");
                worker.set_healthy(true);
            }
        } else {
            successes = 0;
            failures = failures.saturating_add(1);
            if worker.is_healthy() && failures >= config.failure_threshold {
                tracing::warn!(worker = worker.url(), failures, "worker marked unhealthy");
                worker.set_healthy(false);
            }
        }
    }
}
