//! How large a message from a worker may be, per call.
//!
//! Why it exists: `bounds` holds a worker's answers to what the request
//! asked, but only once a message is decoded, and tonic decodes a whole
//! message (allocating every repeated field) on the task that reads it.
//! Under the engines' 256 MiB transport limit, a hostile worker could send
//! one `GenerateResponse` with millions of logprob alternatives and cost a
//! request thread hundreds of milliseconds and as many megabytes before any
//! check ran, slowing every other request sharing that thread. So each call
//! sets tonic's decoding limit to what a legitimate answer to *this* request
//! can need: tonic reads a message's 5-byte length prefix first and refuses
//! one over the limit before buffering or decoding a byte of it.
//!
//! The bound is deliberately loose (the largest encoding of every field a
//! well-behaved engine sends, doubled, never below [`MIN_MESSAGE_BYTES`]):
//! a false refusal fails a good request, while a loose bound only lets a
//! hostile worker cost a few milliseconds per message, after which `bounds`
//! still repairs or refuses what it sent. A message over the limit fails
//! the call with `worker_protocol_violation`, counted against the worker as
//! `kind="message_size"` (see `EngineClient`).
//!
//! The other calls' answers (model and server info, loads, health, abort,
//! encode) hold a few strings and one entry per data-parallel rank, so they
//! get the floor ([`CONTROL_MESSAGE_BYTES`]); a tokenizer archive chunk may
//! be as large as the whole archive the gateway accepts, and no larger
//! ([`tokenizer_chunk_bytes`]).

use super::GenerateRequest;
use super::client::MAX_TOKENIZER_ARCHIVE_BYTES;
use super::convert::sglang::MAX_EMBEDDING_DIM;
use crate::proto::MAX_MESSAGE_BYTES;

/// The least decoding limit any call gets. Covers what the per-field
/// arithmetic below leaves out (unknown fields a newer engine adds, a long
/// matched stop string) for every request a client can make small, and
/// keeps the cost of decoding one message a hostile worker sends to a few
/// milliseconds.
pub(crate) const MIN_MESSAGE_BYTES: usize = 4 << 20;

/// The decoding limit of every call that sets none of its own: model and
/// server info, loads, health, abort, encode. Their legitimate answers are
/// a few KiB (a `GetLoads` answer grows by ~200 bytes a data-parallel
/// rank, so 4 MiB holds over 20,000).
pub(crate) const CONTROL_MESSAGE_BYTES: usize = MIN_MESSAGE_BYTES;

/// How much larger than the estimate a message may be.
const SLACK: usize = 2;

/// One Generate message beyond its per-token arrays: the echoed request id
/// (added separately), the counts, the finish reason, the matched stop, and
/// the tags and lengths of the nested messages.
const FIXED_BYTES: usize = 4 << 10;

/// Per output token: its id, a packed varint of at most 5 bytes.
const TOKEN_BYTES: usize = 5;

/// Per token with logprobs: its logprob (a packed float, 4 bytes), its id
/// again (5), and its alternatives' `TopLogProbs` message: a tag and a
/// length for the message and for each of its two packed fields (at most
/// 6 bytes each).
const LOGPROB_TOKEN_BYTES: usize = 4 + 5 + 3 * 6;

/// Per logprob alternative: a packed float (4 bytes) and a packed token id
/// (at most 5).
const ALTERNATIVE_BYTES: usize = 4 + 5;

/// The largest `GenerateResponse` (TokenSpeed or SGLang) a worker may send
/// in answer to `request`.
///
/// Every message carries one sequence, so `n` does not enter. A streamed
/// chunk carries the tokens since the last one, but a stream's completion
/// may restate every output id (and a worker may batch a chunk as it
/// likes), so a stream's messages get the whole answer's bound too: the
/// sequence's token budget (`output_budget`, else `max_new_tokens`; with
/// neither, the transport limit) times the bytes of one token, its logprob
/// and its asked alternatives when logprobs were asked. The gateway never
/// asks for input logprobs (`logprob_start_len = -1`) or hidden states, so
/// they get no allowance beyond the floor.
pub(crate) fn generate_message_bytes(request: &GenerateRequest) -> usize {
    let Some(tokens) = request.output_budget.or(request.sampling.max_new_tokens) else {
        return MAX_MESSAGE_BYTES;
    };
    let mut per_token = TOKEN_BYTES;
    if request.return_logprob {
        let alternatives = usize::try_from(request.top_logprobs_num).unwrap_or(0);
        per_token = per_token
            .saturating_add(LOGPROB_TOKEN_BYTES)
            .saturating_add(alternatives.saturating_mul(ALTERNATIVE_BYTES));
    }
    let estimate = usize::try_from(tokens)
        .unwrap_or(usize::MAX)
        .saturating_mul(per_token)
        .saturating_add(FIXED_BYTES)
        .saturating_add(request.request_id.len());
    within_limits(estimate)
}

/// The largest `EmbedResponse` a worker may send: [`MAX_EMBEDDING_DIM`]
/// packed floats and a few counts (a wider embedding is refused anyway).
pub(crate) fn embed_message_bytes() -> usize {
    within_limits(
        MAX_EMBEDDING_DIM
            .saturating_mul(4)
            .saturating_add(FIXED_BYTES),
    )
}

/// The largest `GetTokenizerChunk` a worker may send: the whole archive the
/// gateway accepts ([`MAX_TOKENIZER_ARCHIVE_BYTES`]) in one chunk, with its
/// checksum. A larger chunk could never be accepted, so it is refused
/// before it is buffered.
pub(crate) const fn tokenizer_chunk_bytes() -> usize {
    MAX_TOKENIZER_ARCHIVE_BYTES + FIXED_BYTES
}

/// `estimate` with the slack, between the floor and the transport limit.
fn within_limits(estimate: usize) -> usize {
    estimate
        .saturating_mul(SLACK)
        .clamp(MIN_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::engine::Sampling;
    use crate::proto::{sglang_scheduler as sg, tokenspeed_scheduler as ts};

    fn request(max_tokens: Option<u32>, budget: Option<u32>, top: Option<i32>) -> GenerateRequest {
        GenerateRequest {
            request_id: "chatcmpl-0123456789abcdef".to_owned(),
            sampling: Sampling {
                max_new_tokens: max_tokens,
                n: 1,
                ..Sampling::default()
            },
            return_logprob: top.is_some(),
            top_logprobs_num: top.unwrap_or(0),
            output_budget: budget,
            ..GenerateRequest::default()
        }
    }

    #[test]
    fn small_requests_get_the_floor_and_unbounded_ones_the_transport_limit() {
        assert_eq!(
            generate_message_bytes(&request(Some(16), None, Some(5))),
            MIN_MESSAGE_BYTES
        );
        assert_eq!(
            generate_message_bytes(&request(None, None, None)),
            MAX_MESSAGE_BYTES
        );
        assert_eq!(embed_message_bytes(), MIN_MESSAGE_BYTES);
        // Absurd asks saturate at the transport limit instead of wrapping.
        assert_eq!(
            generate_message_bytes(&request(Some(u32::MAX), None, Some(i32::MAX))),
            MAX_MESSAGE_BYTES
        );
        // A negative alternative count asks for none.
        assert_eq!(
            generate_message_bytes(&request(Some(16), None, Some(-5))),
            MIN_MESSAGE_BYTES
        );
    }

    #[test]
    fn the_bound_grows_with_the_budget_and_the_logprob_ask() {
        // 100,000 tokens with 20 alternatives each: 100,000 x (5 + 27 +
        // 180) bytes plus the fixed part, doubled.
        let big = request(Some(100_000), None, Some(20));
        let expected = (100_000 * (5 + 27 + 20 * 9) + FIXED_BYTES + big.request_id.len()) * 2;
        assert_eq!(generate_message_bytes(&big), expected);
        let plain = request(Some(1_000_000), None, None);
        assert_eq!(
            generate_message_bytes(&plain),
            (1_000_000 * 5 + FIXED_BYTES + plain.request_id.len()) * 2
        );
        // The output budget, when set, is the one that counts.
        let budgeted = request(Some(1_000_000), Some(100_000), Some(20));
        assert_eq!(generate_message_bytes(&budgeted), expected);
        let budget_only = request(None, Some(100_000), Some(20));
        assert_eq!(generate_message_bytes(&budget_only), expected);
    }

    /// A well-behaved worker's largest message for `tokens` tokens with
    /// `top` alternatives each, encoded by both engines' generated types
    /// with the widest values each field can hold, stays within the bound
    /// with room to spare.
    #[test]
    fn the_largest_legitimate_answers_fit_with_room_to_spare() {
        for (tokens, top) in [(1_000u32, 20i32), (40_000, 20), (40_000, 0), (300_000, 5)] {
            let asked = request(Some(tokens), None, (top > 0).then_some(top));
            let limit = generate_message_bytes(&asked);
            let count = tokens as usize;
            let ids = vec![u32::MAX; count];
            let values = vec![f32::MIN; count];
            let alternatives = |top: i32| {
                (0..count)
                    .map(|_| (vec![f32::MIN; top as usize], vec![u32::MAX; top as usize]))
                    .collect::<Vec<_>>()
            };
            let ts_message = ts::GenerateResponse {
                request_id: asked.request_id.clone(),
                response: Some(ts::generate_response::Response::Complete(
                    ts::GenerateComplete {
                        output_ids: ids.clone(),
                        finish_reason: "length".to_owned(),
                        prompt_tokens: u32::MAX,
                        completion_tokens: u32::MAX,
                        cached_tokens: u32::MAX,
                        output_logprobs: (top > 0).then(|| ts::OutputLogProbs {
                            token_logprobs: values.clone(),
                            token_ids: ids.clone(),
                            top_logprobs: alternatives(top)
                                .into_iter()
                                .map(|(values, token_ids)| ts::TopLogProbs { values, token_ids })
                                .collect(),
                        }),
                        matched_stop: None,
                        index: u32::MAX,
                    },
                )),
            };
            let sg_message = sg::GenerateResponse {
                request_id: asked.request_id.clone(),
                response: Some(sg::generate_response::Response::Complete(
                    sg::GenerateComplete {
                        output_ids: ids.clone(),
                        finish_reason: "length".to_owned(),
                        prompt_tokens: u32::MAX,
                        completion_tokens: u32::MAX,
                        cached_tokens: u32::MAX,
                        output_logprobs: (top > 0).then(|| sg::OutputLogProbs {
                            token_logprobs: values.clone(),
                            token_ids: ids.clone(),
                            top_logprobs: alternatives(top)
                                .into_iter()
                                .map(|(values, token_ids)| sg::TopLogProbs { values, token_ids })
                                .collect(),
                        }),
                        index: u32::MAX,
                        reasoning_tokens: u32::MAX,
                        ..Default::default()
                    },
                )),
            };
            for (engine, size) in [
                ("tokenspeed", ts_message.encoded_len()),
                ("sglang", sg_message.encoded_len()),
            ] {
                assert!(
                    size.saturating_mul(3) / 2 <= limit,
                    "{engine}, {tokens} tokens x {top}: {size} bytes against a limit of {limit}"
                );
            }
        }
        // A GetLoads answer from 16 times the default --max-dp-ranks, every
        // number at its widest encoding, every optional part present.
        let rank = sg::SchedulerLoad {
            dp_rank: -1,
            num_running_reqs: -1,
            num_waiting_reqs: -1,
            num_total_reqs: -1,
            num_used_tokens: -1,
            max_total_num_tokens: -1,
            token_usage: f64::MIN,
            gen_throughput: f64::MIN,
            cache_hit_rate: f64::MIN,
            utilization: f64::MIN,
            max_running_requests: -1,
            memory: Some(Default::default()),
            speculative: Some(Default::default()),
            lora: Some(Default::default()),
            disaggregation: Some(Default::default()),
            queues: Some(Default::default()),
        };
        let ranks = 16 * crate::workers::Lifecycle::DEFAULT_MAX_DP_RANKS as usize;
        let loads = sg::GetLoadsResponse {
            loads: vec![rank; ranks],
            ..Default::default()
        };
        assert!(loads.encoded_len().saturating_mul(3) / 2 <= CONTROL_MESSAGE_BYTES);
        let embedding = sg::EmbedResponse {
            embedding_dim: u32::MAX,
            embedding: vec![f32::MIN; MAX_EMBEDDING_DIM],
            prompt_tokens: u32::MAX,
        };
        assert!(embedding.encoded_len().saturating_mul(3) / 2 <= embed_message_bytes());
    }
}
