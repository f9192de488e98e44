//! The engines' `TokenizedInput` messages, encoded by hand.
//!
//! Every generate request carries its prompt as a packed `repeated uint32
//! input_ids`. prost's derived encoder writes a packed field one varint
//! byte at a time through the gRPC frame buffer (`BufMut::put_u8`, a
//! capacity check and a length update per byte): ~100 instructions per
//! token id, 10% of a small chat request's gateway CPU at 450 prompt tokens
//! and more for an agent's long prompts. These types encode the ids into a
//! stack block first and hand the frame buffer one slice per 64 ids.
//!
//! Each thread also keeps the last ids it encoded with their bytes, a
//! block of 64 at a time: a prompt that starts as the previous one did (an
//! agent's system prompt and tools turn after turn, a PD pair's prefill
//! and decode requests) copies the bytes of the whole blocks it shares
//! with it and encodes only the rest. Comparing ids costs a fraction of
//! encoding them.
//!
//! The bytes are the derived encoder's, field for field: the fields in
//! number order, empty fields left out, the ids as one packed field.
//! Decoding accepts everything the derived decoder accepts (packed and
//! unpacked ids, unknown fields skipped) through prost's own field
//! decoders. `build.rs` points the generated code at these types
//! (`extern_path`); the wire-contract tests check both against byte
//! fixtures typed out by hand, and the unit tests below against prost's
//! derive on random inputs.

// proto/mod.rs allows clippy for the generated code; this file is ours.
#![warn(clippy::all)]

use std::cell::RefCell;

use bytes::{Buf, BufMut};
use prost::DecodeError;
use prost::encoding::{DecodeContext, WireType, encode_key, encoded_len_varint, key_len};

use crate::shared_prefix::shared_prefix_len;

/// TokenSpeed's `TokenizedInput`: `input_ids = 1`, `original_text = 2`.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct TokenSpeedTokenizedInput {
    pub input_ids: Vec<u32>,
    pub original_text: String,
}

/// SGLang's `TokenizedInput`: `original_text = 1`, `input_ids = 2`.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct SglangTokenizedInput {
    pub original_text: String,
    pub input_ids: Vec<u32>,
}

impl prost::Message for TokenSpeedTokenizedInput {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_ids(1, &self.input_ids, buf);
        encode_text(2, &self.original_text, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_ids(wire_type, &mut self.input_ids, buf, ctx),
            2 => merge_text(wire_type, &mut self.original_text, buf, ctx),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        ids_len(1, &self.input_ids) + text_len(2, &self.original_text)
    }

    fn clear(&mut self) {
        self.input_ids.clear();
        self.original_text.clear();
    }
}

impl prost::Message for SglangTokenizedInput {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_text(1, &self.original_text, buf);
        encode_ids(2, &self.input_ids, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_text(wire_type, &mut self.original_text, buf, ctx),
            2 => merge_ids(wire_type, &mut self.input_ids, buf, ctx),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        text_len(1, &self.original_text) + ids_len(2, &self.input_ids)
    }

    fn clear(&mut self) {
        self.original_text.clear();
        self.input_ids.clear();
    }
}

/// Ids per block: a u32 varint is at most 5 bytes.
const IDS_PER_BLOCK: usize = 64;
/// A thread's record of its last ids grows no longer than this (1 MiB of
/// ids, up to 1.25 MiB of bytes); a longer prompt reuses and records its
/// first this many.
const MAX_RECORDED_IDS: usize = 256 * 1024;

thread_local! {
    static LAST_ENCODED: RefCell<LastEncodedIds> = RefCell::new(LastEncodedIds::default());
}

/// The whole blocks of the last ids one thread encoded, and their bytes.
#[derive(Default)]
struct LastEncodedIds {
    /// `IDS_PER_BLOCK` times `block_ends.len()` ids.
    ids: Vec<u32>,
    /// Their varints, back to back.
    bytes: Vec<u8>,
    /// `bytes.len()` after each block.
    block_ends: Vec<usize>,
    /// Bytes the last encoding copied from the one before (tests).
    #[cfg(test)]
    reused_bytes: usize,
}

impl LastEncodedIds {
    /// The whole blocks `ids` shares with the record, and their bytes.
    fn shared_blocks(&self, ids: &[u32]) -> (usize, usize) {
        let kept = (shared_prefix_len(&self.ids, ids) / IDS_PER_BLOCK).min(self.block_ends.len());
        (
            kept,
            kept.checked_sub(1).map_or(0, |last| self.block_ends[last]),
        )
    }

    /// Writes the varints of `ids` to `buf`, copying those of the whole
    /// blocks they share with the record, and records `ids` in their place.
    fn encode(&mut self, ids: &[u32], buf: &mut impl BufMut) {
        let (kept, kept_bytes) = self.shared_blocks(ids);
        buf.put_slice(&self.bytes[..kept_bytes]);
        self.ids.truncate(kept * IDS_PER_BLOCK);
        self.bytes.truncate(kept_bytes);
        self.block_ends.truncate(kept);
        #[cfg(test)]
        {
            self.reused_bytes = kept_bytes;
        }
        let mut block = [0u8; IDS_PER_BLOCK * 5];
        for ids in ids[kept * IDS_PER_BLOCK..].chunks(IDS_PER_BLOCK) {
            let encoded = encode_block(ids, &mut block);
            buf.put_slice(encoded);
            if ids.len() == IDS_PER_BLOCK && self.ids.len() < MAX_RECORDED_IDS {
                self.ids.extend_from_slice(ids);
                self.bytes.extend_from_slice(encoded);
                self.block_ends.push(self.bytes.len());
            }
        }
    }
}

/// Writes `ids` as one packed field (nothing when empty, as proto3 does).
fn encode_ids(tag: u32, ids: &[u32], buf: &mut impl BufMut) {
    if ids.is_empty() {
        return;
    }
    encode_key(tag, WireType::LengthDelimited, buf);
    prost::encoding::encode_varint(packed_len(ids) as u64, buf);
    let recorded = LAST_ENCODED.try_with(|last| match last.try_borrow_mut() {
        Ok(mut last) => {
            last.encode(ids, buf);
            true
        }
        Err(_) => false,
    });
    if recorded != Ok(true) {
        let mut block = [0u8; IDS_PER_BLOCK * 5];
        for ids in ids.chunks(IDS_PER_BLOCK) {
            buf.put_slice(encode_block(ids, &mut block));
        }
    }
}

/// Writes the varints of up to `IDS_PER_BLOCK` ids into `block`, returns
/// them.
#[inline]
fn encode_block<'a>(ids: &[u32], block: &'a mut [u8; IDS_PER_BLOCK * 5]) -> &'a [u8] {
    debug_assert!(ids.len() <= IDS_PER_BLOCK);
    let mut at = 0;
    for &id in ids {
        at = put_varint(block, at, id);
    }
    &block[..at]
}

/// Writes `value` as a varint at `block[at..]`, returns the end. `block`
/// has room for 5 bytes past `at` (the caller's block holds 5 per id).
///
/// Token ids are one to three bytes (vocabularies hold up to ~2^18 ids):
/// those are spread into one little-endian word, 7 bits a byte with the
/// continuation bit on every byte but the last, and stored whole (the byte
/// past the varint is overwritten by the next id or cut off by the caller's
/// slice): no branch on the width, which a prompt changes id to id. Wider
/// values take the loop.
#[inline]
fn put_varint(block: &mut [u8; IDS_PER_BLOCK * 5], mut at: usize, mut value: u32) -> usize {
    if value < 1 << 21 {
        let width = 1 + usize::from(value >= 1 << 7) + usize::from(value >= 1 << 14);
        let spread = (value & 0x7f) | ((value << 1) & 0x7f00) | ((value << 2) & 0x7f_0000);
        // 0, 0x80 or 0x8080: continuation bits for widths 1, 2 and 3.
        let continuation = (0x8080_u32 >> (8 * (3 - width))) & 0x8080;
        if let Some(word) = block.get_mut(at..at + 4) {
            word.copy_from_slice(&(spread | continuation).to_le_bytes());
            return at + width;
        }
    }
    while value >= 0x80 {
        block[at] = (value as u8) | 0x80;
        value >>= 7;
        at += 1;
    }
    block[at] = value as u8;
    at + 1
}

/// Bytes of the ids' varints, without key and length. Asked three times
/// per message (the gRPC frame's size check, the enclosing message's
/// length, the field's length), before the ids are encoded: the whole
/// blocks they share with this thread's record count as recorded, the
/// rest one id at a time.
fn packed_len(ids: &[u32]) -> usize {
    if ids.len() < IDS_PER_BLOCK {
        return count_varint_bytes(ids);
    }
    let shared =
        LAST_ENCODED.try_with(|last| last.try_borrow().map(|last| last.shared_blocks(ids)));
    let (kept, kept_bytes) = match shared {
        Ok(Ok(shared)) => shared,
        _ => (0, 0),
    };
    kept_bytes + count_varint_bytes(&ids[kept * IDS_PER_BLOCK..])
}

/// Bytes of the ids' varints: one byte per id and one more for each 7-bit
/// boundary it crosses. Counted without branches, so the compiler can do
/// it several ids at a time (prost's per-id `encoded_len_varint` cannot
/// be).
fn count_varint_bytes(ids: &[u32]) -> usize {
    // u32 sums cannot overflow within a chunk (at most 5 per id).
    ids.chunks(1 << 16)
        .map(|chunk| {
            chunk
                .iter()
                .map(|&id| {
                    1 + u32::from(id >= 1 << 7)
                        + u32::from(id >= 1 << 14)
                        + u32::from(id >= 1 << 21)
                        + u32::from(id >= 1 << 28)
                })
                .sum::<u32>() as usize
        })
        .sum()
}

fn ids_len(tag: u32, ids: &[u32]) -> usize {
    if ids.is_empty() {
        return 0;
    }
    let len = packed_len(ids);
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn merge_ids(
    wire_type: WireType,
    ids: &mut Vec<u32>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    prost::encoding::uint32::merge_repeated(wire_type, ids, buf, ctx)
}

fn encode_text(tag: u32, text: &String, buf: &mut impl BufMut) {
    if !text.is_empty() {
        prost::encoding::string::encode(tag, text, buf);
    }
}

fn text_len(tag: u32, text: &String) -> usize {
    if text.is_empty() {
        0
    } else {
        prost::encoding::string::encoded_len(tag, text)
    }
}

fn merge_text(
    wire_type: WireType,
    text: &mut String,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    prost::encoding::string::merge(wire_type, text, buf, ctx)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use prost::Message;

    use super::*;

    /// What prost's derive makes of TokenSpeed's message: the reference.
    #[derive(Clone, PartialEq, prost::Message)]
    struct DerivedTokenSpeed {
        #[prost(uint32, repeated, tag = "1")]
        input_ids: Vec<u32>,
        #[prost(string, tag = "2")]
        original_text: String,
    }

    /// And of SGLang's.
    #[derive(Clone, PartialEq, prost::Message)]
    struct DerivedSglang {
        #[prost(string, tag = "1")]
        original_text: String,
        #[prost(uint32, repeated, tag = "2")]
        input_ids: Vec<u32>,
    }

    /// The same ids written unpacked (one key per id), which decoders must
    /// accept for a packed field.
    #[derive(Clone, PartialEq, prost::Message)]
    struct UnpackedIds {
        #[prost(uint32, repeated, packed = "false", tag = "1")]
        input_ids: Vec<u32>,
    }

    /// Ids of every varint width, runs across the 64-id blocks, and the
    /// empty cases.
    fn cases() -> Vec<(Vec<u32>, String)> {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut cases = vec![
            (vec![], String::new()),
            (vec![], "only text".to_owned()),
            (vec![0], String::new()),
            (
                vec![127, 128, 16_383, 16_384, 2_097_151, 2_097_152],
                String::new(),
            ),
            (vec![268_435_455, 268_435_456, u32::MAX], "é".to_owned()),
        ];
        for len in [1, 63, 64, 65, 128, 129, 1000, 5000] {
            let ids = (0..len)
                .map(|_| {
                    // Widths 1 to 5 bytes, uniformly.
                    let bits = 7 * (1 + next() % 5) as u32;
                    (next() as u32) & (u32::MAX >> (32 - bits.min(32)))
                })
                .collect();
            cases.push((ids, format!("prompt of {len}")));
        }
        cases
    }

    #[test]
    fn tokenspeed_bytes_are_the_derived_encoders() {
        for (input_ids, original_text) in cases() {
            let ours = TokenSpeedTokenizedInput {
                input_ids: input_ids.clone(),
                original_text: original_text.clone(),
            };
            let derived = DerivedTokenSpeed {
                input_ids,
                original_text,
            };
            let bytes = ours.encode_to_vec();
            assert_eq!(bytes, derived.encode_to_vec());
            assert_eq!(ours.encoded_len(), derived.encoded_len());
            assert_eq!(TokenSpeedTokenizedInput::decode(&bytes[..]).unwrap(), ours);
        }
    }

    #[test]
    fn sglang_bytes_are_the_derived_encoders() {
        for (input_ids, original_text) in cases() {
            let ours = SglangTokenizedInput {
                original_text: original_text.clone(),
                input_ids: input_ids.clone(),
            };
            let derived = DerivedSglang {
                original_text,
                input_ids,
            };
            let bytes = ours.encode_to_vec();
            assert_eq!(bytes, derived.encode_to_vec());
            assert_eq!(ours.encoded_len(), derived.encoded_len());
            assert_eq!(SglangTokenizedInput::decode(&bytes[..]).unwrap(), ours);
        }
    }

    #[test]
    fn narrow_ids_after_wide_ones_end_their_block_exactly() {
        // A block of 63 five-byte ids leaves the 64th id its last 5 bytes;
        // a narrow id's 4-byte store must fit there and end the block.
        for last in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            2_097_151,
            2_097_152,
            u32::MAX,
        ] {
            let mut input_ids = vec![u32::MAX; 63];
            input_ids.push(last);
            input_ids.extend([5, 300, 70_000]);
            let ours = TokenSpeedTokenizedInput {
                input_ids: input_ids.clone(),
                original_text: String::new(),
            };
            let derived = DerivedTokenSpeed {
                input_ids,
                original_text: String::new(),
            };
            assert_eq!(ours.encode_to_vec(), derived.encode_to_vec(), "last {last}");
            assert_eq!(ours.encoded_len(), derived.encoded_len());
        }
    }

    /// Bytes the last encoding on this thread copied from the one before.
    fn reused_bytes() -> usize {
        LAST_ENCODED.with(|last| last.borrow().reused_bytes)
    }

    #[test]
    fn prompts_sharing_a_start_copy_its_whole_blocks_and_encode_the_same_bytes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut previous: Vec<u32> = Vec::new();
        for round in 0..400 {
            // Keep a start of the previous prompt (all of it, none, or any
            // length), then new ids of every varint width.
            let keep = match round % 4 {
                0 => previous.len(),
                1 => 0,
                _ => rng.random_range(0..=previous.len()),
            };
            let mut ids = previous[..keep].to_vec();
            if round % 8 != 0 {
                for _ in 0..rng.random_range(0..300) {
                    let bits = 7 * rng.random_range(1..=5);
                    ids.push(rng.random::<u32>() & (u32::MAX >> (32 - bits.min(32))));
                }
            }
            // The shared start the record can use: whole blocks of what both
            // have in common (the changed id may equal the old one by chance).
            let shared = previous
                .iter()
                .zip(&ids)
                .take_while(|(a, b)| a == b)
                .count();
            let recorded_blocks = previous.len() / IDS_PER_BLOCK;
            let expected_reuse = count_varint_bytes(
                &ids[..(shared / IDS_PER_BLOCK).min(recorded_blocks) * IDS_PER_BLOCK],
            );
            let ours = TokenSpeedTokenizedInput {
                input_ids: ids.clone(),
                original_text: String::new(),
            };
            let derived = DerivedTokenSpeed {
                input_ids: ids.clone(),
                original_text: String::new(),
            };
            assert_eq!(ours.encoded_len(), derived.encoded_len(), "round {round}");
            assert_eq!(
                ours.encode_to_vec(),
                derived.encode_to_vec(),
                "round {round}"
            );
            // No ids, no field: the record is left as it was.
            if !ids.is_empty() {
                assert_eq!(reused_bytes(), expected_reuse, "round {round}");
                previous = ids;
            }
        }
    }

    #[test]
    fn the_record_stops_growing_at_its_bound_and_reuses_what_it_holds() {
        let ids: Vec<u32> = (0..MAX_RECORDED_IDS as u32 + 3 * IDS_PER_BLOCK as u32 + 5)
            .map(|i| i.wrapping_mul(2_654_435_761) >> 14)
            .collect();
        let ours = SglangTokenizedInput {
            original_text: "long".to_owned(),
            input_ids: ids.clone(),
        };
        let derived = DerivedSglang {
            original_text: "long".to_owned(),
            input_ids: ids.clone(),
        };
        assert_eq!(ours.encode_to_vec(), derived.encode_to_vec());
        // The same prompt again: the recorded blocks are copied, no more.
        assert_eq!(ours.encode_to_vec(), derived.encode_to_vec());
        assert_eq!(ours.encoded_len(), derived.encoded_len());
        assert_eq!(reused_bytes(), count_varint_bytes(&ids[..MAX_RECORDED_IDS]));
        LAST_ENCODED.with(|last| {
            let last = last.borrow();
            assert_eq!(last.ids.len(), MAX_RECORDED_IDS);
            assert_eq!(last.block_ends.len(), MAX_RECORDED_IDS / IDS_PER_BLOCK);
            assert_eq!(
                last.bytes.len(),
                count_varint_bytes(&ids[..MAX_RECORDED_IDS])
            );
        });
    }

    #[test]
    fn unpacked_ids_and_unknown_fields_decode_as_prost_decodes_them() {
        let ids = vec![1, 300, u32::MAX];
        let mut bytes = UnpackedIds {
            input_ids: ids.clone(),
        }
        .encode_to_vec();
        // An unknown field 9 (varint 5), which a decoder skips.
        bytes.extend_from_slice(&[9 << 3, 5]);
        let ours = TokenSpeedTokenizedInput::decode(&bytes[..]).unwrap();
        assert_eq!(ours.input_ids, ids);
        assert_eq!(ours, {
            let derived = DerivedTokenSpeed::decode(&bytes[..]).unwrap();
            TokenSpeedTokenizedInput {
                input_ids: derived.input_ids,
                original_text: derived.original_text,
            }
        });
        // A truncated packed field is an error, not a short prompt.
        let whole = TokenSpeedTokenizedInput {
            input_ids: ids,
            original_text: String::new(),
        }
        .encode_to_vec();
        assert!(TokenSpeedTokenizedInput::decode(&whole[..whole.len() - 1]).is_err());
    }
}
