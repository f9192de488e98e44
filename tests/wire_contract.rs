//! Pins smg's engine protocols to the wire contract in the team's `wire.md`.
//!
//! Real TokenSpeed and SGLang workers accept only the exact field numbers,
//! types and method paths of their own protocols; they are not built from our
//! `proto/` files. A renumbered field would still round-trip through our own
//! generated code, so nothing here decodes what it encoded with the same
//! types. Instead:
//!
//! * `descriptors_match_wire_md` compiles `proto/` with `protox` and compares
//!   every package, service, method, message and field against a table typed
//!   out by hand from `wire.md` (never generated from the protos). Messages
//!   that `wire.md` does not tabulate are pinned as they are today, as a
//!   regression guard, and marked so in failure messages.
//! * The trap tests encode the generated Rust types with `prost` and read the
//!   bytes back with a small hand-written protobuf wire reader (field numbers
//!   and wire types only), or compare them with byte fixtures typed out by
//!   hand, for the places where the two engines disagree (`wire.md` "Traps").

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use smg::proto::{
    common, sglang_scheduler as sg, tokenspeed_encoder as tse, tokenspeed_scheduler as ts,
};

// ---------------------------------------------------------------------------
// A hand-written protobuf wire reader (and a tiny writer for response fixtures).
// ---------------------------------------------------------------------------

/// Protobuf wire types (the low three bits of a tag).
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// One decoded value, by wire type.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// One field occurrence on the wire: its number, wire type and raw value.
#[derive(Debug, Clone, Copy, PartialEq)]
struct WireField<'a> {
    number: u32,
    wire_type: u8,
    value: Value<'a>,
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for index in 0..10 {
        let byte = *buf
            .get(*pos)
            .ok_or_else(|| format!("truncated varint at byte {pos}"))?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(format!("varint longer than 10 bytes ending at byte {pos}"))
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Result<&'a [u8], String> {
    let end = pos
        .checked_add(len)
        .filter(|end| *end <= buf.len())
        .ok_or_else(|| format!("{len} bytes at byte {pos} run past the end ({})", buf.len()))?;
    let out = &buf[*pos..end];
    *pos = end;
    Ok(out)
}

/// Splits one message's bytes into its top-level fields, in wire order.
fn parse(buf: &[u8]) -> Result<Vec<WireField<'_>>, String> {
    let mut pos = 0;
    let mut fields = Vec::new();
    while pos < buf.len() {
        let tag = read_varint(buf, &mut pos)?;
        let number = u32::try_from(tag >> 3).map_err(|e| format!("field number: {e}"))?;
        if number == 0 {
            return Err(format!("field number 0 in tag {tag:#x}"));
        }
        let wire_type = u8::try_from(tag & 7).map_err(|e| format!("wire type: {e}"))?;
        let value = match wire_type {
            VARINT => Value::Varint(read_varint(buf, &mut pos)?),
            I64 => {
                let raw: [u8; 8] = take(buf, &mut pos, 8)?
                    .try_into()
                    .map_err(|_| "fixed64 is not 8 bytes".to_string())?;
                Value::Fixed64(u64::from_le_bytes(raw))
            }
            LEN => {
                let len = read_varint(buf, &mut pos)?;
                let len = usize::try_from(len).map_err(|e| format!("length: {e}"))?;
                Value::Bytes(take(buf, &mut pos, len)?)
            }
            I32 => {
                let raw: [u8; 4] = take(buf, &mut pos, 4)?
                    .try_into()
                    .map_err(|_| "fixed32 is not 4 bytes".to_string())?;
                Value::Fixed32(u32::from_le_bytes(raw))
            }
            other => return Err(format!("unsupported wire type {other} for field {number}")),
        };
        fields.push(WireField {
            number,
            wire_type,
            value,
        });
    }
    Ok(fields)
}

/// Decodes a packed repeated varint payload.
fn packed_varints(buf: &[u8]) -> Result<Vec<u64>, String> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        out.push(read_varint(buf, &mut pos)?);
    }
    Ok(out)
}

fn parse_ok(buf: &[u8]) -> Vec<WireField<'_>> {
    parse(buf).expect("our encoder must produce well-formed protobuf")
}

/// The (field number, wire type) pairs present, sorted by field number.
fn layout(fields: &[WireField<'_>]) -> Vec<(u32, u8)> {
    let mut out: Vec<(u32, u8)> = fields.iter().map(|f| (f.number, f.wire_type)).collect();
    out.sort_unstable();
    out
}

/// The only occurrence of field `number`; panics if it is absent or repeated.
fn single<'a>(fields: &[WireField<'a>], number: u32, what: &str) -> WireField<'a> {
    let hits: Vec<&WireField<'a>> = fields.iter().filter(|f| f.number == number).collect();
    assert_eq!(
        hits.len(),
        1,
        "{what}: expected field {number} exactly once, wire has {:?}",
        layout(fields)
    );
    *hits[0]
}

fn varint_at(fields: &[WireField<'_>], number: u32, what: &str) -> u64 {
    match single(fields, number, what) {
        WireField {
            wire_type: VARINT,
            value: Value::Varint(v),
            ..
        } => v,
        other => panic!("{what}: field {number} must be a varint (wire type 0), got {other:?}"),
    }
}

fn bytes_at<'a>(fields: &[WireField<'a>], number: u32, what: &str) -> &'a [u8] {
    match single(fields, number, what) {
        WireField {
            wire_type: LEN,
            value: Value::Bytes(b),
            ..
        } => b,
        other => {
            panic!("{what}: field {number} must be length-delimited (wire type 2), got {other:?}")
        }
    }
}

fn fixed32_at(fields: &[WireField<'_>], number: u32, what: &str) -> u32 {
    match single(fields, number, what) {
        WireField {
            wire_type: I32,
            value: Value::Fixed32(v),
            ..
        } => v,
        other => panic!("{what}: field {number} must be 32-bit (wire type 5), got {other:?}"),
    }
}

fn packed_at(fields: &[WireField<'_>], number: u32, what: &str) -> Vec<u64> {
    packed_varints(bytes_at(fields, number, what))
        .expect("a packed repeated field must hold whole varints")
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_tag(out: &mut Vec<u8>, number: u32, wire_type: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

fn put_len(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    put_tag(out, number, LEN);
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

fn put_uint(out: &mut Vec<u8>, number: u32, value: u64) {
    put_tag(out, number, VARINT);
    put_varint(out, value);
}

#[test]
fn wire_reader_decodes_known_encodings() {
    // The protobuf documentation's examples: field 1 = 150, field 2 = "testing".
    let fields = parse(&[
        0x08, 0x96, 0x01, 0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g',
    ])
    .expect("valid message");
    assert_eq!(layout(&fields), vec![(1, VARINT), (2, LEN)]);
    assert_eq!(varint_at(&fields, 1, "doc example"), 150);
    assert_eq!(bytes_at(&fields, 2, "doc example"), b"testing");
    // 64-bit and 32-bit values are little-endian.
    let fields =
        parse(&[0x19, 1, 0, 0, 0, 0, 0, 0, 0x80, 0x25, 0, 0, 0x80, 0x3f]).expect("valid message");
    assert_eq!(
        fields,
        vec![
            WireField {
                number: 3,
                wire_type: I64,
                value: Value::Fixed64(0x8000_0000_0000_0001),
            },
            WireField {
                number: 4,
                wire_type: I32,
                value: Value::Fixed32(1.0f32.to_bits()),
            },
        ]
    );
    // Truncated input, a group wire type and field number 0 are rejected.
    assert!(
        parse(&[0x12, 0x05, b'a']).is_err(),
        "truncated bytes accepted"
    );
    assert!(parse(&[0x08, 0x96]).is_err(), "truncated varint accepted");
    assert!(parse(&[0x0b]).is_err(), "group wire type accepted");
    assert!(parse(&[0x00, 0x00]).is_err(), "field number 0 accepted");
    let mut written = Vec::new();
    put_uint(&mut written, 17, 1);
    assert_eq!(
        written,
        [0x88, 0x01, 0x01],
        "tag of field 17 is a two-byte varint"
    );
}

// ---------------------------------------------------------------------------
// The contract table, typed out by hand from wire.md.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Card {
    /// proto3 implicit presence (or a singular message field).
    Single,
    /// proto3 `optional` (`proto3_optional` in the descriptor).
    Optional,
    /// `repeated` (maps are repeated entry messages on the wire).
    Repeated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FieldSpec {
    number: i32,
    name: &'static str,
    /// Scalar name, message full name, `enum <full name>` or `map<K,V>`.
    ty: &'static str,
    card: Card,
    /// The (non-synthetic) oneof the field belongs to.
    oneof: Option<&'static str>,
}

const fn one(number: i32, name: &'static str, ty: &'static str) -> FieldSpec {
    FieldSpec {
        number,
        name,
        ty,
        card: Card::Single,
        oneof: None,
    }
}

const fn opt(number: i32, name: &'static str, ty: &'static str) -> FieldSpec {
    FieldSpec {
        number,
        name,
        ty,
        card: Card::Optional,
        oneof: None,
    }
}

const fn rep(number: i32, name: &'static str, ty: &'static str) -> FieldSpec {
    FieldSpec {
        number,
        name,
        ty,
        card: Card::Repeated,
        oneof: None,
    }
}

const fn oneof(
    group: &'static str,
    number: i32,
    name: &'static str,
    ty: &'static str,
) -> FieldSpec {
    FieldSpec {
        number,
        name,
        ty,
        card: Card::Single,
        oneof: Some(group),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Tabulated in wire.md: the engines' truth.
    WireMd,
    /// Not tabulated in wire.md: pinned as the proto has it today, to catch
    /// accidental renumbering.
    Snapshot,
}

#[derive(Debug, Clone, Copy)]
struct MessageSpec {
    name: &'static str,
    source: Source,
    fields: &'static [FieldSpec],
    reserved: &'static [i32],
}

const fn wire(name: &'static str, fields: &'static [FieldSpec]) -> MessageSpec {
    MessageSpec {
        name,
        source: Source::WireMd,
        fields,
        reserved: &[],
    }
}

const fn snap(name: &'static str, fields: &'static [FieldSpec]) -> MessageSpec {
    MessageSpec {
        name,
        source: Source::Snapshot,
        fields,
        reserved: &[],
    }
}

impl MessageSpec {
    const fn reserved(self, reserved: &'static [i32]) -> Self {
        MessageSpec { reserved, ..self }
    }
}

const FILES: &[(&str, &str)] = &[
    ("common.proto", "smg.grpc.common"),
    ("tokenspeed_scheduler.proto", "tokenspeed.grpc.scheduler"),
    ("tokenspeed_encoder.proto", "tokenspeed.grpc.encoder"),
    ("sglang_scheduler.proto", "sglang.grpc.scheduler"),
];

/// Enums: full name and (value name, number) pairs.
const ENUMS: &[(&str, &[(&str, i32)])] = &[(
    "smg.grpc.common.Modality",
    &[
        ("MODALITY_UNSPECIFIED", 0),
        ("IMAGE", 1),
        ("AUDIO", 2),
        ("VIDEO", 3),
    ],
)];

const MESSAGES: &[MessageSpec] = &[
    // ---- smg.grpc.common ----
    wire(
        "smg.grpc.common.ShmHandle",
        &[
            one(1, "name", "string"),
            one(2, "offset", "uint64"),
            one(3, "nbytes", "uint64"),
            one(4, "owner_id", "string"),
        ],
    ),
    wire(
        "smg.grpc.common.RemoteTensorHandle",
        &[
            one(1, "transport", "string"),
            one(2, "descriptor", "bytes"),
            one(3, "nbytes", "uint64"),
        ],
    ),
    wire("smg.grpc.common.GetTokenizerRequest", &[]),
    wire(
        "smg.grpc.common.GetTokenizerChunk",
        &[one(1, "data", "bytes"), one(2, "sha256", "string")],
    ),
    wire(
        "smg.grpc.common.SubscribeKvEventsRequest",
        &[one(1, "start_sequence_number", "uint64")],
    ),
    wire(
        "smg.grpc.common.KvEventBatch",
        &[
            one(1, "sequence_number", "uint64"),
            one(2, "timestamp", "double"),
            rep(3, "events", "smg.grpc.common.KvCacheEvent"),
            opt(4, "dp_rank", "int32"),
        ],
    ),
    wire(
        "smg.grpc.common.KvCacheEvent",
        &[
            one(1, "event_id", "uint64"),
            oneof("data", 2, "stored", "smg.grpc.common.KvBlocksStored"),
            oneof("data", 3, "removed", "smg.grpc.common.KvBlocksRemoved"),
            oneof("data", 4, "cleared", "smg.grpc.common.KvCacheCleared"),
        ],
    ),
    wire(
        "smg.grpc.common.KvBlocksStored",
        &[
            rep(1, "blocks", "smg.grpc.common.KvBlock"),
            opt(2, "parent_block_hash", "int64"),
        ],
    ),
    wire(
        "smg.grpc.common.KvBlock",
        &[
            one(1, "block_hash", "int64"),
            rep(2, "token_ids", "uint32"),
            one(3, "block_size", "int32"),
            opt(4, "lora_id", "int64"),
            opt(5, "cache_level", "int32"),
        ],
    ),
    wire(
        "smg.grpc.common.KvBlocksRemoved",
        &[
            rep(1, "block_hashes", "int64"),
            opt(2, "cache_level", "int32"),
        ],
    ),
    wire("smg.grpc.common.KvCacheCleared", &[]),
    wire(
        "smg.grpc.common.FlushCacheRequest",
        &[one(1, "timeout_s", "float")],
    ),
    wire(
        "smg.grpc.common.FlushCacheResponse",
        &[one(1, "success", "bool"), one(2, "message", "string")],
    ),
    // ---- tokenspeed.grpc.scheduler ----
    wire(
        "tokenspeed.grpc.scheduler.GenerateRequest",
        &[
            one(1, "request_id", "string"),
            one(2, "tokenized", "tokenspeed.grpc.scheduler.TokenizedInput"),
            one(
                3,
                "sampling_params",
                "tokenspeed.grpc.scheduler.SamplingParams",
            ),
            one(4, "return_logprob", "bool"),
            opt(5, "logprob_start_len", "int32"),
            one(6, "top_logprobs_num", "int32"),
            rep(7, "token_ids_logprob", "uint32"),
            one(8, "stream", "bool"),
            one(9, "mm_inputs", "tokenspeed.grpc.scheduler.MultimodalInputs"),
            opt(
                10,
                "encode_bootstrap_info",
                "tokenspeed.grpc.scheduler.EncodeBootstrapInfo",
            ),
            opt(
                11,
                "kv_bootstrap_info",
                "tokenspeed.grpc.scheduler.KvBootstrapInfo",
            ),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.TokenizedInput",
        &[
            rep(1, "input_ids", "uint32"),
            one(2, "original_text", "string"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.KvBootstrapInfo",
        &[
            one(1, "bootstrap_host", "string"),
            one(2, "bootstrap_port", "int32"),
            one(3, "bootstrap_room", "int64"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.EncodeBootstrapInfo",
        &[rep(
            1,
            "items",
            "tokenspeed.grpc.scheduler.EncodeItemBootstrapInfo",
        )],
    ),
    wire(
        "tokenspeed.grpc.scheduler.EncodeItemBootstrapInfo",
        &[
            one(1, "item_index", "uint32"),
            one(2, "bootstrap_host", "string"),
            one(3, "bootstrap_port", "int32"),
            one(4, "bootstrap_room", "int64"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.SamplingParams",
        &[
            opt(1, "temperature", "float"),
            opt(2, "top_p", "float"),
            opt(3, "top_k", "int32"),
            opt(4, "min_p", "float"),
            opt(5, "frequency_penalty", "float"),
            opt(6, "presence_penalty", "float"),
            opt(7, "repetition_penalty", "float"),
            opt(8, "max_new_tokens", "uint32"),
            one(9, "min_new_tokens", "uint32"),
            rep(10, "stop", "string"),
            rep(11, "stop_token_ids", "uint32"),
            one(12, "ignore_eos", "bool"),
            one(13, "skip_special_tokens", "bool"),
            one(14, "spaces_between_special_tokens", "bool"),
            one(15, "n", "uint32"),
            rep(16, "logit_bias", "map<string,float>"),
            oneof("constraint", 17, "regex", "string"),
            oneof("constraint", 18, "json_schema", "string"),
            oneof("constraint", 19, "ebnf_grammar", "string"),
            oneof("constraint", 20, "structural_tag", "string"),
            one(21, "custom_params", "google.protobuf.Struct"),
            one(22, "no_stop_trim", "bool"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.TensorData",
        &[
            rep(1, "shape", "uint32"),
            one(2, "dtype", "string"),
            oneof("payload", 3, "inline", "bytes"),
            oneof("payload", 4, "shm", "smg.grpc.common.ShmHandle"),
            oneof("payload", 5, "remote", "smg.grpc.common.RemoteTensorHandle"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.PlaceholderRange",
        &[one(1, "offset", "uint32"), one(2, "length", "uint32")],
    ),
    wire(
        "tokenspeed.grpc.scheduler.MultimodalItem",
        &[
            one(1, "modality", "enum smg.grpc.common.Modality"),
            one(2, "content_hash", "bytes"),
            one(3, "encoder_input", "tokenspeed.grpc.scheduler.TensorData"),
            rep(
                4,
                "model_specific_tensors",
                "map<string,tokenspeed.grpc.scheduler.TensorData>",
            ),
            rep(
                5,
                "placeholders",
                "tokenspeed.grpc.scheduler.PlaceholderRange",
            ),
            opt(6, "placeholder_token_id", "uint32"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.MultimodalInputs",
        &[rep(1, "items", "tokenspeed.grpc.scheduler.MultimodalItem")],
    ),
    wire(
        "tokenspeed.grpc.scheduler.GenerateResponse",
        &[
            one(1, "request_id", "string"),
            oneof(
                "response",
                2,
                "chunk",
                "tokenspeed.grpc.scheduler.GenerateStreamChunk",
            ),
            oneof(
                "response",
                3,
                "complete",
                "tokenspeed.grpc.scheduler.GenerateComplete",
            ),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.GenerateStreamChunk",
        &[
            rep(1, "token_ids", "uint32"),
            one(2, "prompt_tokens", "uint32"),
            one(3, "completion_tokens", "uint32"),
            one(4, "cached_tokens", "uint32"),
            one(
                5,
                "output_logprobs",
                "tokenspeed.grpc.scheduler.OutputLogProbs",
            ),
            one(6, "index", "uint32"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.GenerateComplete",
        &[
            rep(1, "output_ids", "uint32"),
            one(2, "finish_reason", "string"),
            one(3, "prompt_tokens", "uint32"),
            one(4, "completion_tokens", "uint32"),
            one(5, "cached_tokens", "uint32"),
            one(
                6,
                "output_logprobs",
                "tokenspeed.grpc.scheduler.OutputLogProbs",
            ),
            oneof("matched_stop", 7, "matched_token_id", "uint32"),
            oneof("matched_stop", 8, "matched_stop_str", "string"),
            one(9, "index", "uint32"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.OutputLogProbs",
        &[
            rep(1, "token_logprobs", "float"),
            rep(2, "token_ids", "uint32"),
            rep(3, "top_logprobs", "tokenspeed.grpc.scheduler.TopLogProbs"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.TopLogProbs",
        &[rep(1, "values", "float"), rep(2, "token_ids", "uint32")],
    ),
    wire("tokenspeed.grpc.scheduler.HealthCheckRequest", &[]),
    wire(
        "tokenspeed.grpc.scheduler.HealthCheckResponse",
        &[one(1, "healthy", "bool"), one(2, "message", "string")],
    ),
    wire(
        "tokenspeed.grpc.scheduler.AbortRequest",
        &[one(1, "request_id", "string"), one(2, "reason", "string")],
    ),
    wire(
        "tokenspeed.grpc.scheduler.AbortResponse",
        &[one(1, "success", "bool"), one(2, "message", "string")],
    ),
    snap("tokenspeed.grpc.scheduler.GetModelInfoRequest", &[]),
    wire(
        "tokenspeed.grpc.scheduler.GetModelInfoResponse",
        &[
            one(1, "model_path", "string"),
            one(2, "tokenizer_path", "string"),
            one(3, "served_model_name", "string"),
            one(4, "model_type", "string"),
            rep(5, "architectures", "string"),
            one(6, "max_context_length", "int32"),
            one(7, "max_req_input_len", "int32"),
            one(8, "vocab_size", "int32"),
            rep(9, "eos_token_ids", "int32"),
            one(10, "pad_token_id", "int32"),
            one(11, "bos_token_id", "int32"),
            one(12, "weight_version", "string"),
            one(13, "default_sampling_params_json", "string"),
            one(14, "supports_vision", "bool"),
            one(15, "supports_multimodal", "bool"),
            rep(16, "supported_modalities", "enum smg.grpc.common.Modality"),
            one(17, "model_dtype", "string"),
            one(18, "multimodal_encoder_dtype", "string"),
        ],
    ),
    snap("tokenspeed.grpc.scheduler.GetServerInfoRequest", &[]),
    wire(
        "tokenspeed.grpc.scheduler.GetServerInfoResponse",
        &[
            one(1, "server_args", "google.protobuf.Struct"),
            one(2, "scheduler_info", "google.protobuf.Struct"),
            one(3, "active_requests", "int32"),
            one(4, "is_paused", "bool"),
            one(5, "uptime_seconds", "double"),
            one(6, "max_total_num_tokens", "int32"),
            one(7, "tokenspeed_version", "string"),
            one(8, "start_time", "google.protobuf.Timestamp"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.GetLoadsRequest",
        &[opt(1, "dp_rank", "int32"), rep(2, "include", "string")],
    ),
    wire(
        "tokenspeed.grpc.scheduler.GetLoadsResponse",
        &[
            one(1, "timestamp", "string"),
            one(2, "version", "string"),
            one(3, "dp_rank_count", "int32"),
            rep(4, "loads", "tokenspeed.grpc.scheduler.SchedulerLoad"),
            one(5, "aggregate", "tokenspeed.grpc.scheduler.AggregateMetrics"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.SchedulerLoad",
        &[
            one(1, "dp_rank", "int32"),
            one(2, "num_running_reqs", "int32"),
            one(3, "num_waiting_reqs", "int32"),
            one(4, "num_total_reqs", "int32"),
            one(5, "num_used_tokens", "int32"),
            one(6, "max_total_num_tokens", "int32"),
            one(7, "max_running_requests", "int32"),
            one(8, "token_usage", "double"),
            one(9, "gen_throughput", "double"),
            one(10, "cache_hit_rate", "double"),
            one(11, "utilization", "double"),
            opt(12, "memory", "tokenspeed.grpc.scheduler.MemoryMetrics"),
            opt(13, "queues", "tokenspeed.grpc.scheduler.QueueMetrics"),
            one(14, "num_waiting_uncached_tokens", "int32"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.MemoryMetrics",
        &[
            one(1, "weight_gb", "double"),
            one(2, "kv_cache_gb", "double"),
            one(3, "graph_gb", "double"),
            one(4, "token_capacity", "int32"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.QueueMetrics",
        &[
            one(1, "waiting", "int32"),
            one(2, "grammar", "int32"),
            one(3, "paused", "int32"),
            one(4, "retracted", "int32"),
        ],
    ),
    wire(
        "tokenspeed.grpc.scheduler.AggregateMetrics",
        &[
            one(1, "total_running_reqs", "int32"),
            one(2, "total_waiting_reqs", "int32"),
            one(3, "total_reqs", "int32"),
            one(4, "avg_token_usage", "double"),
            one(5, "avg_throughput", "double"),
            one(6, "avg_utilization", "double"),
        ],
    ),
    // ---- tokenspeed.grpc.encoder ----
    wire(
        "tokenspeed.grpc.encoder.EncodeRequest",
        &[
            one(1, "request_id", "string"),
            one(2, "mm_inputs", "tokenspeed.grpc.scheduler.MultimodalInputs"),
            rep(3, "items", "tokenspeed.grpc.encoder.EncodeItemAssignment"),
        ],
    ),
    wire(
        "tokenspeed.grpc.encoder.EncodeItemAssignment",
        &[one(1, "bootstrap_room", "int64")],
    ),
    wire(
        "tokenspeed.grpc.encoder.EncodeResponse",
        &[one(1, "accepted", "bool")],
    ),
    // ---- sglang.grpc.scheduler (wire.md) ----
    wire(
        "sglang.grpc.scheduler.GenerateRequest",
        &[
            one(1, "request_id", "string"),
            one(2, "tokenized", "sglang.grpc.scheduler.TokenizedInput"),
            one(3, "mm_inputs", "sglang.grpc.scheduler.MultimodalInputs"),
            one(4, "sampling_params", "sglang.grpc.scheduler.SamplingParams"),
            one(5, "return_logprob", "bool"),
            one(6, "logprob_start_len", "int32"),
            one(7, "top_logprobs_num", "int32"),
            rep(8, "token_ids_logprob", "uint32"),
            one(9, "return_hidden_states", "bool"),
            one(
                10,
                "disaggregated_params",
                "sglang.grpc.scheduler.DisaggregatedParams",
            ),
            one(11, "custom_logit_processor", "string"),
            one(12, "timestamp", "google.protobuf.Timestamp"),
            one(13, "log_metrics", "bool"),
            rep(14, "input_embeds", "float"),
            one(15, "lora_id", "string"),
            one(16, "data_parallel_rank", "int32"),
            one(17, "stream", "bool"),
            one(18, "require_reasoning", "bool"),
        ],
    ),
    wire(
        "sglang.grpc.scheduler.TokenizedInput",
        &[
            one(1, "original_text", "string"),
            rep(2, "input_ids", "uint32"),
        ],
    ),
    wire(
        "sglang.grpc.scheduler.DisaggregatedParams",
        &[
            one(1, "bootstrap_host", "string"),
            one(2, "bootstrap_port", "int32"),
            one(3, "bootstrap_room", "int32"),
        ],
    ),
    // wire.md does not spell out the constraint strings' type for SGLang;
    // they are strings as in TokenSpeed.
    wire(
        "sglang.grpc.scheduler.SamplingParams",
        &[
            one(1, "temperature", "float"),
            one(2, "top_p", "float"),
            one(3, "top_k", "int32"),
            one(4, "min_p", "float"),
            one(5, "frequency_penalty", "float"),
            one(6, "presence_penalty", "float"),
            one(7, "repetition_penalty", "float"),
            opt(8, "max_new_tokens", "uint32"),
            rep(9, "stop", "string"),
            rep(10, "stop_token_ids", "uint32"),
            one(11, "skip_special_tokens", "bool"),
            one(12, "spaces_between_special_tokens", "bool"),
            oneof("constraint", 13, "regex", "string"),
            oneof("constraint", 14, "json_schema", "string"),
            oneof("constraint", 15, "ebnf_grammar", "string"),
            oneof("constraint", 16, "structural_tag", "string"),
            one(17, "n", "uint32"),
            one(18, "min_new_tokens", "uint32"),
            one(19, "ignore_eos", "bool"),
            one(20, "no_stop_trim", "bool"),
            opt(21, "stream_interval", "int32"),
            rep(22, "logit_bias", "map<string,float>"),
            one(23, "custom_params", "google.protobuf.Struct"),
        ],
    ),
    wire(
        "sglang.grpc.scheduler.TensorData",
        &[
            one(1, "data", "bytes"),
            rep(2, "shape", "uint32"),
            one(3, "dtype", "string"),
        ],
    ),
    wire(
        "sglang.grpc.scheduler.MultimodalInputs",
        &[
            rep(1, "image_urls", "string"),
            rep(2, "video_urls", "string"),
            rep(3, "audio_urls", "string"),
            one(4, "pixel_values", "sglang.grpc.scheduler.TensorData"),
            rep(5, "image_data", "bytes"),
            rep(6, "video_data", "bytes"),
            rep(7, "audio_data", "bytes"),
            rep(8, "modalities", "string"),
            rep(
                9,
                "model_specific_tensors",
                "map<string,sglang.grpc.scheduler.TensorData>",
            ),
            opt(10, "im_token_id", "uint32"),
            rep(
                11,
                "mm_placeholders",
                "sglang.grpc.scheduler.PlaceholderRange",
            ),
        ],
    ),
    // wire.md gives names and numbers for the three response messages; the
    // types (and the oneof's name, which wire.md leaves unnamed) are the
    // proto's, as it stood when this table was written.
    wire(
        "sglang.grpc.scheduler.GenerateResponse",
        &[
            one(1, "request_id", "string"),
            oneof(
                "response",
                2,
                "chunk",
                "sglang.grpc.scheduler.GenerateStreamChunk",
            ),
            oneof(
                "response",
                3,
                "complete",
                "sglang.grpc.scheduler.GenerateComplete",
            ),
        ],
    )
    .reserved(&[4]),
    wire(
        "sglang.grpc.scheduler.GenerateStreamChunk",
        &[
            rep(1, "token_ids", "uint32"),
            one(2, "prompt_tokens", "uint32"),
            one(3, "completion_tokens", "uint32"),
            one(4, "cached_tokens", "uint32"),
            one(5, "output_logprobs", "sglang.grpc.scheduler.OutputLogProbs"),
            rep(6, "hidden_states", "float"),
            one(7, "input_logprobs", "sglang.grpc.scheduler.InputLogProbs"),
            one(8, "index", "uint32"),
            one(9, "reasoning_tokens", "uint32"),
        ],
    ),
    wire(
        "sglang.grpc.scheduler.GenerateComplete",
        &[
            rep(1, "output_ids", "uint32"),
            one(2, "finish_reason", "string"),
            one(3, "prompt_tokens", "uint32"),
            one(4, "completion_tokens", "uint32"),
            one(5, "cached_tokens", "uint32"),
            one(6, "output_logprobs", "sglang.grpc.scheduler.OutputLogProbs"),
            rep(7, "all_hidden_states", "sglang.grpc.scheduler.HiddenStates"),
            oneof("matched_stop", 8, "matched_token_id", "uint32"),
            oneof("matched_stop", 9, "matched_stop_str", "string"),
            one(10, "input_logprobs", "sglang.grpc.scheduler.InputLogProbs"),
            one(11, "index", "uint32"),
            one(12, "reasoning_tokens", "uint32"),
        ],
    ),
    // ---- sglang.grpc.scheduler (not in wire.md: regression guard) ----
    snap(
        "sglang.grpc.scheduler.PlaceholderRange",
        &[one(1, "offset", "uint32"), one(2, "length", "uint32")],
    ),
    snap(
        "sglang.grpc.scheduler.OutputLogProbs",
        &[
            rep(1, "token_logprobs", "float"),
            rep(2, "token_ids", "uint32"),
            rep(3, "top_logprobs", "sglang.grpc.scheduler.TopLogProbs"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.InputLogProbs",
        &[
            rep(
                1,
                "token_logprobs",
                "sglang.grpc.scheduler.InputTokenLogProb",
            ),
            rep(2, "token_ids", "uint32"),
            rep(3, "top_logprobs", "sglang.grpc.scheduler.TopLogProbs"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.InputTokenLogProb",
        &[opt(1, "value", "float")],
    ),
    snap(
        "sglang.grpc.scheduler.TopLogProbs",
        &[rep(1, "values", "float"), rep(2, "token_ids", "uint32")],
    ),
    snap(
        "sglang.grpc.scheduler.HiddenStates",
        &[
            rep(1, "values", "float"),
            one(2, "layer", "int32"),
            one(3, "position", "int32"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.EmbedRequest",
        &[
            one(1, "request_id", "string"),
            one(2, "tokenized", "sglang.grpc.scheduler.TokenizedInput"),
            one(4, "mm_inputs", "sglang.grpc.scheduler.MultimodalInputs"),
            one(5, "sampling_params", "sglang.grpc.scheduler.SamplingParams"),
            rep(7, "token_type_ids", "int32"),
            one(8, "data_parallel_rank", "int32"),
            one(9, "is_cross_encoder", "bool"),
            rep(10, "texts", "string"),
        ],
    )
    .reserved(&[6]),
    snap(
        "sglang.grpc.scheduler.EmbedResponse",
        &[
            one(4, "embedding_dim", "uint32"),
            rep(5, "embedding", "float"),
            one(6, "prompt_tokens", "uint32"),
        ],
    )
    .reserved(&[1, 2, 3]),
    snap("sglang.grpc.scheduler.HealthCheckRequest", &[]),
    snap(
        "sglang.grpc.scheduler.HealthCheckResponse",
        &[one(1, "healthy", "bool"), one(2, "message", "string")],
    ),
    snap(
        "sglang.grpc.scheduler.AbortRequest",
        &[one(1, "request_id", "string"), one(2, "reason", "string")],
    ),
    snap(
        "sglang.grpc.scheduler.AbortResponse",
        &[one(1, "success", "bool"), one(2, "message", "string")],
    ),
    snap("sglang.grpc.scheduler.GetModelInfoRequest", &[]),
    snap(
        "sglang.grpc.scheduler.GetModelInfoResponse",
        &[
            one(1, "model_path", "string"),
            one(2, "tokenizer_path", "string"),
            one(3, "is_generation", "bool"),
            one(4, "preferred_sampling_params", "string"),
            one(5, "weight_version", "string"),
            one(6, "served_model_name", "string"),
            one(7, "max_context_length", "int32"),
            one(8, "vocab_size", "int32"),
            one(9, "supports_vision", "bool"),
            one(10, "model_type", "string"),
            rep(11, "eos_token_ids", "int32"),
            one(12, "pad_token_id", "int32"),
            one(13, "bos_token_id", "int32"),
            one(14, "max_req_input_len", "int32"),
            rep(15, "architectures", "string"),
            one(16, "id2label_json", "string"),
            one(17, "num_labels", "int32"),
        ],
    ),
    snap("sglang.grpc.scheduler.GetServerInfoRequest", &[]),
    snap(
        "sglang.grpc.scheduler.GetServerInfoResponse",
        &[
            one(1, "server_args", "google.protobuf.Struct"),
            one(2, "scheduler_info", "google.protobuf.Struct"),
            one(3, "active_requests", "int32"),
            one(4, "is_paused", "bool"),
            one(5, "last_receive_timestamp", "double"),
            one(6, "uptime_seconds", "double"),
            one(7, "sglang_version", "string"),
            one(8, "server_type", "string"),
            one(9, "start_time", "google.protobuf.Timestamp"),
            one(10, "max_total_num_tokens", "int32"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.GetLoadsRequest",
        &[opt(1, "dp_rank", "int32"), rep(2, "include", "string")],
    ),
    snap(
        "sglang.grpc.scheduler.GetLoadsResponse",
        &[
            one(1, "timestamp", "string"),
            one(2, "version", "string"),
            one(3, "dp_rank_count", "int32"),
            rep(4, "loads", "sglang.grpc.scheduler.SchedulerLoad"),
            one(5, "aggregate", "sglang.grpc.scheduler.AggregateMetrics"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.SchedulerLoad",
        &[
            one(1, "dp_rank", "int32"),
            one(2, "num_running_reqs", "int32"),
            one(3, "num_waiting_reqs", "int32"),
            one(4, "num_total_reqs", "int32"),
            one(5, "num_used_tokens", "int32"),
            one(6, "max_total_num_tokens", "int32"),
            one(7, "token_usage", "double"),
            one(8, "gen_throughput", "double"),
            one(9, "cache_hit_rate", "double"),
            one(10, "utilization", "double"),
            one(11, "max_running_requests", "int32"),
            opt(12, "memory", "sglang.grpc.scheduler.MemoryMetrics"),
            opt(
                13,
                "speculative",
                "sglang.grpc.scheduler.SpeculativeMetrics",
            ),
            opt(14, "lora", "sglang.grpc.scheduler.LoRAMetrics"),
            opt(
                15,
                "disaggregation",
                "sglang.grpc.scheduler.DisaggregationMetrics",
            ),
            opt(16, "queues", "sglang.grpc.scheduler.QueueMetrics"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.MemoryMetrics",
        &[
            one(1, "weight_gb", "double"),
            one(2, "kv_cache_gb", "double"),
            one(3, "graph_gb", "double"),
            one(4, "token_capacity", "int32"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.SpeculativeMetrics",
        &[
            one(1, "accept_length", "double"),
            one(2, "accept_rate", "double"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.LoRAMetrics",
        &[
            one(1, "slots_used", "int32"),
            one(2, "slots_total", "int32"),
            one(3, "utilization", "double"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.DisaggregationMetrics",
        &[
            one(1, "mode", "string"),
            one(2, "prefill_prealloc_queue_reqs", "int32"),
            one(3, "prefill_inflight_queue_reqs", "int32"),
            one(4, "decode_prealloc_queue_reqs", "int32"),
            one(5, "decode_transfer_queue_reqs", "int32"),
            one(6, "decode_retracted_queue_reqs", "int32"),
            one(7, "kv_transfer_speed_gb_s", "double"),
            one(8, "kv_transfer_latency_ms", "double"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.QueueMetrics",
        &[
            one(1, "waiting", "int32"),
            one(2, "grammar", "int32"),
            one(3, "paused", "int32"),
            one(4, "retracted", "int32"),
        ],
    ),
    snap(
        "sglang.grpc.scheduler.AggregateMetrics",
        &[
            one(1, "total_running_reqs", "int32"),
            one(2, "total_waiting_reqs", "int32"),
            one(3, "total_reqs", "int32"),
            one(4, "avg_token_usage", "double"),
            one(5, "avg_throughput", "double"),
            one(6, "avg_utilization", "double"),
        ],
    ),
];

#[derive(Debug, Clone, Copy)]
struct MethodSpec {
    /// The full HTTP/2 path a real engine routes on.
    path: &'static str,
    input: &'static str,
    output: &'static str,
    server_streaming: bool,
}

const fn unary(path: &'static str, input: &'static str, output: &'static str) -> MethodSpec {
    MethodSpec {
        path,
        input,
        output,
        server_streaming: false,
    }
}

const fn stream(path: &'static str, input: &'static str, output: &'static str) -> MethodSpec {
    MethodSpec {
        path,
        input,
        output,
        server_streaming: true,
    }
}

/// (package, service, methods). Nothing is client-streaming.
const SERVICES: &[(&str, &str, &[MethodSpec])] = &[
    (
        "tokenspeed.grpc.scheduler",
        "TokenSpeedScheduler",
        &[
            stream(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate",
                "tokenspeed.grpc.scheduler.GenerateRequest",
                "tokenspeed.grpc.scheduler.GenerateResponse",
            ),
            unary(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/HealthCheck",
                "tokenspeed.grpc.scheduler.HealthCheckRequest",
                "tokenspeed.grpc.scheduler.HealthCheckResponse",
            ),
            unary(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Abort",
                "tokenspeed.grpc.scheduler.AbortRequest",
                "tokenspeed.grpc.scheduler.AbortResponse",
            ),
            unary(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/GetModelInfo",
                "tokenspeed.grpc.scheduler.GetModelInfoRequest",
                "tokenspeed.grpc.scheduler.GetModelInfoResponse",
            ),
            unary(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/GetServerInfo",
                "tokenspeed.grpc.scheduler.GetServerInfoRequest",
                "tokenspeed.grpc.scheduler.GetServerInfoResponse",
            ),
            unary(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/GetLoads",
                "tokenspeed.grpc.scheduler.GetLoadsRequest",
                "tokenspeed.grpc.scheduler.GetLoadsResponse",
            ),
            unary(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/FlushCache",
                "smg.grpc.common.FlushCacheRequest",
                "smg.grpc.common.FlushCacheResponse",
            ),
            stream(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/GetTokenizer",
                "smg.grpc.common.GetTokenizerRequest",
                "smg.grpc.common.GetTokenizerChunk",
            ),
            stream(
                "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/SubscribeKvEvents",
                "smg.grpc.common.SubscribeKvEventsRequest",
                "smg.grpc.common.KvEventBatch",
            ),
        ],
    ),
    (
        "tokenspeed.grpc.encoder",
        "TokenSpeedEncoder",
        &[unary(
            "/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode",
            "tokenspeed.grpc.encoder.EncodeRequest",
            "tokenspeed.grpc.encoder.EncodeResponse",
        )],
    ),
    (
        "sglang.grpc.scheduler",
        "SglangScheduler",
        &[
            stream(
                "/sglang.grpc.scheduler.SglangScheduler/Generate",
                "sglang.grpc.scheduler.GenerateRequest",
                "sglang.grpc.scheduler.GenerateResponse",
            ),
            unary(
                "/sglang.grpc.scheduler.SglangScheduler/Embed",
                "sglang.grpc.scheduler.EmbedRequest",
                "sglang.grpc.scheduler.EmbedResponse",
            ),
            unary(
                "/sglang.grpc.scheduler.SglangScheduler/HealthCheck",
                "sglang.grpc.scheduler.HealthCheckRequest",
                "sglang.grpc.scheduler.HealthCheckResponse",
            ),
            unary(
                "/sglang.grpc.scheduler.SglangScheduler/Abort",
                "sglang.grpc.scheduler.AbortRequest",
                "sglang.grpc.scheduler.AbortResponse",
            ),
            unary(
                "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo",
                "sglang.grpc.scheduler.GetModelInfoRequest",
                "sglang.grpc.scheduler.GetModelInfoResponse",
            ),
            unary(
                "/sglang.grpc.scheduler.SglangScheduler/GetServerInfo",
                "sglang.grpc.scheduler.GetServerInfoRequest",
                "sglang.grpc.scheduler.GetServerInfoResponse",
            ),
            unary(
                "/sglang.grpc.scheduler.SglangScheduler/GetLoads",
                "sglang.grpc.scheduler.GetLoadsRequest",
                "sglang.grpc.scheduler.GetLoadsResponse",
            ),
            unary(
                "/sglang.grpc.scheduler.SglangScheduler/FlushCache",
                "smg.grpc.common.FlushCacheRequest",
                "smg.grpc.common.FlushCacheResponse",
            ),
            stream(
                "/sglang.grpc.scheduler.SglangScheduler/GetTokenizer",
                "smg.grpc.common.GetTokenizerRequest",
                "smg.grpc.common.GetTokenizerChunk",
            ),
            stream(
                "/sglang.grpc.scheduler.SglangScheduler/SubscribeKvEvents",
                "smg.grpc.common.SubscribeKvEventsRequest",
                "smg.grpc.common.KvEventBatch",
            ),
        ],
    ),
];

// ---------------------------------------------------------------------------
// Rendering descriptors into the table's vocabulary.
// ---------------------------------------------------------------------------

fn strip_dot(name: &str) -> &str {
    name.strip_prefix('.').unwrap_or(name)
}

/// A field as the compiled descriptor has it, in the table's vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProtoField {
    number: i32,
    name: String,
    ty: String,
    card: Card,
    oneof: Option<String>,
}

impl ProtoField {
    fn matches(&self, spec: &FieldSpec) -> bool {
        self.number == spec.number
            && self.name == spec.name
            && self.ty == spec.ty
            && self.card == spec.card
            && self.oneof.as_deref() == spec.oneof
    }
}

/// Renders a field's type; `owner` is the message declaring it (map entries
/// are nested in it) and `owner_full` its full name.
fn render_type(field: &FieldDescriptorProto, owner: &DescriptorProto, owner_full: &str) -> String {
    let scalar = match field.r#type() {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
        Type::Group => "group",
        Type::Enum => return format!("enum {}", strip_dot(field.type_name())),
        Type::Message => return render_message_type(field, owner, owner_full),
    };
    scalar.to_string()
}

/// A message type's full name, or `map<K,V>` for a map field.
fn render_message_type(
    field: &FieldDescriptorProto,
    owner: &DescriptorProto,
    owner_full: &str,
) -> String {
    let type_name = strip_dot(field.type_name());
    let entry = owner.nested_type.iter().find(|nested| {
        format!("{owner_full}.{}", nested.name()) == type_name
            && nested.options.as_ref().is_some_and(|o| o.map_entry())
    });
    let Some(entry) = entry else {
        return type_name.to_string();
    };
    let part = |number: i32| {
        entry
            .field
            .iter()
            .find(|f| f.number() == number)
            .map_or_else(|| "?".to_string(), |f| render_type(f, entry, type_name))
    };
    format!("map<{},{}>", part(1), part(2))
}

fn render_field(
    field: &FieldDescriptorProto,
    owner: &DescriptorProto,
    owner_full: &str,
) -> ProtoField {
    let card = if field.label() == Label::Repeated {
        Card::Repeated
    } else if field.proto3_optional() {
        Card::Optional
    } else {
        Card::Single
    };
    // proto3 `optional` fields sit in a synthetic oneof; that is not a oneof
    // on the wire contract's terms.
    let oneof = match (field.proto3_optional(), field.oneof_index) {
        (false, Some(index)) => usize::try_from(index)
            .ok()
            .and_then(|i| owner.oneof_decl.get(i))
            .map(|decl| decl.name().to_string()),
        _ => None,
    };
    ProtoField {
        number: field.number(),
        name: field.name().to_string(),
        ty: render_type(field, owner, owner_full),
        card,
        oneof,
    }
}

fn describe(number: i32, name: &str, ty: &str, card: Card, oneof: Option<&str>) -> String {
    let card = match card {
        Card::Single => "",
        Card::Optional => "optional ",
        Card::Repeated => "repeated ",
    };
    let oneof = oneof.map_or_else(String::new, |o| format!(" (in oneof {o})"));
    format!("{card}{ty} {name} = {number}{oneof}")
}

fn describe_spec(spec: &FieldSpec) -> String {
    describe(spec.number, spec.name, spec.ty, spec.card, spec.oneof)
}

fn describe_proto(field: &ProtoField) -> String {
    describe(
        field.number,
        &field.name,
        &field.ty,
        field.card,
        field.oneof.as_deref(),
    )
}

fn compiled_protos() -> Vec<FileDescriptorProto> {
    let files: Vec<&str> = FILES.iter().map(|(file, _)| *file).collect();
    protox::compile(files, [concat!(env!("CARGO_MANIFEST_DIR"), "/proto")])
        .expect("proto/ must compile with protox")
        .file
}

fn check_message(spec: &MessageSpec, desc: &DescriptorProto, problems: &mut Vec<String>) {
    let origin = match spec.source {
        Source::WireMd => "wire.md",
        Source::Snapshot => "regression guard (not in wire.md)",
    };
    let want: BTreeMap<i32, &FieldSpec> = spec.fields.iter().map(|f| (f.number, f)).collect();
    assert_eq!(
        want.len(),
        spec.fields.len(),
        "the table lists a field number twice in {}",
        spec.name
    );
    let mut seen = BTreeSet::new();
    for field in &desc.field {
        let got = render_field(field, desc, spec.name);
        seen.insert(got.number);
        match want.get(&got.number) {
            None => problems.push(format!(
                "[{origin}] {}: extra field `{}` not in the contract",
                spec.name,
                describe_proto(&got)
            )),
            Some(expected) if !got.matches(expected) => problems.push(format!(
                "[{origin}] {} field {}: expected `{}`, proto has `{}`",
                spec.name,
                got.number,
                describe_spec(expected),
                describe_proto(&got)
            )),
            Some(_) => {}
        }
    }
    for (number, expected) in &want {
        if !seen.contains(number) {
            problems.push(format!(
                "[{origin}] {}: missing field `{}`",
                spec.name,
                describe_spec(expected)
            ));
        }
    }
    let mut reserved = BTreeSet::new();
    for range in &desc.reserved_range {
        // Descriptor ranges are [start, end).
        reserved.extend(range.start()..range.end());
    }
    let want_reserved: BTreeSet<i32> = spec.reserved.iter().copied().collect();
    if reserved != want_reserved {
        problems.push(format!(
            "[{origin}] {}: reserved numbers {reserved:?}, expected {want_reserved:?}",
            spec.name
        ));
    }
    for nested in &desc.nested_type {
        let is_map = nested.options.as_ref().is_some_and(|o| o.map_entry());
        if !is_map {
            problems.push(format!(
                "[{origin}] {}: unexpected nested message {}",
                spec.name,
                nested.name()
            ));
        }
    }
    if !desc.enum_type.is_empty() {
        problems.push(format!("[{origin}] {}: unexpected nested enum", spec.name));
    }
}

#[test]
fn descriptors_match_wire_md() {
    let files = compiled_protos();
    let mut problems = Vec::new();

    // Packages and syntax.
    let mut messages: BTreeMap<String, &DescriptorProto> = BTreeMap::new();
    let mut enums = BTreeMap::new();
    let mut services = BTreeMap::new();
    for (file_name, package) in FILES {
        let Some(file) = files.iter().find(|f| f.name() == *file_name) else {
            problems.push(format!("{file_name}: not in the compiled set"));
            continue;
        };
        if file.package() != *package {
            problems.push(format!(
                "{file_name}: package `{}`, expected `{package}`",
                file.package()
            ));
        }
        if file.syntax() != "proto3" {
            problems.push(format!(
                "{file_name}: syntax `{}`, expected proto3",
                file.syntax()
            ));
        }
        for message in &file.message_type {
            messages.insert(format!("{}.{}", file.package(), message.name()), message);
        }
        for en in &file.enum_type {
            enums.insert(format!("{}.{}", file.package(), en.name()), en);
        }
        for service in &file.service {
            services.insert(
                (file.package().to_string(), service.name().to_string()),
                service,
            );
        }
    }

    // Messages: every one in the table, and nothing the table does not know.
    let table: BTreeSet<&str> = MESSAGES.iter().map(|m| m.name).collect();
    assert_eq!(
        table.len(),
        MESSAGES.len(),
        "the table lists a message twice"
    );
    for spec in MESSAGES {
        match messages.get(spec.name) {
            Some(desc) => check_message(spec, desc, &mut problems),
            None => problems.push(format!("{}: message missing from proto/", spec.name)),
        }
    }
    for name in messages.keys() {
        if !table.contains(name.as_str()) {
            problems.push(format!(
                "{name}: message in proto/ but not in the contract table"
            ));
        }
    }

    // Enums.
    for (name, values) in ENUMS {
        let Some(en) = enums.get(*name) else {
            problems.push(format!("{name}: enum missing from proto/"));
            continue;
        };
        let got: Vec<(&str, i32)> = en.value.iter().map(|v| (v.name(), v.number())).collect();
        if got != *values {
            problems.push(format!("{name}: values {got:?}, expected {values:?}"));
        }
    }
    for name in enums.keys() {
        if !ENUMS.iter().any(|(known, _)| known == name) {
            problems.push(format!(
                "{name}: enum in proto/ but not in the contract table"
            ));
        }
    }

    // Services and methods.
    for (package, service_name, methods) in SERVICES {
        let Some(service) = services.remove(&(package.to_string(), service_name.to_string()))
        else {
            problems.push(format!(
                "service {package}.{service_name} missing from proto/"
            ));
            continue;
        };
        let mut got: BTreeMap<String, _> = service
            .method
            .iter()
            .map(|m| (format!("/{package}.{service_name}/{}", m.name()), m))
            .collect();
        for want in *methods {
            let Some(method) = got.remove(want.path) else {
                problems.push(format!("{}: RPC missing from proto/", want.path));
                continue;
            };
            let input = strip_dot(method.input_type());
            let output = strip_dot(method.output_type());
            if input != want.input || output != want.output {
                problems.push(format!(
                    "{}: ({input}) returns ({output}), expected ({}) returns ({})",
                    want.path, want.input, want.output
                ));
            }
            if method.server_streaming() != want.server_streaming {
                problems.push(format!(
                    "{}: server_streaming = {}, expected {}",
                    want.path,
                    method.server_streaming(),
                    want.server_streaming
                ));
            }
            if method.client_streaming() {
                problems.push(format!("{}: unexpectedly client-streaming", want.path));
            }
        }
        for path in got.keys() {
            problems.push(format!(
                "{path}: RPC in proto/ but not in the contract table"
            ));
        }
    }
    for (package, name) in services.keys() {
        problems.push(format!(
            "service {package}.{name} in proto/ but not in the contract table"
        ));
    }

    assert!(
        problems.is_empty(),
        "proto/ disagrees with the wire contract ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn generated_servers_answer_on_the_contract_service_names() {
    // The generated servers route on these names; a build.rs that compiled
    // other files or renamed packages would change them.
    assert_eq!(
        ts::token_speed_scheduler_server::SERVICE_NAME,
        "tokenspeed.grpc.scheduler.TokenSpeedScheduler"
    );
    assert_eq!(
        tse::token_speed_encoder_server::SERVICE_NAME,
        "tokenspeed.grpc.encoder.TokenSpeedEncoder"
    );
    assert_eq!(
        sg::sglang_scheduler_server::SERVICE_NAME,
        "sglang.grpc.scheduler.SglangScheduler"
    );
}

// ---------------------------------------------------------------------------
// Trap: TokenizedInput numbering is swapped between the engines.
// ---------------------------------------------------------------------------

#[test]
fn tokenized_input_numbering_is_swapped_between_engines() {
    let ids = vec![1u32, 300, 70_000, u32::MAX];
    let want: Vec<u64> = ids.iter().map(|&id| u64::from(id)).collect();

    let tokenspeed = ts::TokenizedInput {
        input_ids: ids.clone(),
        original_text: "hello".to_string(),
    }
    .encode_to_vec();
    let fields = parse_ok(&tokenspeed);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, LEN)],
        "TokenSpeed TokenizedInput"
    );
    assert_eq!(packed_at(&fields, 1, "TokenSpeed input_ids"), want);
    assert_eq!(bytes_at(&fields, 2, "TokenSpeed original_text"), b"hello");

    let sglang = sg::TokenizedInput {
        original_text: "hello".to_string(),
        input_ids: ids,
    }
    .encode_to_vec();
    let fields = parse_ok(&sglang);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, LEN)],
        "SGLang TokenizedInput"
    );
    assert_eq!(bytes_at(&fields, 1, "SGLang original_text"), b"hello");
    assert_eq!(packed_at(&fields, 2, "SGLang input_ids"), want);
}

/// `TokenizedInput { input_ids: [1, 300], original_text: "hi" }`, typed out.
const TOKENSPEED_TOKENIZED_FIXTURE: &[u8] = &[
    0x0a, // field 1 (input_ids), wire type 2
    0x03, // 3 bytes of packed varints
    0x01, // 1
    0xac, 0x02, // 300 = 0b10_0101100
    0x12, // field 2 (original_text), wire type 2
    0x02, // 2 bytes
    b'h', b'i',
];

/// The same input for SGLang: original_text is field 1, input_ids field 2.
const SGLANG_TOKENIZED_FIXTURE: &[u8] = &[
    0x0a, // field 1 (original_text), wire type 2
    0x02, // 2 bytes
    b'h', b'i', //
    0x12, // field 2 (input_ids), wire type 2
    0x03, // 3 bytes of packed varints
    0x01, // 1
    0xac, 0x02, // 300
];

#[test]
fn tokenized_input_matches_hand_written_fixtures() {
    let tokenspeed = ts::TokenizedInput {
        input_ids: vec![1, 300],
        original_text: "hi".to_string(),
    };
    assert_eq!(tokenspeed.encode_to_vec(), TOKENSPEED_TOKENIZED_FIXTURE);
    assert_eq!(
        ts::TokenizedInput::decode(TOKENSPEED_TOKENIZED_FIXTURE).expect("fixture decodes"),
        tokenspeed
    );

    let sglang = sg::TokenizedInput {
        original_text: "hi".to_string(),
        input_ids: vec![1, 300],
    };
    assert_eq!(sglang.encode_to_vec(), SGLANG_TOKENIZED_FIXTURE);
    assert_eq!(
        sg::TokenizedInput::decode(SGLANG_TOKENIZED_FIXTURE).expect("fixture decodes"),
        sglang
    );
}

// ---------------------------------------------------------------------------
// Trap: TensorData numbering differs; only TokenSpeed has shm/remote payloads.
// ---------------------------------------------------------------------------

fn tokenspeed_tensor(payload: ts::tensor_data::Payload) -> Vec<u8> {
    ts::TensorData {
        shape: vec![2, 300],
        dtype: "bfloat16".to_string(),
        payload: Some(payload),
    }
    .encode_to_vec()
}

#[test]
fn tokenspeed_tensor_data_numbering() {
    let inline = tokenspeed_tensor(ts::tensor_data::Payload::Inline(vec![9, 8, 7].into()));
    let fields = parse_ok(&inline);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, LEN), (3, LEN)],
        "inline TensorData"
    );
    assert_eq!(packed_at(&fields, 1, "shape"), vec![2, 300]);
    assert_eq!(bytes_at(&fields, 2, "dtype"), b"bfloat16");
    assert_eq!(bytes_at(&fields, 3, "inline"), [9, 8, 7]);

    let shm = tokenspeed_tensor(ts::tensor_data::Payload::Shm(common::ShmHandle {
        name: "smg-t-1".to_string(),
        offset: 4096,
        nbytes: 1 << 33,
        owner_id: "boot:42".to_string(),
    }));
    let fields = parse_ok(&shm);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, LEN), (4, LEN)],
        "shm TensorData"
    );
    let handle = parse_ok(bytes_at(&fields, 4, "shm"));
    assert_eq!(
        layout(&handle),
        vec![(1, LEN), (2, VARINT), (3, VARINT), (4, LEN)],
        "ShmHandle"
    );
    assert_eq!(bytes_at(&handle, 1, "ShmHandle.name"), b"smg-t-1");
    assert_eq!(varint_at(&handle, 2, "ShmHandle.offset"), 4096);
    assert_eq!(varint_at(&handle, 3, "ShmHandle.nbytes"), 1 << 33);
    assert_eq!(bytes_at(&handle, 4, "ShmHandle.owner_id"), b"boot:42");

    let remote = tokenspeed_tensor(ts::tensor_data::Payload::Remote(
        common::RemoteTensorHandle {
            transport: "rdma".to_string(),
            descriptor: vec![0xde, 0xad].into(),
            nbytes: 1200,
        },
    ));
    let fields = parse_ok(&remote);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, LEN), (5, LEN)],
        "remote TensorData"
    );
    let handle = parse_ok(bytes_at(&fields, 5, "remote"));
    assert_eq!(
        layout(&handle),
        vec![(1, LEN), (2, LEN), (3, VARINT)],
        "RemoteTensorHandle"
    );
    assert_eq!(
        bytes_at(&handle, 1, "RemoteTensorHandle.transport"),
        b"rdma"
    );
    assert_eq!(
        bytes_at(&handle, 2, "RemoteTensorHandle.descriptor"),
        [0xde, 0xad]
    );
    assert_eq!(varint_at(&handle, 3, "RemoteTensorHandle.nbytes"), 1200);
}

#[test]
fn sglang_tensor_data_numbering() {
    let bytes = sg::TensorData {
        data: vec![9, 8, 7].into(),
        shape: vec![2, 300],
        dtype: "float32".to_string(),
    }
    .encode_to_vec();
    let fields = parse_ok(&bytes);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, LEN), (3, LEN)],
        "SGLang TensorData"
    );
    assert_eq!(bytes_at(&fields, 1, "data"), [9, 8, 7]);
    assert_eq!(packed_at(&fields, 2, "shape"), vec![2, 300]);
    assert_eq!(bytes_at(&fields, 3, "dtype"), b"float32");
}

// ---------------------------------------------------------------------------
// Trap: PD rooms are int64 in TokenSpeed and int32 in SGLang.
// ---------------------------------------------------------------------------

/// A TokenSpeed room that does not fit an int32.
const BIG_ROOM: i64 = 0x7fff_ffff_ffff_fff0;
const _: () = assert!(BIG_ROOM > i32::MAX as i64);

#[test]
fn tokenspeed_rooms_are_int64_on_the_wire() {
    let info = ts::KvBootstrapInfo {
        bootstrap_host: "10.0.0.7".to_string(),
        bootstrap_port: 8998,
        bootstrap_room: BIG_ROOM,
    };
    // Compile-time pin: TokenSpeed rooms are int64.
    let _: i64 = info.bootstrap_room;
    let encoded = info.encode_to_vec();
    let fields = parse_ok(&encoded);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, VARINT), (3, VARINT)],
        "KvBootstrapInfo"
    );
    assert_eq!(
        bytes_at(&fields, 1, "KvBootstrapInfo.bootstrap_host"),
        b"10.0.0.7"
    );
    assert_eq!(
        varint_at(&fields, 2, "KvBootstrapInfo.bootstrap_port"),
        8998
    );
    assert_eq!(
        varint_at(&fields, 3, "KvBootstrapInfo.bootstrap_room"),
        0x7fff_ffff_ffff_fff0_u64,
        "a 64-bit room must survive the wire untruncated"
    );

    let item = ts::EncodeItemBootstrapInfo {
        item_index: 2,
        bootstrap_host: "10.0.0.8".to_string(),
        bootstrap_port: 9001,
        bootstrap_room: BIG_ROOM,
    };
    let _: i64 = item.bootstrap_room;
    let encoded = item.encode_to_vec();
    let fields = parse_ok(&encoded);
    assert_eq!(
        layout(&fields),
        vec![(1, VARINT), (2, LEN), (3, VARINT), (4, VARINT)],
        "EncodeItemBootstrapInfo"
    );
    assert_eq!(
        varint_at(&fields, 1, "EncodeItemBootstrapInfo.item_index"),
        2
    );
    assert_eq!(
        bytes_at(&fields, 2, "EncodeItemBootstrapInfo.bootstrap_host"),
        b"10.0.0.8"
    );
    assert_eq!(
        varint_at(&fields, 3, "EncodeItemBootstrapInfo.bootstrap_port"),
        9001
    );
    assert_eq!(
        varint_at(&fields, 4, "EncodeItemBootstrapInfo.bootstrap_room"),
        0x7fff_ffff_ffff_fff0_u64
    );

    let assignment = tse::EncodeItemAssignment {
        bootstrap_room: BIG_ROOM,
    };
    let encoded = assignment.encode_to_vec();
    let fields = parse_ok(&encoded);
    assert_eq!(layout(&fields), vec![(1, VARINT)], "EncodeItemAssignment");
    assert_eq!(
        varint_at(&fields, 1, "EncodeItemAssignment.bootstrap_room"),
        0x7fff_ffff_ffff_fff0_u64
    );
}

#[test]
fn sglang_room_is_int32_at_field_3() {
    let params = sg::DisaggregatedParams {
        bootstrap_host: "10.0.0.7".to_string(),
        bootstrap_port: 8998,
        bootstrap_room: i32::MAX,
    };
    // Compile-time pin: SGLang rooms are int32 (0..i32::MAX).
    let room: i32 = params.bootstrap_room;
    let encoded = params.encode_to_vec();
    let fields = parse_ok(&encoded);
    assert_eq!(
        layout(&fields),
        vec![(1, LEN), (2, VARINT), (3, VARINT)],
        "DisaggregatedParams"
    );
    assert_eq!(
        bytes_at(&fields, 1, "DisaggregatedParams.bootstrap_host"),
        b"10.0.0.7"
    );
    assert_eq!(
        varint_at(&fields, 2, "DisaggregatedParams.bootstrap_port"),
        8998
    );
    assert_eq!(
        varint_at(&fields, 3, "DisaggregatedParams.bootstrap_room"),
        u64::try_from(room).expect("the room is non-negative"),
        "SGLang bootstrap_room is field 3, a plain varint"
    );
}

// ---------------------------------------------------------------------------
// Trap: presence of optional sampling fields.
// ---------------------------------------------------------------------------

#[test]
fn tokenspeed_optional_sampling_fields_track_presence() {
    let unset = ts::SamplingParams::default();
    let _: Option<f32> = unset.temperature;
    let _: Option<u32> = unset.max_new_tokens;
    assert_eq!(
        unset.encode_to_vec(),
        Vec::<u8>::new(),
        "unset fields stay off the wire"
    );

    let greedy = ts::SamplingParams {
        temperature: Some(0.0),
        ..Default::default()
    };
    let bytes = greedy.encode_to_vec();
    let fields = parse_ok(&bytes);
    assert_eq!(layout(&fields), vec![(1, I32)], "temperature = Some(0.0)");
    assert_eq!(fixed32_at(&fields, 1, "temperature"), 0.0f32.to_bits());
    assert_eq!(bytes, [0x0d, 0x00, 0x00, 0x00, 0x00]);

    let warm = ts::SamplingParams {
        temperature: Some(0.7),
        ..Default::default()
    };
    let encoded = warm.encode_to_vec();
    let fields = parse_ok(&encoded);
    assert_eq!(fixed32_at(&fields, 1, "temperature"), 0.7f32.to_bits());

    let no_tokens = ts::SamplingParams {
        max_new_tokens: Some(0),
        ..Default::default()
    };
    let bytes = no_tokens.encode_to_vec();
    let fields = parse_ok(&bytes);
    assert_eq!(
        layout(&fields),
        vec![(8, VARINT)],
        "max_new_tokens = Some(0)"
    );
    assert_eq!(varint_at(&fields, 8, "max_new_tokens"), 0);
    assert_eq!(bytes, [0x40, 0x00]);
}

#[test]
fn tokenspeed_logprob_start_len_is_optional_int32_at_field_5() {
    let unset = ts::GenerateRequest::default();
    assert_eq!(
        unset.encode_to_vec(),
        Vec::<u8>::new(),
        "None stays off the wire"
    );

    let zero = ts::GenerateRequest {
        logprob_start_len: Some(0),
        ..Default::default()
    };
    assert_eq!(zero.encode_to_vec(), [0x28, 0x00], "Some(0) is present");

    let minus_one = ts::GenerateRequest {
        logprob_start_len: Some(-1),
        ..Default::default()
    };
    let bytes = minus_one.encode_to_vec();
    // int32 -1 is sign-extended to a 10-byte varint (not zigzag, not 5 bytes).
    assert_eq!(
        bytes,
        [
            0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
        ]
    );
    let fields = parse_ok(&bytes);
    assert_eq!(varint_at(&fields, 5, "logprob_start_len"), u64::MAX);
}

#[test]
fn sglang_temperature_is_implicit_but_max_new_tokens_is_optional() {
    let greedy = sg::SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    // Compile-time pins: plain float, optional uint32.
    let _: f32 = greedy.temperature;
    let _: Option<u32> = greedy.max_new_tokens;
    assert_eq!(
        greedy.encode_to_vec(),
        Vec::<u8>::new(),
        "SGLang temperature 0.0 is the proto3 default and stays off the wire"
    );

    let warm = sg::SamplingParams {
        temperature: 0.5,
        ..Default::default()
    };
    let encoded = warm.encode_to_vec();
    let fields = parse_ok(&encoded);
    assert_eq!(layout(&fields), vec![(1, I32)], "SGLang temperature = 0.5");
    assert_eq!(fixed32_at(&fields, 1, "temperature"), 0.5f32.to_bits());

    let no_tokens = sg::SamplingParams {
        max_new_tokens: Some(0),
        ..Default::default()
    };
    let bytes = no_tokens.encode_to_vec();
    let fields = parse_ok(&bytes);
    assert_eq!(
        layout(&fields),
        vec![(8, VARINT)],
        "SGLang max_new_tokens = Some(0)"
    );
    assert_eq!(varint_at(&fields, 8, "max_new_tokens"), 0);
    assert_eq!(bytes, [0x40, 0x00]);
}

// ---------------------------------------------------------------------------
// GenerateRequest numbering, down into the nested messages.
// ---------------------------------------------------------------------------

#[test]
fn tokenspeed_generate_request_numbering() {
    let request = ts::GenerateRequest {
        request_id: "req-1".to_string(),
        tokenized: Some(ts::TokenizedInput {
            input_ids: vec![5, 300],
            original_text: String::new(),
        }),
        sampling_params: Some(ts::SamplingParams {
            max_new_tokens: Some(16),
            ..Default::default()
        }),
        return_logprob: true,
        logprob_start_len: Some(-1),
        top_logprobs_num: 3,
        token_ids_logprob: vec![11],
        stream: true,
        mm_inputs: Some(ts::MultimodalInputs {
            items: vec![ts::MultimodalItem {
                modality: common::Modality::Image as i32,
                content_hash: vec![0xab; 32].into(),
                encoder_input: None,
                model_specific_tensors: Default::default(),
                placeholders: vec![ts::PlaceholderRange {
                    offset: 4,
                    length: 1564,
                }],
                placeholder_token_id: Some(151_655),
            }],
        }),
        encode_bootstrap_info: Some(ts::EncodeBootstrapInfo {
            items: vec![ts::EncodeItemBootstrapInfo {
                item_index: 0,
                bootstrap_host: "enc-0".to_string(),
                bootstrap_port: 9100,
                bootstrap_room: BIG_ROOM,
            }],
        }),
        kv_bootstrap_info: Some(ts::KvBootstrapInfo {
            bootstrap_host: "prefill-0".to_string(),
            bootstrap_port: 8998,
            bootstrap_room: 77,
        }),
    };
    let bytes = request.encode_to_vec();
    let fields = parse_ok(&bytes);
    assert_eq!(
        layout(&fields),
        vec![
            (1, LEN),
            (2, LEN),
            (3, LEN),
            (4, VARINT),
            (5, VARINT),
            (6, VARINT),
            (7, LEN),
            (8, VARINT),
            (9, LEN),
            (10, LEN),
            (11, LEN),
        ],
        "TokenSpeed GenerateRequest"
    );
    assert_eq!(bytes_at(&fields, 1, "request_id"), b"req-1");
    let tokenized = parse_ok(bytes_at(&fields, 2, "tokenized"));
    assert_eq!(
        packed_at(&tokenized, 1, "tokenized.input_ids"),
        vec![5, 300]
    );
    let sampling = parse_ok(bytes_at(&fields, 3, "sampling_params"));
    assert_eq!(
        varint_at(&sampling, 8, "sampling_params.max_new_tokens"),
        16
    );
    assert_eq!(varint_at(&fields, 4, "return_logprob"), 1);
    assert_eq!(varint_at(&fields, 5, "logprob_start_len"), u64::MAX);
    assert_eq!(varint_at(&fields, 6, "top_logprobs_num"), 3);
    assert_eq!(packed_at(&fields, 7, "token_ids_logprob"), vec![11]);
    assert_eq!(varint_at(&fields, 8, "stream"), 1);

    // 9: mm_inputs -> 1: items -> MultimodalItem.
    let mm_inputs = parse_ok(bytes_at(&fields, 9, "mm_inputs"));
    let item = parse_ok(bytes_at(&mm_inputs, 1, "mm_inputs.items"));
    assert_eq!(
        layout(&item),
        vec![(1, VARINT), (2, LEN), (5, LEN), (6, VARINT)],
        "MultimodalItem"
    );
    assert_eq!(varint_at(&item, 1, "item.modality"), 1, "IMAGE = 1");
    assert_eq!(bytes_at(&item, 2, "item.content_hash"), [0xab; 32]);
    let placeholder = parse_ok(bytes_at(&item, 5, "item.placeholders"));
    assert_eq!(varint_at(&placeholder, 1, "placeholder.offset"), 4);
    assert_eq!(varint_at(&placeholder, 2, "placeholder.length"), 1564);
    assert_eq!(varint_at(&item, 6, "item.placeholder_token_id"), 151_655);

    // 10: encode_bootstrap_info -> 1: items -> EncodeItemBootstrapInfo.
    let encode_info = parse_ok(bytes_at(&fields, 10, "encode_bootstrap_info"));
    let encode_item = parse_ok(bytes_at(&encode_info, 1, "encode_bootstrap_info.items"));
    assert_eq!(
        layout(&encode_item),
        vec![(2, LEN), (3, VARINT), (4, VARINT)],
        "EncodeItemBootstrapInfo (item_index 0 is the default)"
    );
    assert_eq!(bytes_at(&encode_item, 2, "encode item host"), b"enc-0");
    assert_eq!(varint_at(&encode_item, 3, "encode item port"), 9100);
    assert_eq!(
        varint_at(&encode_item, 4, "encode item room"),
        0x7fff_ffff_ffff_fff0_u64
    );

    // 11: kv_bootstrap_info.
    let kv = parse_ok(bytes_at(&fields, 11, "kv_bootstrap_info"));
    assert_eq!(bytes_at(&kv, 1, "kv host"), b"prefill-0");
    assert_eq!(varint_at(&kv, 2, "kv port"), 8998);
    assert_eq!(varint_at(&kv, 3, "kv room"), 77);
}

#[test]
fn tokenspeed_tensor_inside_multimodal_item_is_field_3() {
    let item = ts::MultimodalItem {
        encoder_input: Some(ts::TensorData {
            shape: vec![1564, 1176],
            dtype: "float32".to_string(),
            payload: Some(ts::tensor_data::Payload::Inline(vec![1, 2].into())),
        }),
        ..Default::default()
    };
    let encoded = item.encode_to_vec();
    let fields = parse_ok(&encoded);
    assert_eq!(
        layout(&fields),
        vec![(3, LEN)],
        "MultimodalItem.encoder_input"
    );
    let tensor = parse_ok(bytes_at(&fields, 3, "encoder_input"));
    assert_eq!(
        packed_at(&tensor, 1, "encoder_input.shape"),
        vec![1564, 1176]
    );
    assert_eq!(bytes_at(&tensor, 3, "encoder_input.inline"), [1, 2]);
}

#[test]
fn sglang_generate_request_numbering() {
    let request = sg::GenerateRequest {
        request_id: "req-2".to_string(),
        tokenized: Some(sg::TokenizedInput {
            original_text: String::new(),
            input_ids: vec![5, 300],
        }),
        mm_inputs: Some(sg::MultimodalInputs {
            pixel_values: Some(sg::TensorData {
                data: vec![7; 4].into(),
                shape: vec![1, 4],
                dtype: "float32".to_string(),
            }),
            ..Default::default()
        }),
        sampling_params: Some(sg::SamplingParams {
            max_new_tokens: Some(16),
            ..Default::default()
        }),
        disaggregated_params: Some(sg::DisaggregatedParams {
            bootstrap_host: "prefill-0".to_string(),
            bootstrap_port: 8998,
            bootstrap_room: 77,
        }),
        stream: true,
        ..Default::default()
    };
    let bytes = request.encode_to_vec();
    let fields = parse_ok(&bytes);
    assert_eq!(
        layout(&fields),
        vec![
            (1, LEN),
            (2, LEN),
            (3, LEN),
            (4, LEN),
            (10, LEN),
            (17, VARINT)
        ],
        "SGLang GenerateRequest"
    );
    assert_eq!(bytes_at(&fields, 1, "request_id"), b"req-2");
    let tokenized = parse_ok(bytes_at(&fields, 2, "tokenized"));
    assert_eq!(layout(&tokenized), vec![(2, LEN)], "SGLang tokenized");
    assert_eq!(
        packed_at(&tokenized, 2, "tokenized.input_ids"),
        vec![5, 300]
    );
    let mm_inputs = parse_ok(bytes_at(&fields, 3, "mm_inputs"));
    let pixels = parse_ok(bytes_at(&mm_inputs, 4, "mm_inputs.pixel_values"));
    assert_eq!(bytes_at(&pixels, 1, "pixel_values.data"), [7; 4]);
    assert_eq!(packed_at(&pixels, 2, "pixel_values.shape"), vec![1, 4]);
    let sampling = parse_ok(bytes_at(&fields, 4, "sampling_params"));
    assert_eq!(
        varint_at(&sampling, 8, "sampling_params.max_new_tokens"),
        16
    );
    let disagg = parse_ok(bytes_at(&fields, 10, "disaggregated_params"));
    assert_eq!(bytes_at(&disagg, 1, "disaggregated host"), b"prefill-0");
    assert_eq!(varint_at(&disagg, 2, "disaggregated port"), 8998);
    assert_eq!(varint_at(&disagg, 3, "disaggregated room"), 77);
    assert_eq!(varint_at(&fields, 17, "stream"), 1);
    // Field 17's tag (17 << 3 = 136) is the two-byte varint 0x88 0x01.
    assert!(
        bytes.windows(3).any(|w| w == [0x88, 0x01, 0x01]),
        "stream = true must be encoded as 88 01 01"
    );
}

// ---------------------------------------------------------------------------
// Responses: bytes an engine would send, built with wire.md's numbers.
// ---------------------------------------------------------------------------

#[test]
fn tokenspeed_generate_response_decodes_from_wire_md_numbers() {
    let mut complete = Vec::new();
    put_len(&mut complete, 1, &[5, 6]); // output_ids (packed)
    put_len(&mut complete, 2, b"stop"); // finish_reason
    put_uint(&mut complete, 3, 10); // prompt_tokens
    put_uint(&mut complete, 4, 2); // completion_tokens
    put_uint(&mut complete, 7, 6); // matched_token_id
    put_uint(&mut complete, 9, 1); // index
    let mut response = Vec::new();
    put_len(&mut response, 1, b"r1");
    put_len(&mut response, 3, &complete);

    let decoded = ts::GenerateResponse::decode(response.as_slice()).expect("valid response");
    assert_eq!(decoded.request_id, "r1");
    let Some(ts::generate_response::Response::Complete(done)) = decoded.response else {
        panic!(
            "field 3 must decode as `complete`, got {:?}",
            decoded.response
        );
    };
    assert_eq!(done.output_ids, vec![5, 6]);
    assert_eq!(done.finish_reason, "stop");
    assert_eq!((done.prompt_tokens, done.completion_tokens), (10, 2));
    assert_eq!(
        done.matched_stop,
        Some(ts::generate_complete::MatchedStop::MatchedTokenId(6))
    );
    assert_eq!(done.index, 1);

    let mut chunk = Vec::new();
    put_len(&mut chunk, 1, &[7]); // token_ids
    put_uint(&mut chunk, 4, 3); // cached_tokens
    put_uint(&mut chunk, 6, 2); // index
    let mut response = Vec::new();
    put_len(&mut response, 2, &chunk);
    let decoded = ts::GenerateResponse::decode(response.as_slice()).expect("valid response");
    let Some(ts::generate_response::Response::Chunk(chunk)) = decoded.response else {
        panic!("field 2 must decode as `chunk`, got {:?}", decoded.response);
    };
    assert_eq!(
        (chunk.token_ids, chunk.cached_tokens, chunk.index),
        (vec![7], 3, 2)
    );
}

#[test]
fn sglang_generate_response_decodes_from_wire_md_numbers() {
    let mut complete = Vec::new();
    put_len(&mut complete, 1, &[5, 6]); // output_ids (packed)
    put_len(&mut complete, 2, b"stop"); // finish_reason
    put_uint(&mut complete, 8, 6); // matched_token_id
    put_uint(&mut complete, 11, 1); // index
    put_uint(&mut complete, 12, 4); // reasoning_tokens
    let mut response = Vec::new();
    put_len(&mut response, 1, b"r2");
    put_len(&mut response, 3, &complete);

    let decoded = sg::GenerateResponse::decode(response.as_slice()).expect("valid response");
    assert_eq!(decoded.request_id, "r2");
    let Some(sg::generate_response::Response::Complete(done)) = decoded.response else {
        panic!(
            "field 3 must decode as `complete`, got {:?}",
            decoded.response
        );
    };
    assert_eq!(done.output_ids, vec![5, 6]);
    assert_eq!(done.finish_reason, "stop");
    assert_eq!(
        done.matched_stop,
        Some(sg::generate_complete::MatchedStop::MatchedTokenId(6))
    );
    assert_eq!((done.index, done.reasoning_tokens), (1, 4));

    let mut chunk = Vec::new();
    put_len(&mut chunk, 1, &[7]); // token_ids
    put_uint(&mut chunk, 8, 2); // index
    put_uint(&mut chunk, 9, 1); // reasoning_tokens
    let mut response = Vec::new();
    put_len(&mut response, 2, &chunk);
    let decoded = sg::GenerateResponse::decode(response.as_slice()).expect("valid response");
    let Some(sg::generate_response::Response::Chunk(chunk)) = decoded.response else {
        panic!("field 2 must decode as `chunk`, got {:?}", decoded.response);
    };
    assert_eq!(
        (chunk.token_ids, chunk.index, chunk.reasoning_tokens),
        (vec![7], 2, 1)
    );
}
