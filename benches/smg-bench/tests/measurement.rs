//! smg-bench measured against the scripted fixture server, whose timings and
//! faults are known: the computed TTFT/ITL/E2E match the injected delays,
//! a server stall shows up in latency measured from the schedule
//! (coordinated omission), failures are counted by class without stopping
//! the run, and a seed reproduces the schedule.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use clap::Parser;
use smg_bench::cli::Args;
use smg_bench::fixture::{FIXTURE_PROMPT_TOKENS, FixtureConfig, FixtureServer};
use smg_bench::record::{RequestRecord, TokenSource};
use smg_bench::run::{self, Report};

fn args(server: &FixtureServer, extra: &[&str]) -> Args {
    let url = server.url();
    let mut argv = vec![
        "smg-bench",
        "--base-url",
        url.as_str(),
        "--input-len",
        "8",
        "--no-progress",
    ];
    argv.extend_from_slice(extra);
    Args::parse_from(argv)
}

async fn run_against(server: &FixtureServer, extra: &[&str]) -> Report {
    run::run(args(server, extra)).await.unwrap()
}

fn records(report: &Report) -> &[RequestRecord] {
    &report.points[0].records
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Slack above an injected delay: server timers fire up to ~1 ms late and
/// the machine may be busy; a delay is never early.
const SLACK_MS: f64 = 25.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_timings_match_the_injected_delays_on_every_endpoint() {
    let server = FixtureServer::start(FixtureConfig {
        ttft: Duration::from_millis(50),
        itl: Duration::from_millis(10),
        tokens: 8,
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let common = ["--stream", "--num-prompts", "4", "--max-concurrency", "4"];
    let for_endpoint = |e: &str| args(&server, &[&common[..], &["--endpoint", e]].concat());
    let (chat, completions, generate) = tokio::join!(
        run::run(for_endpoint("chat")),
        run::run(for_endpoint("completions")),
        run::run(for_endpoint("generate")),
    );
    let (chat, completions, generate) = (chat.unwrap(), completions.unwrap(), generate.unwrap());
    assert_eq!(chat.model, "fixture-model", "discovered from /v1/models");
    for (name, report) in [
        ("chat", &chat),
        ("completions", &completions),
        ("generate", &generate),
    ] {
        let recs = records(report);
        assert_eq!(recs.len(), 4, "{name}");
        for r in recs {
            assert!(r.ok, "{name}: {:?}", r.error);
            // The chat role-only chunk at t=0 is not the first token.
            let ttft = r.ttft_ms.unwrap();
            assert!(
                (50.0..50.0 + SLACK_MS).contains(&ttft),
                "{name} ttft {ttft}"
            );
            assert!(
                (120.0..120.0 + SLACK_MS).contains(&r.e2e_ms),
                "{name} e2e {}",
                r.e2e_ms
            );
            assert_eq!(r.itl_ms.len(), 7, "{name}: every gap between 8 tokens");
            let sum: f64 = r.itl_ms.iter().sum();
            assert!(
                (70.0 - SLACK_MS..70.0 + SLACK_MS).contains(&sum),
                "{name} itl sum {sum}"
            );
            let tpot = r.tpot_ms.unwrap();
            assert!((8.0..13.0).contains(&tpot), "{name} tpot {tpot}");
            assert_eq!(r.output_tokens, 8);
            assert_eq!(r.output_token_source, TokenSource::Server);
            assert_eq!(r.prompt_tokens, FIXTURE_PROMPT_TOKENS);
        }
        let itl = median(recs.iter().flat_map(|r| r.itl_ms.clone()).collect());
        assert!((9.0..13.0).contains(&itl), "{name} median itl {itl}");
        let s = &report.points[0].summary;
        assert_eq!((s.completed, s.failed), (4, 0));
        assert_eq!(s.output_tokens, 32);
        let ttft = s.ttft_ms.unwrap();
        assert!(ttft.p50 >= 50.0 && ttft.max < 50.0 + SLACK_MS);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_latency_and_fallback_token_counts() {
    let server = FixtureServer::start(FixtureConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(10),
        tokens: 8,
        no_usage: true,
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let report = run_against(&server, &["--num-prompts", "3", "--endpoint", "generate"]).await;
    for r in records(&report) {
        assert!(r.ok);
        assert!(r.ttft_ms.is_none() && r.itl_ms.is_empty());
        assert!(
            (100.0..100.0 + SLACK_MS).contains(&r.e2e_ms),
            "e2e {}",
            r.e2e_ms
        );
        // "tok " x 8 = 32 bytes = 8 approximate tokens.
        assert_eq!(
            (r.output_tokens, r.output_token_source),
            (8, TokenSource::Approximate)
        );
        assert_eq!(r.prompt_token_source, TokenSource::Approximate);
    }
    // Streams without usage: one token per token-bearing event.
    let report = run_against(&server, &["--num-prompts", "2", "--stream"]).await;
    for r in records(&report) {
        assert_eq!(
            (r.output_tokens, r.output_token_source),
            (8, TokenSource::Approximate)
        );
    }
    // With a tokenizer, the fallback is the real count of the generated text.
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/model");
    let report = run_against(
        &server,
        &["--num-prompts", "2", "--stream", "--tokenizer", model],
    )
    .await;
    for r in records(&report) {
        assert_eq!(r.output_token_source, TokenSource::Tokenizer);
        assert_eq!(r.prompt_token_source, TokenSource::Tokenizer);
        assert_eq!(r.prompt_tokens, 8, "prompts sized by the tokenizer");
        assert!(r.output_tokens >= 8, "{}", r.output_tokens);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stall_shows_in_latency_measured_from_the_schedule() {
    // One slot, 100 req/s nearly evenly spaced; request 5 stalls 300 ms.
    // A closed-loop tool would see one slow request; measured from the
    // schedule, everything due during the stall is late too.
    let server = FixtureServer::start(FixtureConfig {
        tokens: 1,
        stall_request: 5,
        stall: Duration::from_millis(300),
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let report = run_against(
        &server,
        &[
            "--num-prompts",
            "60",
            "--request-rate",
            "100",
            "--burstiness",
            "1000",
            "--max-concurrency",
            "1",
            "--model",
            "m",
        ],
    )
    .await;
    let recs = records(&report);
    assert_eq!(recs.len(), 60);
    let slow_from_schedule = recs.iter().filter(|r| r.e2e_ms > 100.0).count();
    let slow_from_send = recs
        .iter()
        .filter(|r| (r.end_s - r.sent_s) * 1e3 > 100.0)
        .count();
    assert_eq!(
        slow_from_send, 1,
        "only the stalled request itself was slow to serve"
    );
    assert!(
        slow_from_schedule >= 15,
        "{slow_from_schedule} late requests from the schedule"
    );
    let s = &report.points[0].summary;
    assert!(s.e2e_ms.unwrap().max >= 300.0);
    assert!(
        s.schedule_lag_ms.unwrap().max >= 200.0,
        "the wait for the slot is reported"
    );
    assert!(s.e2e_ms.unwrap().p90 > 100.0, "the stall is in the tail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_by_class_and_the_run_goes_on() {
    let server = FixtureServer::start(FixtureConfig {
        tokens: 3,
        error_every: 5,
        error_status: 503,
        malformed_every: 7,
        truncate_every: 11,
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let report = run_against(
        &server,
        &[
            "--num-prompts",
            "60",
            "--stream",
            "--max-concurrency",
            "1",
            "--model",
            "m",
        ],
    )
    .await;
    let s = &report.points[0].summary;
    // Request n (1-based): n%5 -> 503; else n%7 -> malformed; else n%11 -> truncated.
    assert_eq!(s.errors.get("http_503:overloaded"), Some(&12));
    assert_eq!(s.errors.get("malformed_sse"), Some(&7));
    assert_eq!(s.errors.get("incomplete_stream"), Some(&4));
    assert_eq!((s.completed, s.failed), (37, 23));
    let failed = records(&report).iter().find(|r| r.status == 503).unwrap();
    assert_eq!(failed.error.as_deref(), Some("http_503:overloaded"));

    // Nothing listening: every request fails to connect, the run still ends.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let report = run::run(Args::parse_from([
        "smg-bench",
        "--base-url",
        &url,
        "--model",
        "m",
        "--num-prompts",
        "3",
        "--no-progress",
    ]))
    .await
    .unwrap();
    assert_eq!(
        report.points[0].summary.errors.get("connect_failed"),
        Some(&3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_reproduces_the_schedule() {
    let server = FixtureServer::start(FixtureConfig {
        tokens: 1,
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let schedule = |r: &Report| records(r).iter().map(|r| r.scheduled_s).collect::<Vec<_>>();
    let flags = [
        "--num-prompts",
        "20",
        "--request-rate",
        "400",
        "--model",
        "m",
    ];
    let a = run_against(&server, &[&flags[..], &["--seed", "1"]].concat()).await;
    let b = run_against(&server, &[&flags[..], &["--seed", "1"]].concat()).await;
    let c = run_against(&server, &[&flags[..], &["--seed", "2"]].concat()).await;
    assert_eq!(schedule(&a), schedule(&b));
    assert_ne!(schedule(&a), schedule(&c));
    assert_eq!(schedule(&a)[0], 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_sessions_send_turns_in_order_and_duration_bounds_a_run() {
    let server = FixtureServer::start(FixtureConfig {
        itl: Duration::from_millis(2),
        tokens: 2,
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let report = run_against(
        &server,
        &[
            "--dataset",
            "multi-turn",
            "--turns",
            "3",
            "--num-prompts",
            "2",
            "--model",
            "m",
        ],
    )
    .await;
    let recs = records(&report);
    assert_eq!(recs.len(), 6);
    for unit in 0..2 {
        let mut turns: Vec<&RequestRecord> = recs.iter().filter(|r| r.unit == unit).collect();
        turns.sort_by_key(|r| r.turn);
        assert_eq!(
            turns.iter().map(|r| r.turn).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        for pair in turns.windows(2) {
            assert!(
                pair[1].scheduled_s >= pair[0].end_s,
                "a turn waits for the previous answer"
            );
        }
    }

    let report = run_against(
        &server,
        &[
            "--duration",
            "0.3",
            "--request-rate",
            "100",
            "--num-prompts",
            "5",
            "--model",
            "m",
        ],
    )
    .await;
    let recs = records(&report);
    assert!(
        (15..=50).contains(&recs.len()),
        "{} requests in 0.3 s at 100/s",
        recs.len()
    );
    assert!(recs.iter().all(|r| r.scheduled_s <= 0.3));
    assert!(recs.iter().all(|r| r.ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_closed_while_idle_are_replaced() {
    // The server drops keep-alive connections idle for 30 ms; requests come
    // every ~100 ms on one slot, so each finds its connection closed.
    let server = FixtureServer::start(FixtureConfig {
        tokens: 1,
        idle_close: Some(Duration::from_millis(30)),
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let report = run_against(
        &server,
        &[
            "--num-prompts",
            "4",
            "--request-rate",
            "10",
            "--burstiness",
            "1000",
            "--max-concurrency",
            "1",
            "--model",
            "m",
        ],
    )
    .await;
    let s = &report.points[0].summary;
    assert_eq!((s.completed, s.failed), (4, 0), "{:?}", s.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_ready_holds_the_run_until_readiness_answers_200() {
    // /readiness answers 503 three times, then 200: the run starts after.
    let server = FixtureServer::start(FixtureConfig {
        tokens: 2,
        unready_probes: 3,
        ..FixtureConfig::default()
    })
    .await
    .unwrap();
    let report = run_against(&server, &["--num-prompts", "2", "--wait-ready", "30"]).await;
    assert_eq!(report.points[0].summary.completed, 2);

    // Nothing listening: a clear setup error once the wait is over.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = run::run(Args::parse_from([
        "smg-bench",
        "--base-url",
        &url,
        "--model",
        "m",
        "--wait-ready",
        "0.3",
        "--no-progress",
    ]))
    .await
    .unwrap_err();
    assert_eq!(err.code(), "server_not_ready");
    assert!(
        err.to_string().contains("/readiness") && err.to_string().contains("--wait-ready"),
        "{err}"
    );
}
