//! Admission control: how much work the gateway takes on at once, who waits
//! for the rest, in what order, and who is refused.
//!
//! Why it exists: without it, a burst is forwarded whole to the engines (or
//! piles up in memory) and every request slows down together. With
//! `--max-concurrent-requests`, a request holds a [`Permit`] from before its
//! body is read until its response (a stream included) has ended; the
//! requests over the limit wait in one bounded queue, leave it by priority
//! class and then in arrival order, and are refused with a stable code and
//! `Retry-After` when the queue is full (`queue_full`, 429) or their wait
//! exceeds `--queue-timeout-secs` (`queue_timeout`, 408 as in SMG). A token
//! bucket (`--rate-limit-tokens-per-second`, per tenant when tenants exist)
//! bounds the request rate separately (`rate_limited`, 429).
//!
//! A permit is released exactly once, by `Drop`, and hands its slot
//! straight to the first waiter, so the count can neither leak nor be
//! overtaken by a newcomer while someone waits.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::{Error, ErrorCode, Result};

/// Who leaves the queue first: a lower class always before a higher one,
/// arrival order within a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Health probes and operators' own traffic.
    System,
    /// People waiting for an answer.
    Interactive,
    #[default]
    Default,
    /// Offline and batch work: served when nobody else waits.
    Bulk,
}

impl Priority {
    pub const ALL: [Priority; 4] = [
        Priority::System,
        Priority::Interactive,
        Priority::Default,
        Priority::Bulk,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Priority::System => "system",
            Priority::Interactive => "interactive",
            Priority::Default => "default",
            Priority::Bulk => "bulk",
        }
    }
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(name: &str) -> std::result::Result<Self, String> {
        Priority::ALL
            .into_iter()
            .find(|class| class.name() == name)
            .ok_or_else(|| {
                format!("unknown priority class {name:?} (system, interactive, default, bulk)")
            })
    }
}

/// A token bucket over requests: `per_second` refill, `burst` capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: f64,
}

/// The admission settings (SMG's `--max-concurrent-requests`,
/// `--queue-size`, `--queue-timeout-secs`, `--rate-limit-tokens-per-second`).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// Requests served at once; `None`: no limit (and no queue).
    pub max_concurrent: Option<usize>,
    /// Requests that may wait for a slot; 0 refuses at once when full.
    pub queue_size: usize,
    /// How long a request may wait for a slot.
    pub queue_timeout: Duration,
    /// The request rate per tenant (or in all when there are no tenants).
    pub rate: Option<RateLimit>,
    /// The priority class of each tenant; others are `Default`.
    pub tenant_priorities: HashMap<String, Priority>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            queue_size: 100,
            queue_timeout: Duration::from_secs(60),
            rate: None,
            tenant_priorities: HashMap::new(),
        }
    }
}

/// How long a client refused for a full queue should wait before trying
/// again: long enough for a slot to turn over, short enough to stay
/// interactive.
const FULL_QUEUE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The gateway's admission state; one per gateway, shared by every
/// inference route.
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    slots: Mutex<Slots>,
    buckets: Mutex<HashMap<Arc<str>, Bucket>>,
}

#[derive(Debug, Default)]
struct Slots {
    in_flight: usize,
    next_arrival: u64,
    /// Waiters by (class, arrival): the first entry leaves first.
    waiting: BTreeMap<(Priority, u64), oneshot::Sender<()>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    refilled_at: Instant,
}

/// A request's place among those being served. Dropping it (when the
/// response has ended, however it ends) frees the place for the next.
#[derive(Debug)]
#[must_use = "the request is admitted only while its permit lives"]
pub struct Permit {
    admission: Option<Arc<Admission>>,
}

impl Permit {
    /// Whether this permit counts against a limit (with no
    /// `--max-concurrent-requests` it holds nothing).
    pub fn limits(&self) -> bool {
        self.admission.is_some()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            admission.release(&mut admission.slots());
        }
    }
}

/// A request waiting in the queue. If the wait ends without the request
/// taking its slot (timeout, or the client went away), `Drop` leaves the
/// queue, or passes on a slot granted in the meantime.
struct Waiter {
    admission: Arc<Admission>,
    key: (Priority, u64),
    granted: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut slots = self.admission.slots();
        if slots.waiting.remove(&self.key).is_some() {
            crate::metrics::record_admission(slots.in_flight, slots.waiting.len());
            return;
        }
        // Popped: the slot was sent (under this lock) unless the send failed.
        if let Some(mut granted) = self.granted.take()
            && granted.try_recv().is_ok()
        {
            self.admission.release(&mut slots);
        }
    }
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            slots: Mutex::new(Slots::default()),
            buckets: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// The priority class of `tenant`.
    pub fn priority_of(&self, tenant: Option<&str>) -> Priority {
        tenant
            .and_then(|tenant| self.config.tenant_priorities.get(tenant))
            .copied()
            .unwrap_or_default()
    }

    /// Admits a request of `tenant`: at once, after a wait in the queue, or
    /// not at all (`rate_limited`, `queue_full`, `queue_timeout`).
    pub async fn admit(self: &Arc<Self>, tenant: Option<&str>) -> Result<Permit> {
        self.take_token(tenant)?;
        let Some(limit) = self.config.max_concurrent else {
            return Ok(Permit { admission: None });
        };
        let priority = self.priority_of(tenant);
        let (key, granted) = {
            let mut slots = self.slots();
            if slots.in_flight < limit && slots.waiting.is_empty() {
                slots.in_flight += 1;
                crate::metrics::record_admission(slots.in_flight, slots.waiting.len());
                return Ok(self.permit());
            }
            if slots.waiting.len() >= self.config.queue_size {
                crate::metrics::record_admission_refusal("queue_full", priority.name());
                return Err(Error::new(
                    ErrorCode::QueueFull,
                    format!(
                        "the gateway is serving {} requests (--max-concurrent-requests) and {} more \
                         are waiting (--queue-size); try again shortly",
                        slots.in_flight,
                        slots.waiting.len()
                    ),
                )
                .with_retry_after(FULL_QUEUE_RETRY_AFTER));
            }
            let key = (priority, slots.next_arrival);
            slots.next_arrival += 1;
            let (sender, granted) = oneshot::channel();
            slots.waiting.insert(key, sender);
            crate::metrics::record_admission(slots.in_flight, slots.waiting.len());
            (key, granted)
        };
        let queued = Instant::now();
        let mut waiter = Waiter {
            admission: Arc::clone(self),
            key,
            granted: Some(granted),
        };
        let wait = async {
            match waiter.granted.as_mut() {
                Some(granted) => granted.await.is_ok(),
                None => false,
            }
        };
        let admitted = tokio::time::timeout(self.config.queue_timeout, wait).await;
        crate::metrics::record_admission_wait(queued.elapsed(), priority.name());
        match admitted {
            Ok(true) => {
                // The slot is ours now: the waiter has nothing to give back.
                waiter.granted = None;
                Ok(self.permit())
            }
            _ => {
                crate::metrics::record_admission_refusal("queue_timeout", priority.name());
                Err(Error::new(
                    ErrorCode::QueueTimeout,
                    format!(
                        "the request waited {:.0?} for a free slot (--queue-timeout-secs)",
                        self.config.queue_timeout
                    ),
                )
                .with_retry_after(FULL_QUEUE_RETRY_AFTER))
            }
        }
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.slots().in_flight
    }

    /// Requests waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.slots().waiting.len()
    }

    fn permit(self: &Arc<Self>) -> Permit {
        Permit {
            admission: Some(Arc::clone(self)),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Frees one slot: to the first waiter still waiting, else to the pool.
    fn release(&self, slots: &mut Slots) {
        while let Some((_, sender)) = slots.waiting.pop_first() {
            if sender.send(()).is_ok() {
                crate::metrics::record_admission(slots.in_flight, slots.waiting.len());
                return;
            }
        }
        slots.in_flight = slots.in_flight.saturating_sub(1);
        crate::metrics::record_admission(slots.in_flight, slots.waiting.len());
    }

    /// Takes one token from the tenant's bucket, or refuses with the time
    /// until the next token.
    fn take_token(&self, tenant: Option<&str>) -> Result<()> {
        let Some(rate) = self.config.rate else {
            return Ok(());
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let key = tenant.unwrap_or_default();
        let bucket = match buckets.get_mut(key) {
            Some(bucket) => bucket,
            None => buckets.entry(Arc::from(key)).or_insert(Bucket {
                tokens: rate.burst,
                refilled_at: now,
            }),
        };
        let elapsed = now.saturating_duration_since(bucket.refilled_at);
        bucket.tokens = (bucket.tokens + elapsed.as_secs_f64() * rate.per_second).min(rate.burst);
        bucket.refilled_at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = Duration::from_secs_f64((1.0 - bucket.tokens) / rate.per_second);
        crate::metrics::record_admission_refusal("rate_limited", self.priority_of(tenant).name());
        Err(Error::new(
            ErrorCode::RateLimited,
            format!(
                "over the request rate of {} per second{} (--rate-limit-tokens-per-second)",
                rate.per_second,
                if tenant.is_some() {
                    " for this tenant"
                } else {
                    ""
                }
            ),
        )
        .with_retry_after(wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(max: usize, queue: usize) -> Arc<Admission> {
        Admission::new(AdmissionConfig {
            max_concurrent: Some(max),
            queue_size: queue,
            queue_timeout: Duration::from_secs(10),
            tenant_priorities: HashMap::from([
                ("ops".to_owned(), Priority::System),
                ("batch".to_owned(), Priority::Bulk),
            ]),
            ..Default::default()
        })
    }

    /// Starts `admit` for `tenant` and waits until it is queued.
    async fn queue(
        admission: &Arc<Admission>,
        tenant: Option<&'static str>,
    ) -> tokio::task::JoinHandle<Result<Permit>> {
        let before = admission.waiting();
        let task = tokio::spawn({
            let admission = Arc::clone(admission);
            async move { admission.admit(tenant).await }
        });
        while admission.waiting() == before {
            tokio::task::yield_now().await;
        }
        task
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_admits_everyone_at_once() {
        let admission = Admission::new(AdmissionConfig::default());
        let permits: Vec<Permit> =
            futures::future::try_join_all((0..1000).map(|_| admission.admit(None)))
                .await
                .expect("all admitted");
        assert_eq!(permits.len(), 1000);
        assert_eq!(admission.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn excess_waits_and_leaves_by_class_then_arrival() {
        let admission = limited(1, 10);
        let first = admission.admit(None).await.expect("a free slot");
        let bulk = queue(&admission, Some("batch")).await;
        let default_a = queue(&admission, None).await;
        let default_b = queue(&admission, Some("someone")).await;
        let system = queue(&admission, Some("ops")).await;
        assert_eq!((admission.in_flight(), admission.waiting()), (1, 4));

        let mut order = Vec::new();
        let mut held = first;
        for (name, task) in [
            ("system", system),
            ("default_a", default_a),
            ("default_b", default_b),
            ("bulk", bulk),
        ] {
            drop(held);
            held = task.await.expect("joined").expect("admitted in turn");
            order.push(name);
            assert_eq!(admission.in_flight(), 1, "the slot passed straight on");
        }
        assert_eq!(order, ["system", "default_a", "default_b", "bulk"]);
        drop(held);
        assert_eq!((admission.in_flight(), admission.waiting()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_with_retry_after() {
        let admission = limited(1, 1);
        let _serving = admission.admit(None).await.expect("a free slot");
        let _waiting = queue(&admission, None).await;
        let err = admission.admit(None).await.expect_err("queue full");
        assert_eq!(err.code, ErrorCode::QueueFull);
        assert_eq!(err.code.http_status(), 429);
        assert_eq!(err.retry_after, Some(FULL_QUEUE_RETRY_AFTER));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_timeout_is_refused_and_leaves_the_queue() {
        let admission = limited(1, 4);
        let serving = admission.admit(None).await.expect("a free slot");
        let started = Instant::now();
        let err = admission.admit(None).await.expect_err("timed out");
        assert_eq!(err.code, ErrorCode::QueueTimeout);
        assert_eq!(err.code.http_status(), 408);
        assert!(err.retry_after.is_some());
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(admission.waiting(), 0, "the timed-out request left");
        drop(serving);
        assert_eq!(admission.in_flight(), 0, "nothing leaked");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_leaves_the_queue_takes_no_slot_with_it() {
        let admission = limited(1, 4);
        let serving = admission.admit(None).await.expect("a free slot");
        let gone = queue(&admission, None).await;
        let stays = queue(&admission, None).await;
        gone.abort();
        assert!(gone.await.is_err(), "cancelled");
        assert_eq!(admission.waiting(), 1);
        drop(serving);
        let permit = stays.await.expect("joined").expect("admitted");
        assert_eq!(admission.in_flight(), 1);
        drop(permit);
        assert_eq!(admission.in_flight(), 0);
    }

    #[test]
    fn a_slot_granted_to_a_waiter_that_then_leaves_is_passed_on() {
        let admission = limited(1, 4);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let serving = admission.admit(None).await.expect("a free slot");
            // Queue one waiter by hand and grant it without it ever
            // receiving: the race between a release and a timeout.
            let (sender, granted) = oneshot::channel();
            let key = (Priority::Default, 999);
            admission.slots().waiting.insert(key, sender);
            let waiter = Waiter {
                admission: Arc::clone(&admission),
                key,
                granted: Some(granted),
            };
            let next = queue(&admission, None).await;
            drop(serving); // grants the hand-made waiter
            assert_eq!(admission.in_flight(), 1);
            drop(waiter); // which leaves: its slot goes to `next`
            let permit = next.await.expect("joined").expect("admitted");
            assert_eq!(admission.in_flight(), 1);
            drop(permit);
            assert_eq!((admission.in_flight(), admission.waiting()), (0, 0));
        });
    }

    #[tokio::test(start_paused = true)]
    async fn the_token_bucket_refills_at_its_rate_per_tenant() {
        let admission = Admission::new(AdmissionConfig {
            rate: Some(RateLimit {
                per_second: 2.0,
                burst: 2.0,
            }),
            ..Default::default()
        });
        let _a = admission.admit(Some("a")).await.expect("burst 1");
        let _b = admission.admit(Some("a")).await.expect("burst 2");
        let err = admission.admit(Some("a")).await.expect_err("bucket empty");
        assert_eq!(err.code, ErrorCode::RateLimited);
        assert_eq!(err.code.http_status(), 429);
        assert_eq!(err.retry_after, Some(Duration::from_millis(500)));
        let _other = admission
            .admit(Some("b"))
            .await
            .expect("another tenant has its own bucket");
        tokio::time::advance(Duration::from_millis(500)).await;
        let _c = admission
            .admit(Some("a"))
            .await
            .expect("one token refilled");
        assert!(admission.admit(Some("a")).await.is_err(), "and only one");
    }
}
