//! Holding a worker's Generate stream to what the request asked for.
//!
//! Why it exists: a worker is a process the gateway does not control, and
//! everything after the engine client (detokenization, stop matching, the
//! SSE writer, the JSON collector, the leg supervisor counting completions)
//! allocates and decides from the counts a worker sends. A buggy or hostile
//! engine could stream ten million tokens past `max_tokens`, send 100,000
//! logprob alternatives when 5 were asked, or number sequences that do not
//! exist. So each event is checked once, where the worker's messages become
//! [`GenerateEvent`]s, against what this request asked:
//!
//! - **Tokens per sequence** may not pass the request's output budget
//!   (`max_tokens`, else the context left after the prompt). A sequence that
//!   does is cut at the budget and finished with `length`, as if the worker
//!   had stopped there; the caller then aborts the call on the worker.
//! - **Logprob alternatives** beyond the asked `top_logprobs` are dropped;
//!   logprobs nobody asked for are dropped; per-token arrays whose lengths
//!   disagree (with each other, or with the chunk's tokens) are refused.
//! - **Sequence indices** must be below the request's `n`; a chunk or
//!   completion for a sequence the worker already completed is dropped, so
//!   a worker cannot make the supervisor believe every sequence is done.
//!
//! What can be repaired is repaired (the client gets a correct, truncated
//! answer) and reported as a [`Violation`]; what cannot is refused with one.
//! The caller counts both against the worker. Nothing here does I/O.

use crate::engine::{GenerateEvent, GenerateRequest, LogProbs};
use crate::metrics::ProtocolViolation;

/// Something a worker sent that it must not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    pub kind: ProtocolViolation,
    /// What exactly, for the error message and the log (never the worker's
    /// data itself, only counts).
    pub detail: String,
}

impl Violation {
    fn new(kind: ProtocolViolation, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

/// What to pass on for one event.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Admitted {
    /// The event, as sent or trimmed; `None` drops it.
    pub event: Option<GenerateEvent>,
    /// A completion the gateway made for a sequence it cut (after `event`).
    pub cut: Option<GenerateEvent>,
    /// What the worker did wrong, repaired.
    pub repaired: Option<Violation>,
}

/// How far one sequence has got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Sequence {
    /// Still generating.
    #[default]
    Open,
    /// The worker completed it.
    Completed,
    /// The gateway cut it at the budget; the worker may not know yet.
    Cut,
}

/// The bounds one Generate call's events are held to, and the state that
/// checking them needs (tokens so far per sequence).
#[derive(Debug)]
pub(crate) struct OutputBounds {
    /// Tokens each sequence may have.
    budget: u32,
    /// Alternatives per token, when logprobs were asked for.
    top_logprobs: Option<usize>,
    tokens: Vec<u32>,
    states: Vec<Sequence>,
}

impl OutputBounds {
    /// The bounds of `request`: its `n`, its output budget (its
    /// `output_budget`, else its `max_new_tokens`, else none) and its
    /// logprob ask.
    pub(super) fn for_request(request: &GenerateRequest) -> Self {
        let budget = request
            .output_budget
            .or(request.sampling.max_new_tokens)
            .unwrap_or(u32::MAX);
        let sequences = request.sampling.n.max(1) as usize;
        Self {
            budget,
            top_logprobs: request
                .return_logprob
                .then(|| usize::try_from(request.top_logprobs_num).unwrap_or(0)),
            tokens: vec![0; sequences],
            states: vec![Sequence::Open; sequences],
        }
    }

    /// Whether every sequence has ended.
    pub(super) fn all_done(&self) -> bool {
        self.states.iter().all(|state| *state != Sequence::Open)
    }

    /// Whether the gateway cut a sequence the worker may still be
    /// generating (so the call must be aborted on the worker).
    pub(super) fn cut_any(&self) -> bool {
        self.states.contains(&Sequence::Cut)
    }

    /// Checks one event: what to pass on, or why the event is refused.
    pub(super) fn admit(&mut self, event: GenerateEvent) -> Result<Admitted, Violation> {
        match event {
            GenerateEvent::Chunk {
                index,
                mut token_ids,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                logprobs,
            } => {
                let slot = self.slot(index)?;
                match self.states[slot] {
                    // The worker has not heard of the cut yet.
                    Sequence::Cut => return Ok(Admitted::default()),
                    Sequence::Completed => return Ok(after_completion(index)),
                    Sequence::Open => {}
                }
                let (mut logprobs, mut repaired) =
                    self.logprobs(logprobs, Positions::Exactly(token_ids.len()))?;
                let room = self.budget - self.tokens[slot];
                let mut cut = None;
                if token_ids.len() > room as usize {
                    let sent = token_ids.len();
                    token_ids.truncate(room as usize);
                    if let Some(report) = logprobs.as_mut() {
                        keep_first(report, room as usize);
                    }
                    self.states[slot] = Sequence::Cut;
                    repaired = Some(self.overrun(index, sent));
                    cut = Some(GenerateEvent::Complete {
                        index,
                        output_ids: Vec::new(),
                        finish_reason: "length".to_owned(),
                        matched_stop: None,
                        prompt_tokens,
                        completion_tokens: self.budget,
                        cached_tokens,
                        logprobs: None,
                    });
                }
                // Fits: `token_ids` is at most `room` long now.
                self.tokens[slot] += token_ids.len() as u32;
                let event =
                    (!token_ids.is_empty() || cut.is_none()).then(|| GenerateEvent::Chunk {
                        index,
                        token_ids,
                        prompt_tokens,
                        completion_tokens: completion_tokens.min(self.budget),
                        cached_tokens,
                        logprobs,
                    });
                Ok(Admitted {
                    event,
                    cut,
                    repaired,
                })
            }
            GenerateEvent::Complete {
                index,
                mut output_ids,
                mut finish_reason,
                mut matched_stop,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                logprobs,
            } => {
                let slot = self.slot(index)?;
                match self.states[slot] {
                    // The worker acknowledging the cut (or the abort).
                    Sequence::Cut => return Ok(Admitted::default()),
                    Sequence::Completed => return Ok(after_completion(index)),
                    Sequence::Open => {}
                }
                let (mut logprobs, mut repaired) =
                    self.logprobs(logprobs, Positions::AtMost(output_ids.len()))?;
                let budget = self.budget as usize;
                if output_ids.len() > budget {
                    // The report's positions end where `output_ids` ends.
                    let surplus = output_ids.len() - budget;
                    if let Some(report) = logprobs.as_mut() {
                        let kept = positions(report).saturating_sub(surplus);
                        keep_first(report, kept);
                    }
                    repaired = Some(self.overrun(index, output_ids.len()));
                    output_ids.truncate(budget);
                    finish_reason = "length".to_owned();
                    matched_stop = None;
                }
                self.states[slot] = Sequence::Completed;
                Ok(Admitted {
                    event: Some(GenerateEvent::Complete {
                        index,
                        output_ids,
                        finish_reason,
                        matched_stop,
                        prompt_tokens,
                        completion_tokens: completion_tokens.min(self.budget),
                        cached_tokens,
                        logprobs,
                    }),
                    cut: None,
                    repaired,
                })
            }
        }
    }

    /// The position of sequence `index`, refused when the request has no
    /// such sequence.
    fn slot(&self, index: u32) -> Result<usize, Violation> {
        let count = self.states.len();
        usize::try_from(index)
            .ok()
            .filter(|&slot| slot < count)
            .ok_or_else(|| {
                Violation::new(
                    ProtocolViolation::SequenceIndex,
                    format!("it sent sequence {index}, but the request has {count}"),
                )
            })
    }

    fn overrun(&self, index: u32, sent: usize) -> Violation {
        Violation::new(
            ProtocolViolation::TokenOverrun,
            format!(
                "sequence {index} went past its budget of {} tokens (a message of {sent}); cut at \
                 the budget",
                self.budget
            ),
        )
    }

    /// A report checked against the tokens it describes and the ask:
    /// refused when its arrays disagree, dropped when not asked for,
    /// alternatives cut to the asked number.
    fn logprobs(
        &self,
        report: Option<LogProbs>,
        tokens: Positions,
    ) -> Result<(Option<LogProbs>, Option<Violation>), Violation> {
        let Some(mut report) = report else {
            return Ok((None, None));
        };
        let count = report.token_logprobs.len();
        let consistent = report.token_ids.len() == count
            && (report.top.is_empty() || report.top.len() == count)
            && match tokens {
                Positions::Exactly(tokens) => count == tokens,
                Positions::AtMost(tokens) => count <= tokens,
            };
        if !consistent {
            let tokens = match tokens {
                Positions::Exactly(tokens) => format!("{tokens} tokens"),
                Positions::AtMost(tokens) => format!("at most {tokens} tokens"),
            };
            return Err(Violation::new(
                ProtocolViolation::LogprobShape,
                format!(
                    "its logprobs have {count} values, {} token ids and {} alternative lists for \
                     {tokens}",
                    report.token_ids.len(),
                    report.top.len()
                ),
            ));
        }
        let Some(asked) = self.top_logprobs else {
            return Ok((
                None,
                Some(Violation::new(
                    ProtocolViolation::UnaskedLogprobs,
                    "it sent logprobs nobody asked for; dropped",
                )),
            ));
        };
        let most = report.top.iter().map(Vec::len).max().unwrap_or(0);
        if most <= asked {
            return Ok((Some(report), None));
        }
        for alternatives in &mut report.top {
            alternatives.truncate(asked);
        }
        Ok((
            Some(report),
            Some(Violation::new(
                ProtocolViolation::LogprobAlternatives,
                format!("it sent {most} logprob alternatives per token where {asked} were asked"),
            )),
        ))
    }
}

/// How many positions a logprob report must describe.
#[derive(Debug, Clone, Copy)]
enum Positions {
    /// A chunk: one per token it carries.
    Exactly(usize),
    /// A completion: at most its output ids (a stream's completion may
    /// describe only the last tokens, or none).
    AtMost(usize),
}

fn after_completion(index: u32) -> Admitted {
    Admitted {
        repaired: Some(Violation::new(
            ProtocolViolation::AfterCompletion,
            format!("it sent more of sequence {index} after completing it; dropped"),
        )),
        ..Admitted::default()
    }
}

fn positions(report: &LogProbs) -> usize {
    report.token_logprobs.len()
}

/// Keeps a report's first `count` positions.
fn keep_first(report: &mut LogProbs, count: usize) {
    report.token_logprobs.truncate(count);
    report.token_ids.truncate(count);
    report.top.truncate(count);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Sampling;

    fn request(max_tokens: Option<u32>, n: u32, top: Option<i32>) -> GenerateRequest {
        GenerateRequest {
            sampling: Sampling {
                max_new_tokens: max_tokens,
                n,
                ..Sampling::default()
            },
            return_logprob: top.is_some(),
            top_logprobs_num: top.unwrap_or(0),
            ..GenerateRequest::default()
        }
    }

    fn chunk(index: u32, tokens: usize, logprobs: Option<LogProbs>) -> GenerateEvent {
        GenerateEvent::Chunk {
            index,
            token_ids: (0..tokens as u32).collect(),
            prompt_tokens: 3,
            completion_tokens: 0,
            cached_tokens: 0,
            logprobs,
        }
    }

    fn complete(index: u32, tokens: usize, logprobs: Option<LogProbs>) -> GenerateEvent {
        GenerateEvent::Complete {
            index,
            output_ids: (0..tokens as u32).collect(),
            finish_reason: "stop".to_owned(),
            matched_stop: Some(crate::engine::MatchedStop::TokenId(2)),
            prompt_tokens: 3,
            completion_tokens: tokens as u32,
            cached_tokens: 0,
            logprobs,
        }
    }

    /// `positions` logprob positions with `alternatives` each.
    fn report(positions: usize, alternatives: usize) -> LogProbs {
        LogProbs {
            token_logprobs: vec![-1.0; positions],
            token_ids: (0..positions as u32).collect(),
            top: (0..positions)
                .map(|_| (0..alternatives as u32).map(|id| (-2.0, id)).collect())
                .collect(),
        }
    }

    fn token_count(event: &GenerateEvent) -> usize {
        match event {
            GenerateEvent::Chunk { token_ids, .. } => token_ids.len(),
            GenerateEvent::Complete { output_ids, .. } => output_ids.len(),
        }
    }

    #[test]
    fn a_stream_past_max_tokens_is_cut_there_and_finished_as_length() {
        let mut bounds = OutputBounds::for_request(&request(Some(5), 1, None));
        let first = bounds.admit(chunk(0, 3, None)).expect("fits");
        assert_eq!(first.event.as_ref().map(token_count), Some(3));
        assert!(first.cut.is_none() && first.repaired.is_none());
        assert!(!bounds.all_done());

        let over = bounds.admit(chunk(0, 1000, None)).expect("repaired");
        assert_eq!(over.event.as_ref().map(token_count), Some(2), "5 - 3");
        let Some(GenerateEvent::Complete {
            finish_reason,
            completion_tokens,
            ..
        }) = over.cut
        else {
            panic!("a completion for the cut sequence: {:?}", over.cut);
        };
        assert_eq!((finish_reason.as_str(), completion_tokens), ("length", 5));
        assert_eq!(
            over.repaired.map(|v| v.kind),
            Some(ProtocolViolation::TokenOverrun)
        );
        assert!(bounds.all_done() && bounds.cut_any());

        // Whatever the worker sends next for the cut sequence is dropped.
        let later = bounds.admit(chunk(0, 1000, None)).expect("dropped");
        assert_eq!(later, Admitted::default());
        let ack = bounds.admit(complete(0, 2000, None)).expect("dropped");
        assert_eq!(ack, Admitted::default());
    }

    #[test]
    fn a_chunk_that_ends_exactly_at_the_budget_is_cut_without_a_token_lost() {
        let mut bounds = OutputBounds::for_request(&request(Some(4), 1, None));
        let exact = bounds.admit(chunk(0, 4, None)).expect("fits");
        assert_eq!(exact.event.as_ref().map(token_count), Some(4));
        assert!(exact.cut.is_none() && !bounds.all_done());
        // The next token is one too many: no empty chunk, just the cut.
        let over = bounds.admit(chunk(0, 1, None)).expect("repaired");
        assert!(over.event.is_none(), "{:?}", over.event);
        assert!(over.cut.is_some());
    }

    #[test]
    fn a_unary_completion_past_max_tokens_is_truncated() {
        let mut bounds = OutputBounds::for_request(&request(Some(4), 1, Some(2)));
        // The report's 10 positions end with the 10 output ids.
        let admitted = bounds
            .admit(complete(0, 10, Some(report(10, 2))))
            .expect("repaired");
        let Some(GenerateEvent::Complete {
            output_ids,
            finish_reason,
            matched_stop,
            completion_tokens,
            logprobs,
            ..
        }) = admitted.event
        else {
            panic!("a completion");
        };
        assert_eq!(output_ids, [0, 1, 2, 3]);
        assert_eq!(finish_reason, "length");
        assert_eq!(matched_stop, None, "the stop lay past the cut");
        assert_eq!(completion_tokens, 4);
        assert_eq!(logprobs.map(|r| r.token_ids), Some(vec![0, 1, 2, 3]));
        assert_eq!(
            admitted.repaired.map(|v| v.kind),
            Some(ProtocolViolation::TokenOverrun)
        );
        assert!(
            bounds.all_done() && !bounds.cut_any(),
            "the worker finished"
        );
    }

    #[test]
    fn the_output_budget_wins_over_max_new_tokens_and_none_means_unbounded() {
        let mut budgeted = request(None, 1, None);
        budgeted.output_budget = Some(2);
        let mut bounds = OutputBounds::for_request(&budgeted);
        assert!(bounds.admit(chunk(0, 3, None)).expect("cut").cut.is_some());

        let mut bounds = OutputBounds::for_request(&request(None, 1, None));
        let admitted = bounds.admit(chunk(0, 100_000, None)).expect("fits");
        assert_eq!(admitted.event.as_ref().map(token_count), Some(100_000));
    }

    #[test]
    fn sequences_are_bounded_each_and_indices_must_exist() {
        let mut bounds = OutputBounds::for_request(&request(Some(2), 2, None));
        assert!(bounds.admit(chunk(1, 2, None)).expect("fits").cut.is_none());
        assert!(bounds.admit(chunk(0, 3, None)).expect("cut").cut.is_some());
        assert!(!bounds.all_done(), "sequence 1 is still open");
        assert!(
            bounds
                .admit(complete(1, 2, None))
                .expect("done")
                .event
                .is_some()
        );
        assert!(bounds.all_done());

        for index in [2, 7, u32::MAX] {
            for event in [chunk(index, 1, None), complete(index, 1, None)] {
                let refused = bounds.admit(event).expect_err("no such sequence");
                assert_eq!(refused.kind, ProtocolViolation::SequenceIndex, "{index}");
            }
        }
    }

    #[test]
    fn nothing_of_a_completed_sequence_passes_twice() {
        let mut bounds = OutputBounds::for_request(&request(Some(50), 2, None));
        assert!(
            bounds
                .admit(complete(0, 3, None))
                .expect("done")
                .event
                .is_some()
        );
        for event in [complete(0, 3, None), chunk(0, 5, None)] {
            let again = bounds.admit(event).expect("dropped");
            assert!(again.event.is_none() && again.cut.is_none());
            assert_eq!(
                again.repaired.map(|v| v.kind),
                Some(ProtocolViolation::AfterCompletion)
            );
        }
        assert!(
            !bounds.all_done(),
            "a repeated completion is not sequence 1's"
        );
    }

    #[test]
    fn logprob_alternatives_are_cut_to_the_asked_number() {
        let mut bounds = OutputBounds::for_request(&request(Some(10), 1, Some(5)));
        let admitted = bounds
            .admit(chunk(0, 2, Some(report(2, 100_000))))
            .expect("repaired");
        let Some(GenerateEvent::Chunk {
            logprobs: Some(cut),
            ..
        }) = admitted.event
        else {
            panic!("a chunk with logprobs");
        };
        assert!(cut.top.iter().all(|alternatives| alternatives.len() == 5));
        let violation = admitted.repaired.expect("counted");
        assert_eq!(violation.kind, ProtocolViolation::LogprobAlternatives);
        assert!(violation.detail.contains("100000"), "{}", violation.detail);

        let fine = bounds
            .admit(chunk(0, 1, Some(report(1, 5))))
            .expect("as asked");
        assert!(fine.repaired.is_none());
    }

    #[test]
    fn logprobs_nobody_asked_for_are_dropped() {
        let mut bounds = OutputBounds::for_request(&request(Some(10), 1, None));
        let admitted = bounds
            .admit(chunk(0, 1, Some(report(1, 3))))
            .expect("repaired");
        let Some(GenerateEvent::Chunk { logprobs, .. }) = admitted.event else {
            panic!("a chunk");
        };
        assert_eq!(logprobs, None);
        assert_eq!(
            admitted.repaired.map(|v| v.kind),
            Some(ProtocolViolation::UnaskedLogprobs)
        );
    }

    #[test]
    fn logprob_arrays_must_agree_with_their_tokens() {
        let short_values = LogProbs {
            token_logprobs: vec![-1.0],
            ..report(2, 1)
        };
        let short_top = LogProbs {
            top: vec![vec![]],
            ..report(2, 1)
        };
        let cases = [
            (
                "chunk with fewer positions",
                chunk(0, 3, Some(report(2, 1))),
            ),
            ("chunk with more positions", chunk(0, 1, Some(report(2, 1)))),
            ("values shorter than ids", chunk(0, 2, Some(short_values))),
            ("alternatives for one of two", chunk(0, 2, Some(short_top))),
            (
                "completion describing more than it carries",
                complete(0, 1, Some(report(2, 1))),
            ),
        ];
        for (name, event) in cases {
            let mut bounds = OutputBounds::for_request(&request(Some(10), 1, Some(1)));
            let refused = bounds.admit(event).expect_err(name);
            assert_eq!(refused.kind, ProtocolViolation::LogprobShape, "{name}");
        }
        let mut bounds = OutputBounds::for_request(&request(Some(10), 1, Some(1)));
        for fine in [
            chunk(0, 2, Some(report(2, 1))),
            chunk(0, 2, Some(report(2, 0))),
            complete(0, 4, Some(report(1, 1))),
        ] {
            bounds.admit(fine).expect("consistent");
        }
    }
}
