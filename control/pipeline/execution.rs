//! Running a request's engine calls as one supervised unit.
//!
//! A request makes one Generate call (Regular), two in parallel (PD: prefill
//! and decode), or two plus one Encode per image (EPD). Their fates are
//! coupled: if any call fails to start, fails, or (for encodes) is refused,
//! every other call is aborted and the request fails at once, instead of
//! waiting for a rendezvous timeout. A client that goes away aborts every leg.
//! The response stream is decode's (or the single worker's) event stream.
//!
//! A lone leg (Regular mode: no prefill, no encodes) has nothing to run
//! beside it, so its stream applies the same rules itself as it is polled,
//! without a supervising task and channel per request.
//!
//! An Encode's answer may come after its request has finished: the encode
//! worker hands the embedding to prefill before it answers. Such an encode
//! is awaited in the background (within [`ENCODE_ANSWER_GRACE`], once the
//! request's load counts and leases are released), not cancelled: the encode
//! worker is not told to stop work it has done, and the Encode is timed
//! (`smg_router_encode_duration_seconds`) like every other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::engine::{Engine, EventStream, GenerateEvent, GenerateRequest, MediaItem};
use crate::error::{Error, ErrorCode, Result};
use crate::shutdown::RequestTasks;
use crate::workers::LoadGuard;
use smg_dataplane::lanes::TensorLease;

/// One Generate call to make.
#[derive(Debug)]
pub(crate) struct Leg {
    pub client: Arc<dyn Engine>,
    pub request: GenerateRequest,
}

/// One Encode call to make (EPD): a media item to an encode worker, which
/// publishes its embedding under `room` for prefill to fetch.
#[derive(Debug)]
pub(crate) struct EncodeCall {
    pub client: Arc<dyn Engine>,
    /// Set by DispatchMetadata: `<engine request id>-enc<item index>`.
    pub request_id: String,
    pub item: MediaItem,
    pub room: i64,
}

/// A side call whose success the request depends on (an Encode).
type SideCall = Pin<Box<dyn Future<Output = Result<()>> + Send + 'static>>;

/// Everything one attempt executes.
pub(crate) struct ExecutionPlan {
    /// The leg whose events are the response (regular or decode).
    pub primary: Leg,
    /// PD/EPD: the prefill leg, drained in parallel.
    pub prefill: Option<Leg>,
    /// EPD: encode calls that must all succeed.
    pub encodes: Vec<EncodeCall>,
    /// Held until the calls end: worker load counts.
    pub guards: Vec<LoadGuard>,
    /// Held until the calls end: the lane resources (shm slots) of the
    /// tensors these calls carry.
    pub leases: Vec<TensorLease>,
}

impl std::fmt::Debug for ExecutionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionPlan")
            .field("primary", &self.primary)
            .field("prefill", &self.prefill)
            .field("encodes", &self.encodes)
            .finish()
    }
}

impl ExecutionPlan {
    /// DispatchMetadata: names every call of the attempt after
    /// `engine_request_id` (the legs share it; encode calls add their item's
    /// index), so a worker's logs, aborts and the gateway's agree.
    pub(crate) fn stamp(&mut self, engine_request_id: &str) {
        self.primary.request.request_id = engine_request_id.to_owned();
        if let Some(prefill) = &mut self.prefill {
            prefill.request.request_id = engine_request_id.to_owned();
        }
        for (index, call) in self.encodes.iter_mut().enumerate() {
            call.request_id = format!("{engine_request_id}-enc{index}");
        }
    }
}

/// An Encode call as a supervised future: a refusal or a failure fails the
/// request, blaming the encode worker.
fn encode_call(call: EncodeCall) -> SideCall {
    Box::pin(async move {
        let EncodeCall {
            client,
            request_id,
            item,
            room,
        } = call;
        let started = std::time::Instant::now();
        let result = client.encode(&request_id, &item, room).await;
        crate::metrics::record_encode(started.elapsed());
        match result {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::new(
                ErrorCode::EncodeFailed,
                format!("encode worker {} refused the image", client.url()),
            )
            .with_worker(client.url())),
            Err(err) => Err(Error::new(
                ErrorCode::EncodeFailed,
                format!("encode worker {} failed: {}", client.url(), err.message),
            )
            .with_worker(client.url())
            .with_reach(err.reach)),
        }
    })
}

/// Aborts a leg on the worker unless disarmed (the leg finished on its own).
/// The abort runs on the request tasks, so a shutdown that drops the leg
/// waits for it to be sent.
struct AbortOnDrop {
    client: Arc<dyn Engine>,
    request_id: String,
    armed: bool,
    tasks: RequestTasks,
    /// The leg's event stream, once handed over: kept open until the abort
    /// is answered, so the worker gets the Abort while the request still
    /// runs instead of racing the stream's cancellation.
    stream: Option<EventStream>,
}

impl std::fmt::Debug for AbortOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortOnDrop")
            .field("request_id", &self.request_id)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

impl AbortOnDrop {
    fn new(leg: &Leg, tasks: &RequestTasks) -> Self {
        Self {
            client: Arc::clone(&leg.client),
            request_id: leg.request.request_id.clone(),
            armed: true,
            tasks: tasks.clone(),
            stream: None,
        }
    }

    /// Keeps the leg's `stream` open until the abort (if one is sent) is
    /// answered.
    fn hold(&mut self, stream: EventStream) {
        if self.armed {
            self.stream = Some(stream);
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let client = Arc::clone(&self.client);
        let request_id = std::mem::take(&mut self.request_id);
        let stream = self.stream.take();
        self.tasks.spawn_abort(async move {
            let _open_until_answered = stream;
            match client
                .abort(&request_id, "gateway cancelled the request")
                .await
            {
                Ok(_) => tracing::debug!(%request_id, worker = client.url(), "leg aborted"),
                Err(err) => {
                    tracing::debug!(%err, %request_id, worker = client.url(), "abort failed")
                }
            }
        });
    }
}

/// Starts every call of `plan` and returns the primary's events, supervised.
///
/// Returns an error without any stream when a leg fails to start; the other
/// legs are aborted first.
pub(crate) async fn execute(plan: ExecutionPlan, tasks: &RequestTasks) -> Result<EventStream> {
    let ExecutionPlan {
        primary,
        prefill,
        encodes,
        guards,
        leases,
    } = plan;
    let mut primary_abort = AbortOnDrop::new(&primary, tasks);
    let mut prefill_abort = prefill.as_ref().map(|leg| AbortOnDrop::new(leg, tasks));

    let primary_sequences = primary.request.sampling.n.max(1);
    let primary_url: Arc<str> = Arc::from(primary.client.url());
    let primary_start = primary.client.generate(primary.request);
    let (primary_stream, prefill_stream) = match prefill {
        Some(leg) => {
            let (a, b) = tokio::join!(primary_start, leg.client.generate(leg.request));
            (a, Some(b))
        }
        None => (primary_start.await, None),
    };
    // If either fails to start, the guards abort whatever did start.
    let primary_stream = primary_stream?;
    let prefill_stream = prefill_stream.transpose()?;
    if prefill_stream.is_none() && encodes.is_empty() {
        return Ok(Box::pin(LoneLeg {
            events: primary_stream,
            abort: Some(primary_abort),
            guards,
            sequences: primary_sequences,
            completes: 0,
            worker: primary_url,
        }));
    }

    let (sender, receiver) = mpsc::channel(32);
    tasks.spawn(async move {
        let mut side: FuturesUnordered<SideCall> = encodes.into_iter().map(encode_call).collect();
        let mut prefill_stream = prefill_stream;
        let mut primary_stream = primary_stream;
        let outcome = supervise(
            &mut primary_stream,
            &primary_url,
            &mut prefill_stream,
            &mut side,
            &sender,
        )
        .await;
        let finished = matches!(outcome, Supervised::Finished { .. });
        if let Supervised::Finished { prefill_done } = outcome {
            primary_abort.armed = false;
            if let Some(guard) = prefill_abort.as_mut() {
                guard.armed = !prefill_done;
            }
        }
        // Dropping the abort guards here aborts legs that did not finish.
        primary_abort.hold(primary_stream);
        if let (Some(guard), Some(stream)) = (prefill_abort.as_mut(), prefill_stream) {
            guard.hold(stream);
        }
        drop(primary_abort);
        drop(prefill_abort);
        drop(guards);
        drop(leases);
        if finished && !side.is_empty() {
            let answers = async { while side.next().await.is_some() {} };
            if tokio::time::timeout(ENCODE_ANSWER_GRACE, answers)
                .await
                .is_err()
            {
                tracing::debug!("an Encode did not answer after its request finished");
            }
        }
        // Unfinished: the encodes still running are cancelled here.
        drop(side);
    });
    Ok(Box::pin(ReceiverStream::new(receiver)))
}

/// The events of a leg that runs alone, under the supervisor's rules: an
/// error ends the stream, a stream that ends before any sequence completed
/// is `stream_interrupted`, and the leg is aborted on the worker unless it
/// finished (dropping this stream early aborts it). Consumers stop reading
/// once every sequence completed, so that counts as finished too.
struct LoneLeg {
    events: EventStream,
    /// `None` once the stream has ended (then it yields nothing more).
    abort: Option<AbortOnDrop>,
    guards: Vec<LoadGuard>,
    /// Sequences the leg generates (the request's `n`).
    sequences: u32,
    completes: u32,
    /// The leg's worker, blamed when its stream ends too early.
    worker: Arc<str>,
}

impl LoneLeg {
    /// Ends the stream: aborts the leg on the worker unless it finished
    /// (now or earlier), and releases the guards.
    fn end(&mut self, finished: bool) {
        if let Some(mut abort) = self.abort.take() {
            abort.armed &= !finished;
        }
        self.guards.clear();
    }
}

impl Drop for LoneLeg {
    /// Dropped before its end (the client went away, the shutdown cut it):
    /// the abort guard keeps the worker's stream open until the Abort is
    /// answered.
    fn drop(&mut self) {
        if let Some(mut abort) = self.abort.take() {
            let events = std::mem::replace(&mut self.events, Box::pin(futures::stream::empty()));
            abort.hold(events);
        }
    }
}

impl Stream for LoneLeg {
    type Item = Result<GenerateEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.abort.is_none() {
            return Poll::Ready(None);
        }
        let item = match ready!(this.events.poll_next_unpin(cx)) {
            Some(Ok(event)) => {
                if matches!(event, GenerateEvent::Complete { .. }) {
                    this.completes += 1;
                    if this.completes >= this.sequences
                        && let Some(abort) = this.abort.as_mut()
                    {
                        // The worker is done with the request: nothing to
                        // abort, and its load is given back now, not when
                        // the stream's trailers arrive.
                        abort.armed = false;
                        this.guards.clear();
                    }
                }
                return Poll::Ready(Some(Ok(event)));
            }
            Some(Err(err)) => Some(Err(err)),
            None if this.completes == 0 => Some(Err(ended_before_completion(&this.worker))),
            None => None,
        };
        this.end(item.is_none());
        Poll::Ready(item)
    }
}

enum Supervised {
    /// The primary stream ended cleanly.
    Finished { prefill_done: bool },
    /// A leg failed, or the client went away.
    Stopped,
}

/// The prompt's cached token count as the request's usage states it.
///
/// The prefix cache that saved work is the one of the worker that
/// prefilled: in PD and EPD that is the prefill leg, whose report (its
/// first event) is the request's `cached_tokens`; a decode worker fetched
/// the KV cache and may report 0. Until prefill has reported, decode's
/// events are held (a prefill answers when its forward pass is done, about
/// when decode can start, so this costs no time in practice, but the two
/// answers race over separate connections). They go out with decode's own
/// count if prefill ends without a report, or has not reported
/// [`PREFILL_REPORT_GRACE`] after decode's stream ended.
struct PrefillCached {
    /// Prefill's count, once it reported.
    reported: Option<u32>,
    /// Decode events waiting for it.
    held: Vec<GenerateEvent>,
    /// No report is coming (prefill ended, or decode is done): pass on.
    given_up: bool,
}

impl PrefillCached {
    fn new(has_prefill: bool) -> Self {
        Self {
            reported: None,
            held: Vec::new(),
            given_up: !has_prefill,
        }
    }

    /// Notes prefill's event; returns the held events, now ready to go.
    fn prefill_reported(&mut self, event: &GenerateEvent) -> Vec<GenerateEvent> {
        if self.reported.is_none() {
            let (GenerateEvent::Chunk { cached_tokens, .. }
            | GenerateEvent::Complete { cached_tokens, .. }) = event;
            self.reported = Some(*cached_tokens);
        }
        self.release()
    }

    /// Whether events pass straight on (prefill reported, or none comes).
    fn settled(&self) -> bool {
        self.reported.is_some() || self.given_up
    }

    /// Waits no more for prefill; returns the held events.
    fn give_up(&mut self) -> Vec<GenerateEvent> {
        self.given_up = true;
        self.release()
    }

    /// Takes a decode event; returns what may go out now.
    fn primary(&mut self, event: GenerateEvent) -> Vec<GenerateEvent> {
        self.held.push(event);
        if self.settled() {
            self.release()
        } else {
            Vec::new()
        }
    }

    fn release(&mut self) -> Vec<GenerateEvent> {
        let mut events = std::mem::take(&mut self.held);
        if let Some(reported) = self.reported {
            for event in &mut events {
                let (GenerateEvent::Chunk { cached_tokens, .. }
                | GenerateEvent::Complete { cached_tokens, .. }) = event;
                *cached_tokens = reported;
            }
        }
        events
    }
}

async fn supervise(
    primary: &mut EventStream,
    primary_url: &Arc<str>,
    prefill: &mut Option<EventStream>,
    side: &mut FuturesUnordered<SideCall>,
    sender: &mpsc::Sender<Result<GenerateEvent>>,
) -> Supervised {
    let mut prefill_done = prefill.is_none();
    let mut cached = PrefillCached::new(prefill.is_some());
    let mut primary_completes = 0usize;
    let send_all = async |events: Vec<GenerateEvent>| {
        for event in events {
            if sender.send(Ok(event)).await.is_err() {
                return false;
            }
        }
        true
    };
    loop {
        tokio::select! {
            biased;
            () = sender.closed() => return Supervised::Stopped,
            Some(result) = side.next(), if !side.is_empty() => {
                if let Err(err) = result {
                    let _ = sender.send(Err(err)).await;
                    return Supervised::Stopped;
                }
            }
            event = next_prefill(prefill), if !prefill_done => {
                let ready = match event {
                    Some(Ok(event)) => cached.prefill_reported(&event),
                    Some(Err(err)) => {
                        let _ = sender.send(Err(root_cause(err, side).await)).await;
                        return Supervised::Stopped;
                    }
                    None => {
                        prefill_done = true;
                        cached.give_up()
                    }
                };
                if !send_all(ready).await {
                    return Supervised::Stopped;
                }
            }
            event = primary.next() => match event {
                Some(Ok(event)) => {
                    if matches!(event, GenerateEvent::Complete { .. }) {
                        primary_completes += 1;
                    }
                    if !send_all(cached.primary(event)).await {
                        return Supervised::Stopped;
                    }
                }
                Some(Err(err)) => {
                    let _ = sender.send(Err(root_cause(err, side).await)).await;
                    return Supervised::Stopped;
                }
                None => {
                    if primary_completes == 0 {
                        let _ = sender.send(Err(ended_before_completion(primary_url))).await;
                        return Supervised::Stopped;
                    }
                    let mut prefill_done = prefill_done;
                    let mut ready = Vec::new();
                    if !cached.settled() && !prefill_done {
                        match prefill_report(prefill).await {
                            PrefillReport::Event(event) => {
                                ready = cached.prefill_reported(&event);
                            }
                            PrefillReport::Ended => prefill_done = true,
                            PrefillReport::Failed(err) => {
                                let _ = sender.send(Err(root_cause(err, side).await)).await;
                                return Supervised::Stopped;
                            }
                            PrefillReport::Late => {}
                        }
                    }
                    ready.extend(cached.give_up());
                    if !send_all(ready).await {
                        return Supervised::Stopped;
                    }
                    return Supervised::Finished { prefill_done };
                }
            },
        }
    }
}

fn ended_before_completion(worker: &Arc<str>) -> Error {
    Error::new(
        ErrorCode::StreamInterrupted,
        format!("worker {worker}: the stream ended before the request completed"),
    )
    .with_worker(Arc::clone(worker))
}

/// How long a finished request's encodes may take to answer (their
/// embeddings reached prefill already) before they are cancelled.
const ENCODE_ANSWER_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a failed leg waits for still-running encodes to report.
const ENCODE_BLAME_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// A leg failed while encodes were still running. A dead or refusing encode
/// worker breaks prefill's embedding rendezvous at once, so the leg's error
/// may merely echo the encode's: give the encodes a moment, and report an
/// encode failure as the cause when one arrives.
async fn root_cause(leg_error: Error, side: &mut FuturesUnordered<SideCall>) -> Error {
    if side.is_empty() {
        return leg_error;
    }
    let grace = tokio::time::sleep(ENCODE_BLAME_GRACE);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            () = &mut grace => return leg_error,
            next = side.next() => match next {
                Some(Err(encode_error)) => return encode_error,
                Some(Ok(())) => {}
                None => return leg_error,
            },
        }
    }
}

/// How long a finished decode waits for prefill's first report (its
/// cached token count) before the response goes out with decode's count.
const PREFILL_REPORT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

enum PrefillReport {
    Event(GenerateEvent),
    Ended,
    Failed(Error),
    Late,
}

/// Prefill's next event, waited for at most [`PREFILL_REPORT_GRACE`].
async fn prefill_report(prefill: &mut Option<EventStream>) -> PrefillReport {
    match tokio::time::timeout(PREFILL_REPORT_GRACE, next_prefill(prefill)).await {
        Ok(Some(Ok(event))) => PrefillReport::Event(event),
        Ok(Some(Err(err))) => PrefillReport::Failed(err),
        Ok(None) => PrefillReport::Ended,
        Err(_) => PrefillReport::Late,
    }
}

async fn next_prefill(prefill: &mut Option<EventStream>) -> Option<Result<GenerateEvent>> {
    match prefill {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engine::{EngineClient, Runtime};
    use crate::workers::{Worker, WorkerRole};

    /// A lone leg on a worker nothing listens for: the engine's events come
    /// from `events`.
    fn lone_leg(events: EventStream, guard: LoadGuard) -> LoneLeg {
        let client = EngineClient::new("grpc://127.0.0.1:9", Runtime::TokenSpeed).unwrap();
        LoneLeg {
            events,
            abort: Some(AbortOnDrop {
                client: Arc::new(client),
                request_id: "req-1".to_owned(),
                armed: true,
                tasks: RequestTasks::new(),
                stream: None,
            }),
            guards: vec![guard],
            sequences: 1,
            completes: 0,
            worker: Arc::from("grpc://127.0.0.1:9"),
        }
    }

    #[tokio::test]
    async fn a_lone_leg_gives_its_load_back_at_the_completion_not_the_streams_end() {
        let client = EngineClient::new("grpc://127.0.0.1:9", Runtime::TokenSpeed).unwrap();
        let worker = Arc::new(Worker::new(Arc::new(client), WorkerRole::Regular, None).unwrap());
        let (sender, receiver) = futures::channel::mpsc::unbounded();
        sender.unbounded_send(Ok(chunk(0))).unwrap();
        sender
            .unbounded_send(Ok(GenerateEvent::Complete {
                index: 0,
                output_ids: vec![7],
                finish_reason: "stop".into(),
                matched_stop: None,
                prompt_tokens: 40,
                completion_tokens: 1,
                cached_tokens: 0,
                logprobs: None,
            }))
            .unwrap();
        let mut leg = lone_leg(Box::pin(receiver), worker.acquire());
        assert_eq!(worker.in_flight(), 1);
        assert!(matches!(
            leg.next().await,
            Some(Ok(GenerateEvent::Chunk { .. }))
        ));
        assert_eq!(worker.in_flight(), 1, "held while generating");
        assert!(matches!(
            leg.next().await,
            Some(Ok(GenerateEvent::Complete { .. }))
        ));
        // The stream has not ended (its trailers are still to come).
        assert_eq!(worker.in_flight(), 0, "given back at the completion");
        drop(sender);
        assert!(leg.next().await.is_none());
        assert!(leg.abort.is_none(), "ended, nothing to abort");
    }

    fn chunk(cached_tokens: u32) -> GenerateEvent {
        GenerateEvent::Chunk {
            index: 0,
            token_ids: vec![7],
            prompt_tokens: 40,
            completion_tokens: 1,
            cached_tokens,
            logprobs: None,
        }
    }

    fn cached_of(events: &[GenerateEvent]) -> Vec<u32> {
        events
            .iter()
            .map(|event| match event {
                GenerateEvent::Chunk { cached_tokens, .. }
                | GenerateEvent::Complete { cached_tokens, .. } => *cached_tokens,
            })
            .collect()
    }

    #[test]
    fn decode_events_wait_for_prefill_and_carry_its_cached_count() {
        let mut cached = PrefillCached::new(true);
        assert!(cached.primary(chunk(0)).is_empty(), "held for prefill");
        assert!(cached.primary(chunk(0)).is_empty());
        assert_eq!(cached_of(&cached.prefill_reported(&chunk(32))), [32, 32]);
        assert_eq!(cached_of(&cached.primary(chunk(0))), [32]);
        // A later prefill event changes nothing.
        assert!(cached.prefill_reported(&chunk(5)).is_empty());
        assert_eq!(cached_of(&cached.primary(chunk(0))), [32]);
    }

    #[test]
    fn without_a_prefill_report_decode_keeps_its_own_count() {
        let mut cached = PrefillCached::new(true);
        assert!(cached.primary(chunk(3)).is_empty());
        assert_eq!(cached_of(&cached.give_up()), [3]);
        assert_eq!(cached_of(&cached.primary(chunk(3))), [3]);
        let mut regular = PrefillCached::new(false);
        assert_eq!(cached_of(&regular.primary(chunk(16))), [16], "no prefill");
    }

    #[test]
    fn a_stream_that_ends_early_blames_its_worker() {
        let url: Arc<str> = Arc::from("grpc://decode:1");
        let err = ended_before_completion(&url);
        assert_eq!(err.code, ErrorCode::StreamInterrupted);
        assert!(err.charges("grpc://decode:1"), "{err}");
        assert!(!err.charges("grpc://prefill:1"), "{err}");
    }
}
