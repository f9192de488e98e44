//! What a Responses request pays the history store, per backend: saving a
//! response (one upsert transaction) and loading a 10-step chain (the
//! `previous_response_id` replay, one recursive query).
//!
//! Postgres runs on the tests' private server (`tests/support/postgres.rs`,
//! or `SMG_TEST_POSTGRES_URL`), sqlite on a temp-dir file: loopback and a
//! local disk, so the numbers are the store's own cost plus a round trip.
//! Run: `cargo bench -p smg-history` (`-- --quick` for a short run).

use std::{
    hint::black_box,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::json;
use smg_history::{HistoryConfig, HistoryStore, StoredResponse, open};
use tokio::runtime::Runtime;

#[path = "../tests/support/postgres.rs"]
mod pg_server;

const CHAIN_STEPS: usize = 10;

fn response(id: &str, previous: Option<&str>) -> StoredResponse {
    StoredResponse {
        id: id.to_owned(),
        previous_response_id: previous.map(str::to_owned),
        conversation_id: None,
        model: "bench-model".to_owned(),
        status: "completed".to_owned(),
        created_at: 1_700_000_000,
        input: json!([{"id": format!("msg_in_{id}"), "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is the capital of France? ".repeat(8)}]}]),
        output: json!([{"id": format!("msg_out_{id}"), "type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "Paris is the capital of France. ".repeat(16)}]}]),
        raw: json!({"id": id, "object": "response", "status": "completed", "model": "bench-model",
            "usage": {"input_tokens": 64, "output_tokens": 128, "total_tokens": 192}}),
        owner: None,
    }
}

/// The three backends, each opened fresh (the temp dir outlives the run).
fn stores(rt: &Runtime, dir: &tempfile::TempDir) -> Vec<Arc<dyn HistoryStore>> {
    rt.block_on(async {
        let configs = [
            HistoryConfig::Memory,
            HistoryConfig::Sqlite {
                path: dir.path().join("bench.db"),
            },
            HistoryConfig::Postgres {
                url: pg_server::fresh_database().await,
                max_connections: 4,
                connect_timeout: Duration::from_secs(5),
            },
        ];
        let mut stores = Vec::new();
        for config in &configs {
            match open(config).await {
                Ok(store) => stores.push(store),
                Err(err) => panic!("cannot open {config:?}: {err}"),
            }
        }
        stores
    })
}

fn bench(c: &mut Criterion) {
    let rt = match Runtime::new() {
        Ok(rt) => rt,
        Err(err) => panic!("no tokio runtime: {err}"),
    };
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let stores = stores(&rt, &dir);
    let next = AtomicU64::new(0);

    let mut group = c.benchmark_group("save_response");
    for store in &stores {
        group.bench_function(store.backend(), |b| {
            // A new id each time (an insert, not an update); building the
            // response is not timed.
            b.iter_batched(
                || {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    response(&format!("resp_save_{n}"), Some("resp_save_prev"))
                },
                |step| rt.block_on(store.save_response(black_box(&step), &[])),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();

    let mut group = c.benchmark_group("response_chain_10");
    for store in &stores {
        let names: Vec<String> = (0..CHAIN_STEPS)
            .map(|i| format!("resp_chain_{i}"))
            .collect();
        for (i, name) in names.iter().enumerate() {
            let previous = i.checked_sub(1).map(|p| names[p].as_str());
            if let Err(err) = rt.block_on(store.save_response(&response(name, previous), &[])) {
                panic!("cannot save the chain on {}: {err}", store.backend());
            }
        }
        let newest = &names[CHAIN_STEPS - 1];
        match rt.block_on(store.response_chain(newest, CHAIN_STEPS)) {
            Ok(chain) => assert_eq!(chain.len(), CHAIN_STEPS, "{}", store.backend()),
            Err(err) => panic!("cannot load the chain on {}: {err}", store.backend()),
        }
        group.bench_function(store.backend(), |b| {
            b.iter(|| rt.block_on(store.response_chain(black_box(newest), CHAIN_STEPS)));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
