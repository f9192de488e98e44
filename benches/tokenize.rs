//! Prompt tokenization per core: the gateway's `Tokenizer::encode` (pieces
//! between added tokens, a piece cache, the direct byte-level BPE encoder)
//! against Hugging Face `tokenizers` encoding the whole prompt, on the
//! bundled test model's tokenizer.
//!
//! Two prompt kinds, each different in every call: the gateway overhead
//! bench's chat prompt (a fixed system prompt, a user message with a
//! counter), and a chat prompt around 40 random words (nothing to reuse
//! but the role headers). Time is the thread's own CPU time, so other load
//! on the machine matters less than for wall-clock numbers. Checks the ids
//! agree on every call, so a faster wrong answer cannot pass.
//!
//! Then detokenization: `Tokenizer::decode` (a per-id byte table for
//! byte-level BPE tokenizers) against Hugging Face `tokenizers`' `decode`
//! on ~135-token model outputs, and the incremental detokenizer streaming
//! a whole output, one id per push and in two chunks. Checks the text
//! agrees with `tokenizers`' on every output.
//!
//! Run: `cargo bench --bench tokenize` (optionally `SMG_BENCH_CALLS=N`).
//! Not a test: nothing here asserts a speed.

use rand::{Rng, SeedableRng};

fn thread_cpu_seconds() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the call's duration.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if status != 0 {
        return f64::NAN;
    }
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

fn chat(system: &str, user: &str) -> String {
    format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
}

/// Microseconds of thread CPU per call of `encode` over `prompts`.
fn per_call_micros(prompts: &[String], mut encode: impl FnMut(&str) -> Vec<u32>) -> f64 {
    let started = thread_cpu_seconds();
    let mut tokens = 0usize;
    for prompt in prompts {
        tokens += encode(prompt).len();
    }
    std::hint::black_box(tokens);
    (thread_cpu_seconds() - started) * 1e6 / prompts.len() as f64
}

/// Microseconds of thread CPU per call of `decode` over `outputs`, cycled
/// for `calls` calls.
fn per_output_micros(
    outputs: &[Vec<u32>],
    calls: usize,
    mut decode: impl FnMut(&[u32]) -> usize,
) -> f64 {
    let started = thread_cpu_seconds();
    let mut bytes = 0usize;
    for ids in outputs.iter().cycle().take(calls) {
        bytes += decode(ids);
    }
    std::hint::black_box(bytes);
    (thread_cpu_seconds() - started) * 1e6 / calls as f64
}

/// The incremental detokenizer's text for `ids` pushed `chunk` at a time,
/// or, with `cut`, in two pushes split there.
fn stream(
    gateway: &smg::tokenizer::Tokenizer,
    ids: &[u32],
    chunk: usize,
    cut: Option<usize>,
) -> String {
    let mut decoder = smg::tokenizer::IncrementalDecoder::new(gateway, true);
    let mut text = String::new();
    let pushes: Vec<&[u32]> = match cut {
        Some(cut) => {
            let (first, second) = ids.split_at(cut.min(ids.len()));
            vec![first, second]
        }
        None => ids.chunks(chunk).collect(),
    };
    for ids in pushes {
        text.push_str(&decoder.push(ids).expect("decodes"));
    }
    text.push_str(&decoder.finish().expect("decodes"));
    text
}

/// The first cut at or after the middle of `ids` that does not split a
/// character: a push of more than 16 ids ending inside a character is
/// emitted with U+FFFD (the detokenizer's bound on held-back ids).
fn two_chunk_cut(hugging_face: &tokenizers::Tokenizer, ids: &[u32]) -> usize {
    (ids.len() / 2..ids.len())
        .find(|&cut| {
            !hugging_face
                .decode(&ids[..cut], true)
                .is_ok_and(|text| text.ends_with(char::REPLACEMENT_CHARACTER))
        })
        .unwrap_or(ids.len())
}

/// ~135-token outputs of random words (some multi-byte, some split across
/// tokens) ending in `<|im_end|>`, each different.
fn model_outputs(gateway: &smg::tokenizer::Tokenizer, count: usize) -> Vec<Vec<u32>> {
    let words: Vec<&str> = "the model gateway request token serving latency answer cache \
         quickly Paris 42 1999 we're it's naïve café data, (note) end. multi-core GPU x86_64 \
         e-mail ok? yes! don't 世界 日本語 👋 🎉 ünïcödé ✓ \n"
        .split(' ')
        .filter(|word| !word.is_empty())
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    (0..count)
        .map(|_| {
            let mut ids = Vec::new();
            while ids.len() < 134 {
                let word = words[rng.random_range(0..words.len())];
                ids.extend(gateway.encode(&format!(" {word}"), false).expect("encodes"));
            }
            ids.truncate(134);
            ids.push(gateway.token_id("<|im_end|>").expect("im_end"));
            ids
        })
        .collect()
}

fn main() {
    let calls: usize = std::env::var("SMG_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
    let gateway = smg::tokenizer::Tokenizer::from_model_dir(&dir).expect("tokenizer");
    let hugging_face =
        tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer.json");
    let mut words: Vec<&str> = "the model gateway request token serving latency answer cache \
         quickly Paris 42 1999 we're it's naïve café data, (note) end. multi-core GPU x86_64 \
         e-mail ok? yes! don't"
        .split_whitespace()
        .collect();
    words.push("\n");
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let kinds: [(&str, Vec<String>); 2] = [
        (
            "bench chat prompt, counter",
            (0..calls)
                .map(|n| {
                    chat(
                        "You are a helpful assistant. Answer briefly and precisely.",
                        &format!("Benchmark the gateway, please. Request {n}"),
                    )
                })
                .collect(),
        ),
        (
            "chat around 40 random words",
            (0..calls)
                .map(|_| {
                    let user: Vec<&str> = (0..40)
                        .map(|_| words[rng.random_range(0..words.len())])
                        .collect();
                    chat("You are a helpful assistant.", &user.join(" "))
                })
                .collect(),
        ),
    ];
    println!(
        "\n{:<30} {:>9} {:>16} {:>16} {:>8}",
        "prompts", "tokens", "HF encode µs", "gateway µs", "speedup"
    );
    for (kind, prompts) in &kinds {
        for prompt in prompts.iter().step_by(97) {
            let expected = hugging_face
                .encode_fast(prompt.as_str(), false)
                .expect("encodes");
            assert_eq!(
                gateway.encode(prompt, false).expect("encodes"),
                expected.get_ids(),
                "{prompt:?}"
            );
        }
        let tokens = gateway.encode(&prompts[0], false).expect("encodes").len();
        let reference = per_call_micros(prompts, |prompt| {
            hugging_face
                .encode_fast(prompt, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .unwrap_or_default()
        });
        let ours = per_call_micros(prompts, |prompt| {
            gateway.encode(prompt, false).unwrap_or_default()
        });
        println!(
            "{kind:<30} {tokens:>9} {reference:>16.2} {ours:>16.2} {:>7.1}x",
            reference / ours
        );
    }
    decode_rows(&gateway, &hugging_face, calls);
}

fn decode_rows(
    gateway: &smg::tokenizer::Tokenizer,
    hugging_face: &tokenizers::Tokenizer,
    calls: usize,
) {
    let outputs = model_outputs(gateway, 1000);
    let tokens = outputs.iter().map(Vec::len).sum::<usize>() as f64 / outputs.len() as f64;
    let cuts: Vec<usize> = outputs
        .iter()
        .map(|ids| two_chunk_cut(hugging_face, ids))
        .collect();
    let mut split_inside_a_character = 0;
    for (ids, &cut) in outputs.iter().zip(&cuts) {
        let expected = hugging_face.decode(ids, true).expect("decodes");
        assert_eq!(gateway.decode(ids, true).expect("decodes"), expected);
        assert_eq!(stream(gateway, ids, 1, None), expected, "{ids:?}");
        assert_eq!(stream(gateway, ids, 0, Some(cut)), expected, "{ids:?}");
        if stream(gateway, ids, ids.len().div_ceil(2), None) != expected {
            split_inside_a_character += 1;
        }
    }
    let reference = per_output_micros(&outputs, calls, |ids| {
        hugging_face.decode(ids, true).map_or(0, |text| text.len())
    });
    let ours = per_output_micros(&outputs, calls, |ids| {
        gateway.decode(ids, true).map_or(0, |text| text.len())
    });
    let per_token = |micros: f64| micros * 1e3 / tokens;
    println!(
        "\n{:<34} {:>7} {:>14} {:>14} {:>12} {:>8}",
        "decoding one output", "tokens", "HF decode µs", "gateway µs", "gateway ns/tok", "speedup"
    );
    println!(
        "{:<34} {tokens:>7.0} {reference:>14.2} {ours:>14.2} {:>12.1} {:>7.1}x",
        "Tokenizer::decode, whole output",
        per_token(ours),
        reference / ours
    );
    let rows = [
        ("IncrementalDecoder, 1 id per push", false),
        ("IncrementalDecoder, 2 chunks", true),
    ];
    for (kind, two_chunks) in rows {
        let started = thread_cpu_seconds();
        let mut bytes = 0usize;
        for (ids, &cut) in outputs.iter().zip(&cuts).cycle().take(calls) {
            bytes += stream(gateway, ids, 1, two_chunks.then_some(cut)).len();
        }
        std::hint::black_box(bytes);
        let streamed = (thread_cpu_seconds() - started) * 1e6 / calls as f64;
        println!(
            "{kind:<34} {tokens:>7.0} {:>14} {streamed:>14.2} {:>12.1} {:>8}",
            "-",
            per_token(streamed),
            "-"
        );
    }
    println!(
        "(two halves cut mid-character, first half > 16 ids: {split_inside_a_character} of {} \
         outputs stream differently from the full decode)",
        outputs.len()
    );
}
