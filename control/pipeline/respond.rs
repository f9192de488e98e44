//! ResponseProcessing: engine token events become client text.
//!
//! Per sequence, an incremental decoder turns ids into text without ever
//! splitting a UTF-8 character, and a stop matcher trims stop strings the
//! engines cannot see. The result is a dialect-neutral stream of
//! [`OutputEvent`]s that each API formats its own way (OpenAI chunks,
//! SGLang's `/generate`, Anthropic events), or collects for a JSON answer.
//! When every sequence has ended, the engine stream is let go: read to its
//! end when the engine completed every sequence, dropped (which aborts the
//! legs) when a stop string ended one the engine was still generating.
//! Chat requests may also have their text split into reasoning, answer and
//! tool calls here (see [`super::parsing`]).

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

use super::parsing::{OutputParsing, ParsedText, SequenceParser, ToolCallDelta};
use crate::engine::{EventStream, GenerateEvent, LogProbs, MatchedStop};
use crate::error::{Error, ErrorCode, Result};
use crate::tokenizer::{IncrementalDecoder, StopMatcher, Tokenizer};

/// Why a sequence ended, as the APIs report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    /// Stopped normally after making tool calls.
    ToolCalls,
}

impl FinishReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }

    fn from_engine(reason: &str) -> Self {
        match reason {
            "length" => FinishReason::Length,
            "abort" => FinishReason::Abort,
            _ => FinishReason::Stop,
        }
    }
}

/// Token accounting of a whole request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

/// What the client is told, dialect-neutral.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputEvent {
    /// The engine's first report, before any text: its prompt and cached
    /// token counts (`completion_tokens` is 0). Dialects that state the
    /// prompt's size up front (Anthropic's `message_start`, every chunk of
    /// `/generate`) wait for it rather than guess.
    Started(Usage),
    /// New output of sequence `index`: answer text, and when the request's
    /// output is parsed, reasoning and tool-call fragments.
    Delta {
        index: u32,
        text: String,
        reasoning: String,
        tool_calls: Vec<ToolCallDelta>,
        token_ids: Vec<u32>,
        logprobs: Option<LogProbs>,
    },
    /// Sequence `index` ended.
    Finish {
        index: u32,
        reason: FinishReason,
        matched_stop: Option<MatchedStop>,
        /// The sequence ran out of tokens while writing the call with this
        /// index: it is no call (its text came as content). A collector
        /// drops what it gathered of it; a stream has sent it already.
        cut_call: Option<usize>,
    },
    /// Every sequence ended; the last event.
    Usage(Usage),
}

pub(crate) type OutputStream = Pin<Box<dyn Stream<Item = Result<OutputEvent>> + Send + 'static>>;

/// How to turn one request's events into text.
#[derive(Debug, Clone)]
pub(crate) struct ResponseOptions {
    pub tokenizer: Tokenizer,
    pub n: u32,
    pub skip_special_tokens: bool,
    pub stop_strings: Vec<String>,
    pub no_stop_trim: bool,
    /// When the request must be done (tokio's clock, so tests can pause it).
    pub deadline: tokio::time::Instant,
    /// Split the text into reasoning, answer and calls. Markers may be
    /// special tokens, so the text is then decoded with special tokens kept,
    /// except `stop_token_ids` (the end-of-sequence tokens among them).
    pub parsing: Option<OutputParsing>,
    /// Tokens never shown when special tokens are kept for parsing.
    pub stop_token_ids: Vec<u32>,
}

struct Sequence {
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    parser: Option<SequenceParser>,
    tokens_seen: u32,
    finished: bool,
    /// Whether its completion count is in the request's usage (its engine
    /// completion arrived); a sequence a stop string ended is counted by
    /// the tokens it produced when the stream is dropped.
    counted: bool,
}

struct Processor {
    events: Option<EventStream>,
    sequences: Vec<Sequence>,
    /// Ids left out of the text (see [`ResponseOptions::stop_token_ids`]).
    hidden_ids: Vec<u32>,
    pending: std::collections::VecDeque<OutputEvent>,
    usage: Usage,
    /// Whether [`OutputEvent::Started`] went out.
    started: bool,
    deadline: tokio::time::Instant,
    done: bool,
}

impl Processor {
    /// Records the engine's prompt and cached counts; the first report
    /// also goes out as [`OutputEvent::Started`], ahead of any text.
    fn note_prompt(&mut self, prompt_tokens: u32, cached_tokens: u32) {
        self.usage.prompt_tokens = prompt_tokens;
        self.usage.cached_tokens = cached_tokens;
        if !std::mem::replace(&mut self.started, true) {
            self.pending.push_back(OutputEvent::Started(Usage {
                prompt_tokens,
                completion_tokens: 0,
                cached_tokens,
            }));
        }
    }

    fn sequence(&mut self, index: u32) -> Result<&mut Sequence> {
        let count = self.sequences.len();
        self.sequences.get_mut(index as usize).ok_or_else(|| {
            Error::new(
                ErrorCode::WorkerError,
                format!("the worker sent sequence {index} of {count}"),
            )
        })
    }

    /// Decodes `ids` of sequence `index` and queues the released text.
    fn push_tokens(&mut self, index: u32, ids: &[u32], logprobs: Option<LogProbs>) -> Result<()> {
        let shown: std::borrow::Cow<'_, [u32]> = if self.hidden_ids.is_empty() {
            ids.into()
        } else {
            ids.iter()
                .copied()
                .filter(|id| !self.hidden_ids.contains(id))
                .collect::<Vec<_>>()
                .into()
        };
        let sequence = self.sequence(index)?;
        if sequence.finished {
            return Ok(());
        }
        sequence.tokens_seen += ids.len() as u32;
        let text = sequence.decoder.push(&shown)?;
        let outcome = sequence.stops.push(&text);
        if let Some(stop) = outcome.matched_stop {
            self.queue_delta(index, outcome.text, ids.to_vec(), logprobs)?;
            self.finish_sequence(index, FinishReason::Stop, Some(MatchedStop::Text(stop)))?;
        } else {
            self.queue_delta(index, outcome.text, ids.to_vec(), logprobs)?;
        }
        Ok(())
    }

    /// Queues new text of sequence `index`, through its parser if it has one.
    fn queue_delta(
        &mut self,
        index: u32,
        text: String,
        token_ids: Vec<u32>,
        logprobs: Option<LogProbs>,
    ) -> Result<()> {
        let Some(parser) = &mut self.sequence(index)?.parser else {
            let parsed = ParsedText {
                content: text,
                ..ParsedText::default()
            };
            self.queue_parsed(index, parsed, token_ids, logprobs);
            return Ok(());
        };
        // A parsed delta says its text comes before its calls. A long text
        // (a whole unary response) is parsed in one push, and a delta ends
        // at each call, so text written after a call follows it, as it
        // would have streamed.
        let events = parser.push_in_order(&text);
        let mut first = Some((token_ids, logprobs));
        for parsed in events {
            let (token_ids, logprobs) = first.take().unwrap_or_default();
            self.queue_parsed(index, parsed, token_ids, logprobs);
        }
        Ok(())
    }

    fn queue_parsed(
        &mut self,
        index: u32,
        parsed: ParsedText,
        token_ids: Vec<u32>,
        logprobs: Option<LogProbs>,
    ) {
        if !parsed.is_empty() || logprobs.is_some() {
            self.pending.push_back(OutputEvent::Delta {
                index,
                text: parsed.content,
                reasoning: parsed.reasoning,
                tool_calls: parsed.calls,
                token_ids,
                logprobs,
            });
        }
    }

    /// Ends sequence `index`: what its parser held back goes out, then the
    /// finish (`tool_calls` when it made calls and stopped normally).
    fn finish_sequence(
        &mut self,
        index: u32,
        reason: FinishReason,
        matched_stop: Option<MatchedStop>,
    ) -> Result<()> {
        let sequence = self.sequence(index)?;
        sequence.finished = true;
        let mut reason = reason;
        let mut cut_call = None;
        if let Some(parser) = &mut sequence.parser {
            let tail = if reason == FinishReason::Length {
                parser.finish_cut()
            } else {
                parser.finish()
            };
            cut_call = parser.cut_call();
            if parser.made_calls() && reason == FinishReason::Stop {
                reason = FinishReason::ToolCalls;
            }
            self.queue_parsed(index, tail, Vec::new(), None);
        }
        self.pending.push_back(OutputEvent::Finish {
            index,
            reason,
            matched_stop,
            cut_call,
        });
        Ok(())
    }

    fn handle(&mut self, event: GenerateEvent) -> Result<()> {
        match event {
            GenerateEvent::Chunk {
                index,
                token_ids,
                prompt_tokens,
                cached_tokens,
                logprobs,
                ..
            } => {
                self.note_prompt(prompt_tokens, cached_tokens);
                self.push_tokens(index, &token_ids, logprobs)
            }
            GenerateEvent::Complete {
                index,
                output_ids,
                finish_reason,
                matched_stop,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                logprobs,
            } => {
                self.note_prompt(prompt_tokens, cached_tokens);
                let seen = self.sequence(index)?.tokens_seen as usize;
                // Unary responses carry every token here; streams only the rest.
                if let Some(unseen) = output_ids.get(seen..)
                    && !unseen.is_empty()
                {
                    let logprobs = logprobs.map(|report| tail_of(report, unseen.len()));
                    self.push_tokens(index, unseen, logprobs)?;
                }
                let sequence = self.sequence(index)?;
                if std::mem::replace(&mut sequence.counted, true) {
                    // A second completion of one sequence: already counted.
                    return Ok(());
                }
                let already_finished = sequence.finished;
                sequence.finished = true;
                if already_finished {
                    // A stop string ended it: it counts the tokens up to
                    // the stop, whatever the engine generated after them
                    // (as when the stream is dropped, below).
                    self.usage.completion_tokens += sequence.tokens_seen;
                    return Ok(());
                }
                let tail = sequence.decoder.finish()?;
                let mut released = sequence.stops.push(&tail);
                if released.matched_stop.is_none() {
                    released.text.push_str(&sequence.stops.finish());
                }
                self.usage.completion_tokens += completion_tokens.max(sequence.tokens_seen);
                let stop_text = released.matched_stop.take();
                self.queue_delta(index, released.text, Vec::new(), None)?;
                let reason = if stop_text.is_some() {
                    FinishReason::Stop
                } else {
                    FinishReason::from_engine(&finish_reason)
                };
                self.finish_sequence(
                    index,
                    reason,
                    stop_text.map(MatchedStop::Text).or(matched_stop),
                )
            }
        }
    }

    fn all_finished(&self) -> bool {
        self.sequences.iter().all(|s| s.finished)
    }

    async fn next(&mut self) -> Option<Result<OutputEvent>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            if self.all_finished() {
                if let Some(events) = self.events.take() {
                    let engine_completed_all = self.sequences.iter().all(|s| s.counted);
                    release(events, engine_completed_all);
                    // Sequences a stop string ended before their engine
                    // completion arrived count what they produced.
                    for sequence in &mut self.sequences {
                        if !std::mem::replace(&mut sequence.counted, true) {
                            self.usage.completion_tokens += sequence.tokens_seen;
                        }
                    }
                }
                self.done = true;
                return Some(Ok(OutputEvent::Usage(self.usage)));
            }
            let events = self.events.as_mut()?;
            let next = tokio::time::timeout_at(self.deadline, events.next()).await;
            let result = match next {
                Err(_) => Err(Error::new(
                    ErrorCode::RequestTimeout,
                    "the request exceeded --request-timeout-secs",
                )),
                Ok(None) => Err(Error::new(
                    ErrorCode::StreamInterrupted,
                    "the worker's stream ended before every sequence completed",
                )),
                Ok(Some(Err(err))) => Err(err),
                Ok(Some(Ok(event))) => self.handle(event),
            };
            if let Err(err) = result {
                self.done = true;
                self.events = None;
                return Some(Err(err));
            }
        }
    }
}

/// How long a stream whose every sequence the engine completed may take
/// to end (its gRPC trailers) before it is reset after all.
const TRAILERS_WAIT: Duration = Duration::from_secs(2);

/// Lets go of an engine stream the response needs nothing more from.
///
/// When the engine completed every sequence, only the stream's end is
/// still to come: it is read, at once when it has already arrived, else on
/// a task of its own bounded by [`TRAILERS_WAIT`], so the stream ends as
/// the worker ends it. Dropping it instead resets it (`RST_STREAM`), and
/// under load that is not free: h2 remembers only a few streams it reset,
/// a frame arriving on a forgotten one counts as an error of the
/// connection, and at 1,024 such errors it closes the connection (GOAWAY
/// `ENHANCE_YOUR_CALM`), failing every request on it — measured at every
/// ~48,000 unary requests on one connection before this.
///
/// Otherwise a stop string ended a sequence the engine is still
/// generating, and dropping the stream is what stops it.
fn release(mut events: EventStream, engine_completed_all: bool) {
    if !engine_completed_all {
        return;
    }
    use futures::FutureExt;
    if let Some(None) = events.next().now_or_never() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let drained = async { while events.next().await.is_some() {} };
            // Past the wait the stream is dropped: reset, as before.
            let _ = tokio::time::timeout(TRAILERS_WAIT, drained).await;
        });
    }
}

/// Turns a request's engine events into client output events.
pub(crate) fn process(events: EventStream, options: ResponseOptions) -> OutputStream {
    let keep_special_tokens = options.parsing.is_some();
    let sequences = (0..options.n.max(1))
        .map(|_| Sequence {
            decoder: IncrementalDecoder::new(
                &options.tokenizer,
                options.skip_special_tokens && !keep_special_tokens,
            ),
            stops: StopMatcher::new(options.stop_strings.iter().cloned(), options.no_stop_trim),
            parser: options.parsing.as_ref().map(OutputParsing::sequence),
            tokens_seen: 0,
            finished: false,
            counted: false,
        })
        .collect();
    let processor = Processor {
        events: Some(events),
        sequences,
        hidden_ids: if keep_special_tokens {
            options.stop_token_ids
        } else {
            Vec::new()
        },
        pending: std::collections::VecDeque::new(),
        usage: Usage::default(),
        started: false,
        deadline: options.deadline,
        done: false,
    };
    Box::pin(futures::stream::unfold(
        processor,
        |mut processor| async move { processor.next().await.map(|event| (event, processor)) },
    ))
}

/// The last `count` positions of a logprob report: a final message may
/// report every token of the sequence while only the tail is new.
fn tail_of(mut report: LogProbs, count: usize) -> LogProbs {
    let from = |len: usize| len.saturating_sub(count);
    report
        .token_logprobs
        .drain(..from(report.token_logprobs.len()));
    report.token_ids.drain(..from(report.token_ids.len()));
    report.top.drain(..from(report.top.len()));
    report
}

/// One sequence's whole output, for JSON answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CollectedChoice {
    pub index: u32,
    pub text: String,
    /// Reasoning split off the text (empty when not parsed).
    pub reasoning: String,
    /// Whole tool calls, in order (empty when not parsed).
    pub tool_calls: Vec<CollectedCall>,
    pub token_ids: Vec<u32>,
    pub finish_reason: Option<FinishReason>,
    pub matched_stop: Option<MatchedStop>,
    pub logprobs: Vec<LogProbs>,
}

/// One whole tool call of a non-streaming response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CollectedCall {
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
    /// How much of the choice's text came before the call (a byte offset
    /// into `CollectedChoice::text`), so that dialects with ordered blocks
    /// (Anthropic) place text and calls as a stream would.
    pub text_before: usize,
}

/// A whole non-streaming response.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CollectedOutput {
    pub choices: Vec<CollectedChoice>,
    pub usage: Usage,
    /// Time to the first text, for metrics.
    pub first_token_after: Option<Duration>,
}

/// Drains an output stream into one response.
pub(crate) async fn collect(mut output: OutputStream, n: u32) -> Result<CollectedOutput> {
    let started = Instant::now();
    let mut collected = CollectedOutput {
        choices: (0..n.max(1))
            .map(|index| CollectedChoice {
                index,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    while let Some(event) = output.next().await {
        match event? {
            OutputEvent::Delta {
                index,
                text,
                reasoning,
                tool_calls,
                token_ids,
                logprobs,
            } => {
                collected
                    .first_token_after
                    .get_or_insert_with(|| started.elapsed());
                if let Some(choice) = collected.choices.get_mut(index as usize) {
                    choice.text.push_str(&text);
                    choice.reasoning.push_str(&reasoning);
                    for call in tool_calls {
                        if let Some(name) = call.name {
                            choice.tool_calls.push(CollectedCall {
                                id: call.id.unwrap_or_default(),
                                name,
                                arguments: String::new(),
                                text_before: choice.text.len(),
                            });
                        }
                        if let Some(whole) = choice.tool_calls.get_mut(call.index) {
                            whole.arguments.push_str(&call.arguments);
                        }
                    }
                    choice.token_ids.extend(token_ids);
                    choice.logprobs.extend(logprobs);
                }
            }
            OutputEvent::Finish {
                index,
                reason,
                matched_stop,
                cut_call,
            } => {
                if let Some(choice) = collected.choices.get_mut(index as usize) {
                    choice.finish_reason = Some(reason);
                    choice.matched_stop = matched_stop;
                    if let Some(cut) = cut_call {
                        choice.tool_calls.truncate(cut);
                    }
                }
            }
            OutputEvent::Started(usage) | OutputEvent::Usage(usage) => collected.usage = usage,
        }
    }
    Ok(collected)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn chunk(index: u32, token_ids: Vec<u32>) -> GenerateEvent {
        GenerateEvent::Chunk {
            index,
            token_ids,
            prompt_tokens: 40,
            completion_tokens: 0,
            cached_tokens: 32,
            logprobs: None,
        }
    }

    fn complete(index: u32, output_ids: Vec<u32>) -> GenerateEvent {
        GenerateEvent::Complete {
            index,
            completion_tokens: output_ids.len() as u32,
            output_ids,
            finish_reason: "stop".into(),
            matched_stop: None,
            prompt_tokens: 40,
            cached_tokens: 32,
            logprobs: None,
        }
    }

    fn options(n: u32, stop_strings: Vec<String>) -> ResponseOptions {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        ResponseOptions {
            tokenizer: Tokenizer::from_model_dir(&dir).unwrap(),
            n,
            skip_special_tokens: true,
            stop_strings,
            no_stop_trim: false,
            deadline: tokio::time::Instant::now() + Duration::from_secs(60),
            parsing: None,
            stop_token_ids: Vec::new(),
        }
    }

    /// An engine stream fed by a channel, telling whether it was read to
    /// its end (the worker's trailers) and when it was let go.
    struct Observed {
        events: futures::channel::mpsc::UnboundedReceiver<Result<GenerateEvent>>,
        ended: Arc<AtomicBool>,
        released: Option<tokio::sync::oneshot::Sender<()>>,
    }

    impl Stream for Observed {
        type Item = Result<GenerateEvent>;

        fn poll_next(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            let next = self.events.poll_next_unpin(cx);
            if let std::task::Poll::Ready(None) = next {
                self.ended.store(true, Ordering::SeqCst);
            }
            next
        }
    }

    impl Drop for Observed {
        fn drop(&mut self) {
            if let Some(released) = self.released.take() {
                let _ = released.send(());
            }
        }
    }

    /// The engine stream with `events` sent; the sender ends it (drop).
    fn observed(
        events: Vec<GenerateEvent>,
    ) -> (
        EventStream,
        futures::channel::mpsc::UnboundedSender<Result<GenerateEvent>>,
        Arc<AtomicBool>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (sender, receiver) = futures::channel::mpsc::unbounded();
        for event in events {
            sender.unbounded_send(Ok(event)).unwrap();
        }
        let ended = Arc::new(AtomicBool::new(false));
        let (released, on_release) = tokio::sync::oneshot::channel();
        let stream = Observed {
            events: receiver,
            ended: Arc::clone(&ended),
            released: Some(released),
        };
        (Box::pin(stream), sender, ended, on_release)
    }

    async fn collected(events: EventStream, options: ResponseOptions) -> Vec<OutputEvent> {
        process(events, options)
            .map(|event| event.unwrap())
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_stream_whose_end_has_arrived_is_read_to_it_not_reset() {
        let (events, sender, ended, mut on_release) =
            observed(vec![chunk(0, vec![39]), complete(0, vec![39])]);
        drop(sender);
        let output = collected(events, options(1, Vec::new())).await;
        assert!(matches!(output.last(), Some(OutputEvent::Usage(_))));
        assert!(ended.load(Ordering::SeqCst), "read to its end");
        assert!(on_release.try_recv().is_ok(), "and let go at once");
    }

    #[tokio::test]
    async fn a_stream_whose_end_is_late_is_read_to_it_after_the_answer() {
        let (events, sender, ended, on_release) =
            observed(vec![chunk(0, vec![39]), complete(0, vec![39])]);
        let output = collected(events, options(1, Vec::new())).await;
        assert!(matches!(output.last(), Some(OutputEvent::Usage(_))));
        assert!(!ended.load(Ordering::SeqCst));
        // The trailers arrive after the answer went out.
        drop(sender);
        on_release.await.unwrap();
        assert!(ended.load(Ordering::SeqCst), "read to its end, not reset");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_never_ends_is_reset_after_the_wait() {
        let (events, sender, ended, on_release) =
            observed(vec![chunk(0, vec![39]), complete(0, vec![39])]);
        let started = tokio::time::Instant::now();
        collected(events, options(1, Vec::new())).await;
        on_release.await.unwrap();
        assert!(!ended.load(Ordering::SeqCst));
        assert!(started.elapsed() >= TRAILERS_WAIT);
        drop(sender);
    }

    #[tokio::test]
    async fn a_stream_a_stop_string_ended_is_dropped_to_stop_the_engine() {
        // "ell" stops the sequence; the engine has not completed it.
        let (events, sender, ended, mut on_release) =
            observed(vec![chunk(0, vec![39]), chunk(0, vec![415])]);
        let output = collected(events, options(1, vec!["ell".into()])).await;
        assert!(matches!(output.last(), Some(OutputEvent::Usage(_))));
        assert!(on_release.try_recv().is_ok(), "dropped with the answer");
        assert!(!ended.load(Ordering::SeqCst));
        drop(sender);
    }

    /// Two sequences; a stop string ends the first after two tokens, the
    /// second completes after one ("Hello world" is [39, 415, 78, 1009]
    /// in the fixture: "H", "ell", "o", " world").
    #[tokio::test]
    async fn the_prompt_counts_come_first_and_every_sequence_counts() {
        let events: Vec<Result<GenerateEvent>> = vec![
            Ok(chunk(0, vec![39])),
            Ok(chunk(0, vec![415])),
            Ok(chunk(1, vec![39])),
            Ok(complete(1, vec![39])),
        ];
        let options = options(2, vec!["ell".into()]);
        let output: Vec<OutputEvent> = process(Box::pin(futures::stream::iter(events)), options)
            .map(|event| event.unwrap())
            .collect()
            .await;
        let prompt = Usage {
            prompt_tokens: 40,
            completion_tokens: 0,
            cached_tokens: 32,
        };
        assert_eq!(output.first(), Some(&OutputEvent::Started(prompt)));
        assert_eq!(
            output.last(),
            Some(&OutputEvent::Usage(Usage {
                completion_tokens: 2 + 1,
                ..prompt
            })),
            "{output:?}"
        );
    }
}
