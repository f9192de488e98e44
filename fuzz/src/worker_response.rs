//! Arbitrary bytes as a worker's answers, read the way the engine client
//! reads them.
//!
//! Generate streams (`smg::engine::read_generate_messages`): prost decodes
//! each message as the runtime's `GenerateResponse`, the conversion makes a
//! `GenerateEvent` of it and the request's output bounds hold it to what was
//! asked. Errors (`worker_protocol_violation`) are fine; a panic is not, and
//! what comes out must respect the bounds: sequence indices below `n`, no
//! sequence past its token budget, no more logprob alternatives than asked,
//! one completion per sequence.
//!
//! The other answers (`smg::engine::read_worker_answer`): model info,
//! server info (its `Struct`s become JSON), loads (summed over ranks) and
//! embeddings, each through the runtime's real conversion. Errors are fine;
//! a panic (an overflow summing ranks, a recursion) is not, and an accepted
//! embedding is no wider than the gateway's cap.
//!
//! Input: byte 0 bit 0 picks the runtime (TokenSpeed, SGLang); bits 2-4
//! pick the answer (mod 5): 0 a Generate stream, then 1 model info, 2
//! server info, 3 loads, 4 an embedding, whose one message is the rest of
//! the input. For a Generate stream bit 1 asks for logprobs; byte 1 is
//! `n - 1` (mod 4); byte 2 is `max_new_tokens`; byte 3 is `top_logprobs`
//! (mod 8); then messages, each a little-endian `u16` length and that many
//! bytes.

use smg::engine::{
    AnswerKind, GenerateEvent, GenerateRequest, Runtime, Sampling, WorkerAnswer,
    read_generate_messages, read_worker_answer,
};

/// The widest embedding the gateway accepts (the README's "What a worker
/// may send").
const MAX_EMBEDDING_DIM: usize = 65_536;

/// One input, as the fuzz target runs it.
pub fn run(data: &[u8]) {
    let [flags, rest @ ..] = data else {
        return;
    };
    let runtime = if flags & 1 == 0 {
        Runtime::TokenSpeed
    } else {
        Runtime::Sglang
    };
    let kind = match (flags >> 2) % 5 {
        0 => return generate(runtime, *flags, rest),
        1 => AnswerKind::ModelInfo,
        2 => AnswerKind::ServerInfo,
        3 => AnswerKind::Loads,
        _ => AnswerKind::Embed,
    };
    if let Ok(WorkerAnswer::Embedding(embedding)) = read_worker_answer(runtime, kind, rest) {
        assert!(
            embedding.values.len() <= MAX_EMBEDDING_DIM,
            "an embedding of {} dimensions",
            embedding.values.len()
        );
    }
}

/// A Generate stream: `data` is the input after its first byte, `flags`.
fn generate(runtime: Runtime, flags: u8, data: &[u8]) {
    let [n, max_new_tokens, top, rest @ ..] = data else {
        return;
    };
    let mut rest: &[u8] = rest;
    let n = u32::from(n % 4) + 1;
    let budget = u32::from(*max_new_tokens);
    let asked = i32::from(top % 8);
    let request = GenerateRequest {
        return_logprob: flags & 2 != 0,
        top_logprobs_num: asked,
        sampling: Sampling {
            n,
            max_new_tokens: Some(budget),
            ..Sampling::default()
        },
        ..GenerateRequest::default()
    };
    let mut messages = Vec::new();
    while let [lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        let (message, after) = tail.split_at(len);
        messages.push(message);
        rest = after;
    }

    let Ok(events) = read_generate_messages(runtime, &request, messages) else {
        return;
    };
    let mut tokens = vec![0u32; n as usize];
    let mut completed = vec![false; n as usize];
    for event in &events {
        let (index, ids, logprobs) = match event {
            GenerateEvent::Chunk {
                index,
                token_ids,
                logprobs,
                ..
            } => (*index, token_ids, logprobs),
            GenerateEvent::Complete {
                index,
                output_ids,
                logprobs,
                ..
            } => (*index, output_ids, logprobs),
        };
        let slot = index as usize;
        assert!(slot < n as usize, "sequence {index} of {n}");
        assert!(
            !completed[slot],
            "sequence {index} goes on after its completion"
        );
        match event {
            GenerateEvent::Chunk { .. } => {
                tokens[slot] += ids.len() as u32;
                assert!(
                    tokens[slot] <= budget,
                    "sequence {index} past {budget} tokens"
                );
            }
            GenerateEvent::Complete { .. } => {
                assert!(
                    ids.len() as u32 <= budget,
                    "completion past {budget} tokens"
                );
                completed[slot] = true;
            }
        }
        if let Some(report) = logprobs {
            assert!(request.return_logprob, "logprobs nobody asked for");
            let most = report.top.iter().map(Vec::len).max().unwrap_or(0);
            assert!(
                most <= asked as usize,
                "{most} alternatives where {asked} were asked"
            );
        }
    }
}
