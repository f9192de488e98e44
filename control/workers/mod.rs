//! The engine workers a router can send to: their role, client, in-flight
//! load and health.
//!
//! A request that picks a worker holds a [`LoadGuard`] for as long as it uses
//! it; the guard's `Drop` gives the slot back, so a cancelled or failed
//! request can never leak a load count.

mod health;

pub use health::{HealthConfig, spawn_health_checks};

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::engine::EngineClient;
use crate::error::{Error, ErrorCode, Result};

/// A worker's part in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkerRole {
    Regular,
    Prefill,
    Decode,
    Encode,
}

impl WorkerRole {
    pub const fn name(self) -> &'static str {
        match self {
            WorkerRole::Regular => "regular",
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
            WorkerRole::Encode => "encode",
        }
    }
}

impl fmt::Display for WorkerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One engine worker.
#[derive(Debug)]
pub struct Worker {
    url: String,
    role: WorkerRole,
    /// Host of the worker's rendezvous (bootstrap) server: the worker's host.
    bootstrap_host: String,
    bootstrap_port: Option<u16>,
    client: EngineClient,
    in_flight: AtomicUsize,
    healthy: AtomicBool,
}

impl Worker {
    pub fn new(
        client: EngineClient,
        role: WorkerRole,
        bootstrap_port: Option<u16>,
    ) -> Result<Self> {
        let url = client.url().to_owned();
        let bootstrap_host = host_of(&url).ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("worker URL {url:?} has no host"),
            )
        })?;
        Ok(Self {
            url,
            role,
            bootstrap_host,
            bootstrap_port,
            client,
            in_flight: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn role(&self) -> WorkerRole {
        self.role
    }

    pub fn client(&self) -> &EngineClient {
        &self.client
    }

    pub fn bootstrap_host(&self) -> &str {
        &self.bootstrap_host
    }

    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap_port
    }

    /// Requests currently holding this worker.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Counts a request against this worker until the guard drops.
    pub fn acquire(self: &Arc<Self>) -> LoadGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        LoadGuard {
            worker: Arc::clone(self),
        }
    }
}

/// The host part of a worker URL (`grpc://host:port`, `http://host:port`,
/// `host:port`, IPv6 in brackets).
fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let host = if let Some(bracketed) = authority.strip_prefix('[') {
        bracketed.split(']').next()?
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host)
    };
    (!host.is_empty()).then(|| host.to_owned())
}

/// One request's hold on a worker; gives the load back on drop.
#[derive(Debug)]
pub struct LoadGuard {
    worker: Arc<Worker>,
}

impl LoadGuard {
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.worker.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The workers of one router, by role.
#[derive(Debug, Default, Clone)]
pub struct WorkerSet {
    by_role: HashMap<WorkerRole, Vec<Arc<Worker>>>,
}

impl WorkerSet {
    pub fn add(&mut self, worker: Worker) {
        self.by_role
            .entry(worker.role)
            .or_default()
            .push(Arc::new(worker));
    }

    /// Every worker of `role`, healthy or not.
    pub fn of_role(&self, role: WorkerRole) -> &[Arc<Worker>] {
        self.by_role.get(&role).map_or(&[], Vec::as_slice)
    }

    /// The healthy workers of `role`.
    pub fn healthy(&self, role: WorkerRole) -> Vec<Arc<Worker>> {
        self.of_role(role)
            .iter()
            .filter(|w| w.is_healthy())
            .cloned()
            .collect()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.by_role.values().flatten()
    }

    pub fn roles(&self) -> Vec<WorkerRole> {
        let mut roles: Vec<WorkerRole> = self.by_role.keys().copied().collect();
        roles.sort();
        roles
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Runtime;

    #[test]
    fn hosts_are_parsed_from_worker_urls() {
        for (url, host) in [
            ("grpc://127.0.0.1:50051", "127.0.0.1"),
            ("http://gpu-7.example:30000", "gpu-7.example"),
            ("10.0.0.2:1234", "10.0.0.2"),
            ("grpc://[::1]:50051", "::1"),
        ] {
            assert_eq!(host_of(url).as_deref(), Some(host), "{url}");
        }
        assert_eq!(host_of("grpc://:50051"), None);
    }

    #[test]
    fn load_guards_count_exactly_once() {
        let worker = crate::policies::test_support::workers(1).remove(0);
        let a = worker.acquire();
        let b = worker.acquire();
        assert_eq!(worker.in_flight(), 2);
        drop(a);
        assert_eq!(worker.in_flight(), 1);
        drop(b);
        assert_eq!(worker.in_flight(), 0);
    }

    #[test]
    fn unhealthy_workers_are_not_offered() {
        let mut set = WorkerSet::default();
        let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
        let _entered = runtime.enter();
        let client = EngineClient::new("grpc://127.0.0.1:1", Runtime::TokenSpeed).expect("client");
        set.add(Worker::new(client, WorkerRole::Decode, None).expect("worker"));
        assert_eq!(set.healthy(WorkerRole::Decode).len(), 1);
        set.of_role(WorkerRole::Decode)[0].set_healthy(false);
        assert!(set.healthy(WorkerRole::Decode).is_empty());
        assert!(set.healthy(WorkerRole::Prefill).is_empty());
    }
}
