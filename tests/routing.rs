//! Routing quality through real processes: a shared-prefix chat workload
//! (several long system prompts, many users each) sent through `smg` to four
//! simulated workers, whose page-aligned prefix caches report how many
//! prompt tokens were already cached. Cache-aware routing must hit the cache
//! more than round robin. The hit rates are printed (see BENCHMARKS.md).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Gateway, SimWorker};

const WORKERS: usize = 4;
/// Coprime with `WORKERS`, so round robin does not align prefixes with
/// workers by accident.
const PREFIXES: usize = 7;
const USERS: usize = 8;

/// A system prompt of several hundred tokens (longer than prefix_hash's
/// 256-token key), distinct per `index`.
fn system_prompt(index: usize) -> String {
    (0..100)
        .map(|word| format!("rule{index}x{word}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends the workload through a gateway with `policy`; returns the share of
/// prompt tokens the workers had cached.
async fn hit_rate(policy: &str) -> f64 {
    let workers: Vec<SimWorker> = (0..WORKERS)
        .map(|_| SimWorker::start("tokenspeed", "regular", &["--zero-delay"]))
        .collect();
    let urls: Vec<String> = workers.iter().map(SimWorker::grpc_url).collect();
    let mut args = vec![
        "--served-model-name",
        "model",
        "--policy",
        policy,
        "--worker-urls",
    ];
    args.extend(urls.iter().map(String::as_str));
    let gateway = Gateway::start(&args);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (mut cached, mut prompt) = (0u64, 0u64);
    // Users arrive interleaved across system prompts, as traffic does.
    for user in 0..USERS {
        for prefix in 0..PREFIXES {
            let body = json!({
                "model": "model",
                "max_tokens": 2,
                "messages": [
                    {"role": "system", "content": system_prompt(prefix)},
                    {"role": "user", "content": format!("question {user} about {prefix}")},
                ],
            });
            let response = client
                .post(gateway.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200);
            let answer: Value = response.json().await.unwrap();
            prompt += answer["usage"]["prompt_tokens"].as_u64().unwrap();
            cached += answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
        }
    }
    cached as f64 / prompt as f64
}

#[tokio::test]
async fn cache_aware_routing_hits_the_prefix_cache_more_than_round_robin() {
    let cache_aware = hit_rate("cache_aware").await;
    let round_robin = hit_rate("round_robin").await;
    let prefix_hash = hit_rate("prefix_hash").await;
    println!(
        "prefix-cache hit rate over {} requests, {WORKERS} workers, {PREFIXES} system prompts: \
         cache_aware {:.1}%, prefix_hash {:.1}%, round_robin {:.1}%",
        PREFIXES * USERS,
        cache_aware * 100.0,
        prefix_hash * 100.0,
        round_robin * 100.0
    );
    assert!(
        cache_aware > round_robin + 0.1,
        "cache_aware {cache_aware:.3} vs round_robin {round_robin:.3}"
    );
    assert!(
        prefix_hash > round_robin,
        "prefix_hash {prefix_hash:.3} vs round_robin {round_robin:.3}"
    );
}
