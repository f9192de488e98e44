//! Builds every request of a run before the run starts: prompts (random,
//! ShareGPT, shared-prefix groups, multi-turn sessions), images, and the
//! serialized JSON body for the chosen endpoint. The hot path then only
//! clones a reference-counted `Bytes`.
//!
//! A run is a sequence of *units*: a unit is one request, or with
//! `--dataset multi-turn` one session whose turns are sent one after the
//! other (each turn resends the history: earlier user turns and synthetic
//! assistant replies of the sampled output length). Everything is derived
//! from `--seed`, so two runs with the same flags send the same bytes.

use std::path::Path;

use bytes::Bytes;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Normal};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::cli::{Args, DatasetKind, Endpoint, LengthDist};
use crate::error::{SetupError, SetupResult};
use crate::images::{ImageDir, encode_images, image_urls};
use crate::text::TokenCounter;

/// Output length when neither `--output-len` nor the dataset gives one.
pub const DEFAULT_OUTPUT_LEN: usize = 128;

/// What `/generate` prompts carry per image (models need their own image
/// placeholder in raw text; this is Qwen2-VL's, which smg's test model uses).
pub const GENERATE_IMAGE_PLACEHOLDER: &str = "<|vision_start|><|image_pad|><|vision_end|>";

/// One ready-to-send request.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    pub body: Bytes,
    /// Prompt tokens by our own count (tokenizer or approximation); the
    /// server's `usage` replaces it when present.
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub images: u32,
}

/// Every request of a run, grouped in units of `turns` consecutive requests.
#[derive(Debug)]
pub struct Workload {
    pub requests: Vec<PreparedRequest>,
    pub turns: usize,
    /// Units reserved for `--warmup` (the last ones).
    pub warmup_units: usize,
    /// Total bytes of generated images (before base64).
    pub image_bytes: u64,
    /// Keeps `file://` images on disk for the run.
    _image_dir: Option<ImageDir>,
}

impl Workload {
    /// Measured units (excluding warmup).
    pub fn units(&self) -> usize {
        self.requests.len() / self.turns - self.warmup_units
    }

    /// The requests of unit `unit` (measured units first, then warmup units).
    pub fn unit(&self, unit: usize) -> &[PreparedRequest] {
        &self.requests[unit * self.turns..(unit + 1) * self.turns]
    }

    pub fn warmup_unit(&self, i: usize) -> &[PreparedRequest] {
        self.unit(self.units() + i)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    User,
    Assistant,
}

/// One unit's conversation before serialization.
struct Conversation {
    /// Shared by all turns (the growing history).
    messages: Vec<(Role, String)>,
    /// Output length of each turn.
    output_lens: Vec<usize>,
}

/// Samples a token count from `dist` (at least 1).
pub fn sample_len(dist: &LengthDist, rng: &mut impl Rng) -> usize {
    let value = match *dist {
        LengthDist::Fixed { tokens } => return tokens.max(1),
        LengthDist::Uniform { min, max } => return rng.random_range(min..=max).max(1),
        LengthDist::Normal { mean, std } => Normal::new(mean, std)
            .map(|d| d.sample(rng))
            .unwrap_or(mean),
        LengthDist::Exp { mean } => Exp::new(1.0 / mean).map(|d| d.sample(rng)).unwrap_or(mean),
    };
    (value.round().max(1.0)) as usize
}

/// ShareGPT's layout; `role`/`content` spellings are accepted too.
#[derive(Deserialize)]
struct ShareGptEntry {
    #[serde(alias = "messages")]
    conversations: Vec<ShareGptTurn>,
}

#[derive(Deserialize)]
struct ShareGptTurn {
    #[serde(alias = "role")]
    from: String,
    #[serde(alias = "content")]
    value: String,
}

/// (prompt, reply) pairs from a ShareGPT file: each conversation's first
/// human turn and the reply after it.
pub fn load_sharegpt(path: &Path) -> SetupResult<Vec<(String, String)>> {
    let text = std::fs::read(path)
        .map_err(|e| SetupError::InvalidDataset(format!("cannot read {}: {e}", path.display())))?;
    let entries: Vec<ShareGptEntry> = serde_json::from_slice(&text).map_err(|e| {
        SetupError::InvalidDataset(format!(
            "{} is not a ShareGPT JSON array of {{\"conversations\": [{{\"from\", \"value\"}}]}}: {e}",
            path.display()
        ))
    })?;
    let pairs: Vec<(String, String)> = entries
        .into_iter()
        .filter_map(|entry| {
            let mut turns = entry.conversations.into_iter();
            let first = turns.next()?;
            let reply = turns.next()?;
            let human = matches!(first.from.as_str(), "human" | "user");
            (human && !first.value.is_empty() && !reply.value.is_empty())
                .then_some((first.value, reply.value))
        })
        .collect();
    if pairs.is_empty() {
        return Err(SetupError::InvalidDataset(format!(
            "{} has no conversation with a human turn followed by a reply",
            path.display()
        )));
    }
    Ok(pairs)
}

/// Builds the run's requests. `model` is the resolved model name.
pub fn build(args: &Args, model: &str, counter: &TokenCounter) -> SetupResult<Workload> {
    if args.image_count > 0 && args.endpoint == Endpoint::Completions {
        return Err(SetupError::UnsupportedWorkload(
            "images need --endpoint chat or generate (/v1/completions takes text only)".into(),
        ));
    }
    let extra = match &args.extra_body {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            _ => {
                return Err(SetupError::InvalidArgument(
                    "--extra-body must be a JSON object".into(),
                ));
            }
        },
    };
    let units = args.num_prompts + args.warmup;
    let turns = if args.dataset == DatasetKind::MultiTurn {
        args.turns.max(1)
    } else {
        1
    };
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let output_len = |rng: &mut ChaCha8Rng, fallback: Option<usize>| match &args.output_len {
        Some(dist) => sample_len(dist, rng),
        None => fallback.unwrap_or(DEFAULT_OUTPUT_LEN),
    };

    let conversations: Vec<Conversation> = match args.dataset {
        DatasetKind::Random => (0..units)
            .map(|_| {
                let len = sample_len(&args.input_len, &mut rng);
                let out = output_len(&mut rng, None);
                Conversation {
                    messages: vec![(Role::User, counter.random_text(&mut rng, len))],
                    output_lens: vec![out],
                }
            })
            .collect(),
        DatasetKind::SharedPrefix => {
            let groups = args.prefix_groups.max(1);
            let prefixes: Vec<String> = (0..groups)
                .map(|_| counter.random_text(&mut rng, args.prefix_len.max(1)))
                .collect();
            (0..units)
                .map(|i| {
                    let len = sample_len(&args.input_len, &mut rng);
                    let out = output_len(&mut rng, None);
                    let suffix = counter.random_text(&mut rng, len);
                    Conversation {
                        messages: vec![(Role::User, format!("{} {suffix}", prefixes[i % groups]))],
                        output_lens: vec![out],
                    }
                })
                .collect()
        }
        DatasetKind::MultiTurn => (0..units)
            .map(|_| {
                let mut messages = Vec::with_capacity(turns * 2);
                let mut output_lens = Vec::with_capacity(turns);
                for _ in 0..turns {
                    let len = sample_len(&args.input_len, &mut rng);
                    let out = output_len(&mut rng, None);
                    messages.push((Role::User, counter.random_text(&mut rng, len)));
                    messages.push((Role::Assistant, counter.random_text(&mut rng, out)));
                    output_lens.push(out);
                }
                Conversation {
                    messages,
                    output_lens,
                }
            })
            .collect(),
        DatasetKind::Sharegpt => {
            let path = args.dataset_path.as_deref().ok_or_else(|| {
                SetupError::InvalidArgument("--dataset sharegpt needs --dataset-path FILE".into())
            })?;
            let mut pairs = load_sharegpt(path)?;
            pairs.shuffle(&mut rng);
            (0..units)
                .map(|i| {
                    let (prompt, reply) = &pairs[i % pairs.len()];
                    let out = output_len(&mut rng, Some(counter.count(reply).max(1)));
                    Conversation {
                        messages: vec![(Role::User, prompt.clone())],
                        output_lens: vec![out],
                    }
                })
                .collect()
        }
    };

    // Images: one distinct image per (unit, slot) when unique, else one per slot.
    let distinct = match args.image_content {
        crate::cli::ImageContent::Unique => units * args.image_count,
        crate::cli::ImageContent::Repeated => args.image_count,
    };
    let image_seed = args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let encoded = if args.image_count > 0 {
        encode_images(
            distinct,
            args.image_resolution,
            args.image_format,
            image_seed,
        )?
    } else {
        Vec::new()
    };
    let image_bytes = encoded.iter().map(|i| i.len() as u64).sum();
    let image_dir = match args.image_transport {
        crate::cli::ImageTransport::FileUrl if args.image_count > 0 => {
            Some(ImageDir::open(args.image_dir.as_deref())?)
        }
        _ => None,
    };
    let urls = image_urls(
        &encoded,
        args.image_format,
        args.image_transport,
        image_dir.as_ref(),
        args.seed,
    )?;
    drop(encoded);

    let mut requests = Vec::with_capacity(units * turns);
    for (unit, conversation) in conversations.iter().enumerate() {
        let unit_images: Vec<&str> = (0..args.image_count)
            .map(|slot| match args.image_content {
                crate::cli::ImageContent::Unique => urls[unit * args.image_count + slot].as_str(),
                crate::cli::ImageContent::Repeated => urls[slot].as_str(),
            })
            .collect();
        for turn in 0..turns {
            // Turn t sends the history up to and including user message t.
            let history = &conversation.messages[..turn * 2 + 1];
            let max_tokens = conversation.output_lens[turn];
            let prompt_text: usize = history.iter().map(|(_, text)| counter.count(text)).sum();
            let body = request_body(args, model, history, &unit_images, max_tokens, &extra);
            requests.push(PreparedRequest {
                body: Bytes::from(body),
                prompt_tokens: u32::try_from(prompt_text).unwrap_or(u32::MAX),
                max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
                images: args.image_count as u32,
            });
        }
    }
    Ok(Workload {
        requests,
        turns,
        warmup_units: args.warmup,
        image_bytes,
        _image_dir: image_dir,
    })
}

/// Serializes one request for the chosen endpoint. Images go with the first
/// user message (chat) or as `image_data` with placeholders (generate).
fn request_body(
    args: &Args,
    model: &str,
    history: &[(Role, String)],
    images: &[&str],
    max_tokens: usize,
    extra: &Map<String, Value>,
) -> Vec<u8> {
    let flat_prompt = || -> String {
        if let [(Role::User, text)] = history {
            return text.clone();
        }
        let mut prompt = String::new();
        for (role, text) in history {
            let who = if *role == Role::User {
                "User"
            } else {
                "Assistant"
            };
            prompt.push_str(&format!("{who}: {text}\n\n"));
        }
        prompt.push_str("Assistant:");
        prompt
    };
    let mut body = match args.endpoint {
        Endpoint::Chat => {
            let messages: Vec<Value> =
                history
                    .iter()
                    .enumerate()
                    .map(|(i, (role, text))| {
                        let role = if *role == Role::User {
                            "user"
                        } else {
                            "assistant"
                        };
                        if i == 0 && !images.is_empty() {
                            let mut parts = vec![json!({"type": "text", "text": text})];
                            parts.extend(images.iter().map(
                                |url| json!({"type": "image_url", "image_url": {"url": url}}),
                            ));
                            json!({"role": role, "content": parts})
                        } else {
                            json!({"role": role, "content": text})
                        }
                    })
                    .collect();
            json!({"model": model, "messages": messages, "max_tokens": max_tokens})
        }
        Endpoint::Completions => {
            json!({"model": model, "prompt": flat_prompt(), "max_tokens": max_tokens})
        }
        Endpoint::Generate => {
            let mut sampling = json!({"max_new_tokens": max_tokens});
            if args.ignore_eos {
                sampling["ignore_eos"] = Value::Bool(true);
            }
            let mut text = GENERATE_IMAGE_PLACEHOLDER.repeat(images.len());
            text.push_str(&flat_prompt());
            let mut body = json!({"text": text, "sampling_params": sampling});
            if !images.is_empty() {
                body["image_data"] = json!(images);
            }
            body
        }
    };
    if args.endpoint != Endpoint::Generate {
        if args.ignore_eos {
            body["ignore_eos"] = Value::Bool(true);
        }
        if args.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
    }
    body["stream"] = Value::Bool(args.stream);
    if let Value::Object(map) = &mut body {
        for (key, value) in extra {
            map.insert(key.clone(), value.clone());
        }
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["smg-bench", "--num-prompts", "4", "--input-len", "16"];
        argv.extend_from_slice(extra);
        Args::parse_from(argv)
    }

    fn json_of(req: &PreparedRequest) -> Value {
        serde_json::from_slice(&req.body).unwrap()
    }

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_another_seed_does_not() {
        let counter = TokenCounter::Approximate;
        let a = build(&args(&["--seed", "3"]), "m", &counter).unwrap();
        let b = build(&args(&["--seed", "3"]), "m", &counter).unwrap();
        let c = build(&args(&["--seed", "4"]), "m", &counter).unwrap();
        let bodies = |w: &Workload| {
            w.requests
                .iter()
                .map(|r| r.body.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(bodies(&a), bodies(&b));
        assert_ne!(bodies(&a), bodies(&c));
        assert_eq!(a.units(), 4);
        let body = json_of(&a.requests[0]);
        assert_eq!(body["model"], "m");
        assert_eq!(body["max_tokens"], 128);
        assert_eq!(body["stream"], false);
        assert!(a.requests[0].prompt_tokens >= 16);
    }

    #[test]
    fn endpoints_get_their_own_body_shapes() {
        let counter = TokenCounter::Approximate;
        let chat = build(
            &args(&["--stream", "--ignore-eos", "--output-len", "8"]),
            "m",
            &counter,
        )
        .unwrap();
        let body = json_of(&chat.requests[0]);
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["max_tokens"], 8);
        let generate = build(
            &args(&[
                "--endpoint",
                "generate",
                "--output-len",
                "5",
                "--ignore-eos",
            ]),
            "m",
            &counter,
        )
        .unwrap();
        let body = json_of(&generate.requests[0]);
        assert!(body["text"].is_string());
        assert_eq!(body["sampling_params"]["max_new_tokens"], 5);
        assert_eq!(body["sampling_params"]["ignore_eos"], true);
        let completions = build(
            &args(&[
                "--endpoint",
                "completions",
                "--extra-body",
                r#"{"temperature":0}"#,
            ]),
            "m",
            &counter,
        )
        .unwrap();
        let body = json_of(&completions.requests[0]);
        assert!(body["prompt"].is_string());
        assert_eq!(body["temperature"], 0);
        let err = build(
            &args(&["--endpoint", "completions", "--image-count", "1"]),
            "m",
            &counter,
        )
        .unwrap_err();
        assert_eq!(err.code(), "unsupported_workload");
        let err = build(&args(&["--extra-body", "[1]"]), "m", &counter).unwrap_err();
        assert_eq!(err.code(), "invalid_argument");
    }

    #[test]
    fn shared_prefix_groups_share_their_prefix() {
        let counter = TokenCounter::Approximate;
        let w = build(
            &args(&[
                "--dataset",
                "shared-prefix",
                "--prefix-groups",
                "2",
                "--prefix-len",
                "32",
            ]),
            "m",
            &counter,
        )
        .unwrap();
        let prompt = |i: usize| {
            json_of(&w.requests[i])["messages"][0]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let head = |s: &str| s[..100].to_string();
        assert_eq!(head(&prompt(0)), head(&prompt(2)));
        assert_eq!(head(&prompt(1)), head(&prompt(3)));
        assert_ne!(head(&prompt(0)), head(&prompt(1)));
        assert_ne!(prompt(0), prompt(2), "suffixes differ");
    }

    #[test]
    fn multi_turn_sessions_resend_their_history() {
        let counter = TokenCounter::Approximate;
        let w = build(
            &args(&["--dataset", "multi-turn", "--turns", "3"]),
            "m",
            &counter,
        )
        .unwrap();
        assert_eq!(w.turns, 3);
        assert_eq!(w.units(), 4);
        let session = w.unit(1);
        let lens: Vec<usize> = session
            .iter()
            .map(|r| json_of(r)["messages"].as_array().unwrap().len())
            .collect();
        assert_eq!(lens, vec![1, 3, 5]);
        let last = json_of(&session[2]);
        let first = json_of(&session[0]);
        assert_eq!(last["messages"][0], first["messages"][0]);
        assert_eq!(last["messages"][1]["role"], "assistant");
        assert!(session[2].prompt_tokens > session[0].prompt_tokens);
    }

    #[test]
    fn images_are_unique_or_repeated_as_asked() {
        let counter = TokenCounter::Approximate;
        let url = |w: &Workload, i: usize, k: usize| {
            json_of(&w.requests[i])["messages"][0]["content"][1 + k]["image_url"]["url"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let common = [
            "--image-count",
            "2",
            "--image-resolution",
            "32x16",
            "--num-prompts",
            "2",
        ];
        let unique = build(&args(&common), "m", &counter).unwrap();
        assert!(url(&unique, 0, 0).starts_with("data:image/jpeg;base64,"));
        assert_ne!(url(&unique, 0, 0), url(&unique, 1, 0));
        assert_ne!(url(&unique, 0, 0), url(&unique, 0, 1));
        assert_eq!(unique.requests[0].images, 2);
        let mut repeated_args = common.to_vec();
        repeated_args.extend(["--image-content", "repeated", "--image-format", "png"]);
        let repeated = build(&args(&repeated_args), "m", &counter).unwrap();
        assert!(url(&repeated, 0, 0).starts_with("data:image/png;base64,"));
        assert_eq!(url(&repeated, 0, 0), url(&repeated, 1, 0));
        let generate_args = [&common[..], &["--endpoint", "generate"]].concat();
        let generate = build(&args(&generate_args), "m", &counter).unwrap();
        let body = json_of(&generate.requests[0]);
        assert_eq!(body["image_data"].as_array().unwrap().len(), 2);
        assert!(
            body["text"]
                .as_str()
                .unwrap()
                .starts_with(GENERATE_IMAGE_PLACEHOLDER)
        );
    }

    #[test]
    fn sharegpt_uses_first_human_turn_and_reply_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sg.json");
        std::fs::write(
            &path,
            r#"[{"conversations":[{"from":"human","value":"hello there"},{"from":"gpt","value":"0123456789abcdef"}]},
                {"conversations":[{"from":"gpt","value":"skipped: no human first"}]}]"#,
        )
        .unwrap();
        let counter = TokenCounter::Approximate;
        let p = path.to_str().unwrap();
        let w = build(
            &args(&["--dataset", "sharegpt", "--dataset-path", p]),
            "m",
            &counter,
        )
        .unwrap();
        let body = json_of(&w.requests[3]);
        assert_eq!(body["messages"][0]["content"], "hello there");
        assert_eq!(body["max_tokens"], 4, "16 bytes of reply -> 4 tokens");
        std::fs::write(&path, "{}").unwrap();
        let err = build(
            &args(&["--dataset", "sharegpt", "--dataset-path", p]),
            "m",
            &counter,
        )
        .unwrap_err();
        assert_eq!(err.code(), "invalid_dataset");
    }
}
