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
}
