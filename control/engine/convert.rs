//! Translation between the protocol-neutral engine types and each engine's
//! wire messages.
//!
//! TokenSpeed and SGLang describe the same things with different messages
//! (swapped field numbers, int32 vs int64 rooms, per-item tensors vs one
//! concatenated pixel tensor, optional vs always-present sampling fields).
//! Each protocol gets its own submodule; what both need (room limits, JSON
//! from protobuf `Struct`s, summing per-rank loads, reading the messages
//! both protocols shape alike: model info and Generate events) lives here. Nothing in
//! this module does I/O, so every rule is unit tested without a socket.

pub(crate) mod sglang;
pub(crate) mod tokenspeed;

use super::{Load, LogProbs, Runtime};
use crate::error::{Error, Result};

/// The load sections the gateway asks workers for (wire.md: GetLoadsRequest).
pub(crate) const LOAD_SECTIONS: [&str; 4] = ["core", "disagg", "queues", "memory"];

/// A rendezvous room as `runtime`'s wire type. Rooms are never truncated: a
/// negative room, or one that does not fit, is refused.
pub(crate) fn checked_room<T: TryFrom<i64>>(runtime: Runtime, room: i64) -> Result<T> {
    match T::try_from(room) {
        Ok(wire) if (0..=runtime.max_room()).contains(&room) => Ok(wire),
        _ => Err(Error::invalid_parameter(
            "bootstrap_room",
            format!(
                "bootstrap room {room} does not fit {}'s wire type (0..={})",
                runtime.name(),
                runtime.max_room()
            ),
        )),
    }
}

/// A non-negative protocol integer as `u32`; negative values (never valid
/// for these fields) read as 0.
pub(crate) fn non_negative(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

/// Converts a protobuf `Struct` to JSON; an absent struct is `null`.
pub(crate) fn json_from_struct(value: Option<prost_types::Struct>) -> serde_json::Value {
    value.map_or(serde_json::Value::Null, |fields| {
        serde_json::Value::Object(
            fields
                .fields
                .into_iter()
                .map(|(key, value)| (key, json_from_value(value)))
                .collect(),
        )
    })
}

/// Largest integer a protobuf `Struct` number (a double) holds exactly.
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

fn json_from_value(value: prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    match value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(flag)) => serde_json::Value::Bool(flag),
        Some(Kind::NumberValue(number)) => json_number(number),
        Some(Kind::StringValue(text)) => serde_json::Value::String(text),
        Some(Kind::ListValue(list)) => {
            serde_json::Value::Array(list.values.into_iter().map(json_from_value).collect())
        }
        Some(Kind::StructValue(fields)) => json_from_struct(Some(fields)),
    }
}

/// `Struct` numbers are doubles; whole ones become JSON integers so that
/// `262144` reads back as `262144`, not `262144.0`. NaN and infinities,
/// which JSON cannot hold, become `null`.
fn json_number(number: f64) -> serde_json::Value {
    if number.fract() == 0.0 && number.abs() <= MAX_EXACT_INTEGER {
        // Exact: a whole double within ±2^53 converts to i64 without loss.
        serde_json::Value::from(number as i64)
    } else {
        serde_json::Number::from_f64(number).map_or(serde_json::Value::Null, Into::into)
    }
}

/// The `shm_namespace_id` a worker advertises in `scheduler_info`, if any.
pub(crate) fn shm_namespace_id(scheduler_info: &serde_json::Value) -> Option<String> {
    scheduler_info
        .get("shm_namespace_id")
        .and_then(serde_json::Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// Builds [`LogProbs`] from either protocol's (identically shaped) message.
pub(crate) fn log_probs(
    token_logprobs: Vec<f32>,
    token_ids: Vec<u32>,
    top: impl IntoIterator<Item = (Vec<f32>, Vec<u32>)>,
) -> LogProbs {
    LogProbs {
        token_logprobs,
        token_ids,
        top: top
            .into_iter()
            .map(|(values, ids)| values.into_iter().zip(ids).collect())
            .collect(),
    }
}

/// [`ModelInfo`](crate::engine::ModelInfo) from either protocol's
/// `GetModelInfoResponse`: both carry these fields under the same names and
/// types (wire.md), so one reading serves both.
macro_rules! model_info_from {
    ($info:expr) => {{
        let info = $info;
        $crate::engine::ModelInfo {
            model_path: info.model_path,
            tokenizer_path: info.tokenizer_path,
            served_model_name: info.served_model_name,
            model_type: info.model_type,
            architectures: info.architectures,
            max_context_length: $crate::engine::convert::non_negative(info.max_context_length),
            max_req_input_len: $crate::engine::convert::non_negative(info.max_req_input_len),
            vocab_size: $crate::engine::convert::non_negative(info.vocab_size),
            eos_token_ids: info
                .eos_token_ids
                .into_iter()
                .filter_map(|id| u32::try_from(id).ok())
                .collect(),
            bos_token_id: u32::try_from(info.bos_token_id).ok(),
            pad_token_id: u32::try_from(info.pad_token_id).ok(),
            weight_version: info.weight_version,
            supports_vision: info.supports_vision,
        }
    }};
}
pub(crate) use model_info_from;

/// A [`GenerateEvent`](crate::engine::GenerateEvent) from either protocol's
/// `GenerateResponse` (`$proto` is its generated module): both protocols'
/// chunk and complete messages carry the same fields (wire.md), so one
/// reading serves both; `$log_probs` converts the protocol's logprobs.
macro_rules! generate_event_from {
    ($proto:ident, $response:expr, $log_probs:expr) => {{
        use $crate::engine::{GenerateEvent, MatchedStop};
        use $proto::generate_response::Response;
        Some(match $response.response? {
            Response::Chunk(chunk) => GenerateEvent::Chunk {
                index: chunk.index,
                token_ids: chunk.token_ids,
                prompt_tokens: chunk.prompt_tokens,
                completion_tokens: chunk.completion_tokens,
                cached_tokens: chunk.cached_tokens,
                logprobs: chunk.output_logprobs.map($log_probs),
            },
            Response::Complete(done) => GenerateEvent::Complete {
                index: done.index,
                output_ids: done.output_ids,
                finish_reason: done.finish_reason,
                matched_stop: done.matched_stop.map(|stop| {
                    use $proto::generate_complete::MatchedStop as Wire;
                    match stop {
                        Wire::MatchedTokenId(id) => MatchedStop::TokenId(id),
                        Wire::MatchedStopStr(text) => MatchedStop::Text(text),
                    }
                }),
                prompt_tokens: done.prompt_tokens,
                completion_tokens: done.completion_tokens,
                cached_tokens: done.cached_tokens,
                logprobs: done.output_logprobs.map($log_probs),
            },
        })
    }};
}
pub(crate) use generate_event_from;

/// One DP rank's load, as both protocols report it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RankLoad {
    pub running_requests: i32,
    pub waiting_requests: i32,
    pub max_running_requests: i32,
    pub used_tokens: i32,
    pub max_total_tokens: i32,
    pub waiting_uncached_tokens: i32,
    pub token_usage: f64,
    pub gen_throughput: f64,
    pub cache_hit_rate: f64,
}

/// Sums per-rank loads into one worker load: counts and throughput add up
/// (saturating: a worker's numbers must not overflow the gateway's
/// arithmetic); the ratios (token usage, cache hit rate) are averaged over
/// the ranks. `dp_rank_count` is the worker's own count, or the number of
/// ranks it reported when it leaves the count at 0.
pub(crate) fn sum_ranks(dp_rank_count: i32, ranks: impl IntoIterator<Item = RankLoad>) -> Load {
    let mut total = Load::default();
    let mut reported = 0i32;
    for rank in ranks {
        reported = reported.saturating_add(1);
        total.running_requests = total.running_requests.saturating_add(rank.running_requests);
        total.waiting_requests = total.waiting_requests.saturating_add(rank.waiting_requests);
        total.max_running_requests = total
            .max_running_requests
            .saturating_add(rank.max_running_requests.max(0));
        total.used_tokens = total.used_tokens.saturating_add(rank.used_tokens);
        total.max_total_tokens = total.max_total_tokens.saturating_add(rank.max_total_tokens);
        total.waiting_uncached_tokens = total
            .waiting_uncached_tokens
            .saturating_add(rank.waiting_uncached_tokens);
        total.gen_throughput += rank.gen_throughput;
        total.token_usage += rank.token_usage;
        total.cache_hit_rate += rank.cache_hit_rate;
    }
    if reported > 0 {
        total.token_usage /= f64::from(reported);
        total.cache_hit_rate /= f64::from(reported);
    }
    total.dp_rank_count = if dp_rank_count > 0 {
        dp_rank_count
    } else {
        reported
    };
    total
}

#[cfg(test)]
pub(crate) mod wire {
    //! A raw protobuf field reader for tests: it reads field numbers and
    //! wire types from encoded bytes, so a conversion test checks what goes
    //! on the wire against wire.md rather than round-tripping through the
    //! same generated types.

    use prost::encoding::{WireType, decode_key, decode_varint};

    /// One top-level field occurrence.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) enum Raw {
        Varint(u64),
        Fixed32(u32),
        Fixed64(u64),
        Bytes(Vec<u8>),
    }

    /// Every top-level field of `bytes`, in wire order.
    pub(crate) fn fields(mut bytes: &[u8]) -> Vec<(u32, Raw)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (number, wire_type) = decode_key(&mut bytes).expect("a field key");
            let value = match wire_type {
                WireType::Varint => Raw::Varint(decode_varint(&mut bytes).expect("a varint")),
                WireType::ThirtyTwoBit => {
                    let (head, rest) = bytes.split_at(4);
                    bytes = rest;
                    Raw::Fixed32(u32::from_le_bytes(head.try_into().expect("4 bytes")))
                }
                WireType::SixtyFourBit => {
                    let (head, rest) = bytes.split_at(8);
                    bytes = rest;
                    Raw::Fixed64(u64::from_le_bytes(head.try_into().expect("8 bytes")))
                }
                WireType::LengthDelimited => {
                    let len = decode_varint(&mut bytes).expect("a length") as usize;
                    let (head, rest) = bytes.split_at(len);
                    bytes = rest;
                    Raw::Bytes(head.to_vec())
                }
                other => panic!("unexpected wire type {other:?}"),
            };
            out.push((number, value));
        }
        out
    }

    /// The single occurrence of field `number`.
    pub(crate) fn field(bytes: &[u8], number: u32) -> Option<Raw> {
        let mut found: Vec<Raw> = fields(bytes)
            .into_iter()
            .filter(|(n, _)| *n == number)
            .map(|(_, raw)| raw)
            .collect();
        assert!(found.len() <= 1, "field {number} occurs {}×", found.len());
        found.pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn rooms_must_fit_the_runtime_wire_type() {
        let big = i64::from(i32::MAX) + 1;
        let cases = [
            (Runtime::Sglang, 0, true),
            (Runtime::Sglang, i64::from(i32::MAX), true),
            (Runtime::Sglang, big, false),
            (Runtime::Sglang, -1, false),
            (Runtime::TokenSpeed, big, true),
            (Runtime::TokenSpeed, i64::MAX, true),
            (Runtime::TokenSpeed, -1, false),
        ];
        for (runtime, room, fits) in cases {
            let checked = checked_room(runtime, room);
            if fits {
                assert_eq!(checked, Ok(room), "{runtime:?} {room}");
            } else {
                let err = checked.expect_err("refused");
                assert_eq!(err.code, ErrorCode::InvalidParameter, "{runtime:?} {room}");
                assert_eq!(err.param.as_deref(), Some("bootstrap_room"));
                assert!(err.message.contains(&room.to_string()), "{}", err.message);
            }
        }
    }

    #[test]
    fn structs_become_json_with_whole_numbers_as_integers() {
        use prost_types::value::Kind;
        let value = |kind| prost_types::Value { kind: Some(kind) };
        let nested = prost_types::Struct {
            fields: [("depth".to_owned(), value(Kind::NumberValue(2.0)))].into(),
        };
        let fields = prost_types::Struct {
            fields: [
                ("tokens".to_owned(), value(Kind::NumberValue(262_144.0))),
                ("ratio".to_owned(), value(Kind::NumberValue(0.25))),
                ("nan".to_owned(), value(Kind::NumberValue(f64::NAN))),
                ("name".to_owned(), value(Kind::StringValue("w".to_owned()))),
                ("on".to_owned(), value(Kind::BoolValue(true))),
                ("none".to_owned(), value(Kind::NullValue(0))),
                (
                    "list".to_owned(),
                    value(Kind::ListValue(prost_types::ListValue {
                        values: vec![value(Kind::NumberValue(-3.0))],
                    })),
                ),
                ("inner".to_owned(), value(Kind::StructValue(nested))),
            ]
            .into(),
        };
        let json = json_from_struct(Some(fields));
        assert_eq!(
            json,
            serde_json::json!({
                "tokens": 262144, "ratio": 0.25, "nan": null, "name": "w", "on": true,
                "none": null, "list": [-3], "inner": {"depth": 2},
            })
        );
        assert_eq!(json_from_struct(None), serde_json::Value::Null);
    }

    #[test]
    fn shm_namespace_id_needs_a_non_empty_string() {
        let cases = [
            (
                serde_json::json!({"shm_namespace_id": "boot:42"}),
                Some("boot:42"),
            ),
            (serde_json::json!({"shm_namespace_id": ""}), None),
            (serde_json::json!({"shm_namespace_id": 7}), None),
            (serde_json::json!({}), None),
            (serde_json::Value::Null, None),
        ];
        for (info, expected) in cases {
            assert_eq!(shm_namespace_id(&info).as_deref(), expected, "{info}");
        }
    }

    #[test]
    fn top_logprobs_pair_values_with_ids() {
        let probs = log_probs(
            vec![-0.5, -1.0],
            vec![7, 8],
            [(vec![-0.5, -2.0], vec![7, 9]), (vec![-1.0], vec![8])],
        );
        assert_eq!(probs.top, vec![vec![(-0.5, 7), (-2.0, 9)], vec![(-1.0, 8)]]);
        assert_eq!(probs.token_ids, [7, 8]);
    }

    #[test]
    fn ranks_sum_counts_and_average_ratios() {
        let rank = |running, usage, hit| RankLoad {
            running_requests: running,
            waiting_requests: 1,
            max_running_requests: 16,
            used_tokens: 100,
            max_total_tokens: 1000,
            waiting_uncached_tokens: 5,
            token_usage: usage,
            gen_throughput: 10.0,
            cache_hit_rate: hit,
        };
        let load = sum_ranks(0, [rank(2, 0.2, 0.5), rank(3, 0.4, 0.0)]);
        assert_eq!(load.running_requests, 5);
        assert_eq!(load.waiting_requests, 2);
        assert_eq!(load.max_running_requests, 32);
        assert_eq!(load.used_tokens, 200);
        assert_eq!(load.max_total_tokens, 2000);
        assert_eq!(load.waiting_uncached_tokens, 10);
        assert!((load.gen_throughput - 20.0).abs() < 1e-9);
        assert!((load.token_usage - 0.3).abs() < 1e-9);
        assert!((load.cache_hit_rate - 0.25).abs() < 1e-9);
        assert_eq!(load.dp_rank_count, 2, "counted when the worker says 0");
        assert_eq!(sum_ranks(8, [rank(1, 0.1, 0.1)]).dp_rank_count, 8);
        assert_eq!(sum_ranks(0, []), Load::default());

        let huge = RankLoad {
            running_requests: i32::MAX,
            ..rank(0, 0.0, 0.0)
        };
        assert_eq!(sum_ranks(0, [huge, huge]).running_requests, i32::MAX);
    }
}
