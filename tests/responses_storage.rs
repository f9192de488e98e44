//! The Responses API on the stores a deployment keeps its history in, end to
//! end: a sqlite file that outlives the gateway process, one PostgreSQL
//! database shared by two gateways at once, a PostgreSQL server that goes
//! away and comes back under a running gateway, one that goes away while a
//! streamed response is in the middle of its stream (so its save fails),
//! `--history-backend none`, a cancel sent to a gateway that does not run
//! the response (postgres and a shared sqlite file), and the start-up
//! failures of a postgres backend that is misconfigured or out of reach.
//!
//! Why it exists: `tests/responses.rs` proves the API on the memory backend
//! inside one process; what a user of sqlite or postgres relies on is that a
//! chain made by one gateway process is replayed by another. The proof is
//! the sim worker's digest, as there: a response continuing a chain must be
//! answered with the digest of a chat completion carrying the whole history
//! as messages.
//!
//! PostgreSQL is the history crate's private test server
//! (`history/tests/support/postgres.rs`), started by this binary; there is
//! no skip when it cannot be had.

mod support;

#[path = "../history/tests/support/postgres.rs"]
mod postgres;

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use smg::proto::tokenspeed_scheduler as ts;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use support::chat::http;
use support::media::{metric, metrics_text};
use support::responses::{chat_text, digest, get, names, output_text, parse_events, post, send};
use support::{Gateway, SimWorker, bounded, poll_until};

/// A zero-delay worker serving the fixture model as `model`, and the flags
/// naming it.
fn worker() -> (SimWorker, Vec<String>) {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let flags = vec![
        "--worker-urls".to_owned(),
        worker.grpc_url(),
        "--served-model-name".to_owned(),
        "model".to_owned(),
    ];
    (worker, flags)
}

/// A gateway on `fleet` with the history flags `history`.
fn gateway(fleet: &[String], history: &[&str]) -> Gateway {
    let mut args: Vec<&str> = fleet.iter().map(String::as_str).collect();
    args.extend(history);
    Gateway::start(&args)
}

/// A whole response that must succeed.
async fn create(gateway: &Gateway, body: Value) -> Value {
    let (status, response) = post(gateway, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "completed", "{response}");
    response
}

/// A response to `input` continuing `previous` (none: a new chain).
async fn step(gateway: &Gateway, input: &str, previous: Option<&Value>) -> Value {
    let mut body = json!({"input": input, "max_output_tokens": 64});
    if let Some(previous) = previous {
        body["previous_response_id"] = previous["id"].clone();
    }
    create(gateway, body).await
}

/// Asserts that `last` saw the chain `steps` (input, response; the last
/// one is `last` itself) as its prompt: its digest is that of a chat
/// completion over the same turns, asked of `gateway`.
async fn assert_replayed(gateway: &Gateway, steps: &[(&str, &Value)]) {
    let mut messages = Vec::new();
    for (index, (input, response)) in steps.iter().enumerate() {
        messages.push(json!({"role": "user", "content": input}));
        if index + 1 < steps.len() {
            messages.push(json!({"role": "assistant", "content": output_text(response)}));
        }
    }
    let (_, last) = steps.last().expect("a step");
    assert_eq!(
        digest(&output_text(last)),
        digest(&chat_text(gateway, Value::Array(messages)).await),
        "the last response's prompt held the whole chain"
    );
}

/// The error code of an error body.
fn code(body: &Value) -> Option<&str> {
    body["error"]["code"].as_str()
}

#[tokio::test]
async fn a_sqlite_history_survives_a_gateway_restart() {
    let (_worker, fleet) = worker();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("h.sqlite3");
    let file = file.to_str().expect("a UTF-8 path");
    let history = ["--history-backend", "sqlite", "--history-path", file];

    let first_gateway = gateway(&fleet, &history);
    let first = step(&first_gateway, "one", None).await;
    // Killed (SIGKILL), not shut down: what was answered was on disk.
    drop(first_gateway);

    let second_gateway = gateway(&fleet, &history);
    let id = first["id"].as_str().expect("id");
    let (status, stored) = get(&second_gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored, first, "the restarted gateway answers it unchanged");
    let second = step(&second_gateway, "two", Some(&first)).await;
    assert_eq!(second["previous_response_id"], first["id"]);
    assert_replayed(&second_gateway, &[("one", &first), ("two", &second)]).await;
    // Without the stored chain the prompt, and so the digest, would differ.
    let alone = step(&second_gateway, "two", None).await;
    assert_ne!(digest(&output_text(&alone)), digest(&output_text(&second)));
}

/// A worker that stalls every stream after two tokens (a background
/// response on it stays `in_progress` until its gateway goes), and its
/// flags.
fn stalling_worker() -> (SimWorker, Vec<String>) {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--stall-after-tokens", "2"],
    );
    let flags = vec![
        "--worker-urls".to_owned(),
        worker.grpc_url(),
        "--served-model-name".to_owned(),
        "model".to_owned(),
    ];
    (worker, flags)
}

/// Starts a background response on `gateway` and returns its id once a
/// poll reads it `in_progress` (it runs, its row is written).
async fn running_in_background(gateway: &Gateway) -> String {
    let body = json!({"input": "go on", "max_output_tokens": 100, "background": true});
    let (status, queued) = post(gateway, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{queued}");
    let id = queued["id"].as_str().expect("id").to_owned();
    poll_until("the background response runs", async || {
        let (_, polled) = get(gateway, &format!("/v1/responses/{id}")).await;
        (polled["status"] == "in_progress").then_some(())
    })
    .await;
    id
}

/// The orphan's stored object: failed, with the documented code.
fn assert_orphaned(stored: &Value) {
    assert_eq!(stored["status"], "failed", "{stored}");
    assert_eq!(stored["error"]["code"], "response_orphaned", "{stored}");
    let message = stored["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the gateway running this response stopped before it finished"),
        "{stored}"
    );
}

/// A gateway killed (SIGKILL) while a background response runs leaves its
/// row `in_progress`; the gateway started again on the same file and
/// instance name ends it as failed (`response_orphaned`) before it serves
/// (and counts it in `smg_history_orphans_ended_total`), and leaves a
/// finished response as it was.
#[tokio::test]
async fn a_restart_ends_the_background_responses_its_previous_life_left_running() {
    let (_worker, fleet) = stalling_worker();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("h.sqlite3");
    let file = file.to_str().expect("a UTF-8 path");
    let history = [
        "--history-backend",
        "sqlite",
        "--history-path",
        file,
        "--history-instance",
        "gateway-1",
    ];

    let first_gateway = gateway(&fleet, &history);
    // Ended (cut at its two tokens) before the kill.
    let (status, done) = post(
        &first_gateway,
        "/v1/responses",
        &json!({"input": "short", "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(
        (status, &done["status"]),
        (200, &json!("incomplete")),
        "{done}"
    );
    let id = running_in_background(&first_gateway).await;
    drop(first_gateway);

    let second_gateway = gateway(&fleet, &history);
    let (status, stored) = get(&second_gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{stored}");
    assert_orphaned(&stored);
    // Counted, as ended by the restart.
    let text = metrics_text(&second_gateway).await;
    let ended = |by: &str| {
        let by = format!("by=\"{by}\"");
        metric(
            &text,
            "smg_history_orphans_ended_total",
            &["backend=\"sqlite\"", &by],
        )
    };
    assert_eq!((ended("restart"), ended("lease")), (1.0, 0.0), "{text}");
    assert_eq!(stored["id"], id.as_str());
    assert_eq!(stored["background"], true);
    let (status, cancel) = post(
        &second_gateway,
        &format!("/v1/responses/{id}/cancel"),
        &json!({}),
    )
    .await;
    assert_eq!(
        (status, code(&cancel)),
        (400, Some("response_not_cancellable"))
    );
    let done_id = done["id"].as_str().expect("id");
    let (_, stored) = get(&second_gateway, &format!("/v1/responses/{done_id}")).await;
    assert_eq!(stored, done, "a finished response is left as it was");
}

/// Two replicas share one PostgreSQL, each running a background response.
/// B is killed and starts again under its name: its own orphan is ended,
/// A's response (A is alive, its lease fresh) is left running, and A still
/// owns it: A's cancel ends it as cancelled.
#[tokio::test]
async fn a_restarted_replica_ends_its_own_orphans_never_a_live_replicas() {
    let url = postgres::fresh_database().await;
    let (_worker, fleet) = stalling_worker();
    let named = |name: &'static str| {
        [
            "--history-backend",
            "postgres",
            "--history-url",
            url.as_str(),
            "--history-instance",
            name,
        ]
    };
    let a = gateway(&fleet, &named("replica-a"));
    let b = gateway(&fleet, &named("replica-b"));
    let of_a = running_in_background(&a).await;
    let of_b = running_in_background(&b).await;
    drop(b);

    let b = gateway(&fleet, &named("replica-b"));
    let (_, stored) = get(&b, &format!("/v1/responses/{of_b}")).await;
    assert_orphaned(&stored);
    let (_, stored) = get(&b, &format!("/v1/responses/{of_a}")).await;
    assert_eq!(stored["status"], "in_progress", "{stored}");
    let (status, cancelled) = post(&a, &format!("/v1/responses/{of_a}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let (_, stored) = get(&b, &format!("/v1/responses/{of_a}")).await;
    assert_eq!(stored["status"], "cancelled", "{stored}");
}

/// How many requests the sim worker at `url` runs (its scheduler's load).
async fn running_requests(url: &str) -> i32 {
    let mut client = TokenSpeedSchedulerClient::connect(url.to_owned())
        .await
        .expect("connect");
    client
        .get_loads(ts::GetLoadsRequest {
            dp_rank: None,
            include: vec![],
        })
        .await
        .expect("loads")
        .into_inner()
        .aggregate
        .map_or(-1, |loads| loads.total_running_reqs)
}

/// A background response runs on gateway `a`; its cancel is sent to `b`,
/// which shares the store but does not run it. `b` answers with the
/// response as it ended: `cancelled`, stopped where it runs (the worker's
/// leg is aborted) and stored so, as every gateway reads it; a second
/// cancel finds it over.
async fn assert_cancelled_through_another_gateway(a: &Gateway, b: &Gateway, worker: &SimWorker) {
    let id = running_in_background(a).await;
    poll_until("the worker runs the request", async || {
        (running_requests(&worker.url()).await == 1).then_some(())
    })
    .await;
    let (status, cancelled) = post(b, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["id"], id.as_str());
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    poll_until("the worker's request is aborted", async || {
        (running_requests(&worker.url()).await == 0).then_some(())
    })
    .await;
    for gateway in [a, b] {
        let (_, stored) = get(gateway, &format!("/v1/responses/{id}")).await;
        assert_eq!(stored, cancelled);
    }
    let (status, again) = post(b, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(
        (status, code(&again)),
        (400, Some("response_not_cancellable")),
        "{again}"
    );
}

/// Two replicas on one PostgreSQL: a cancel sent to the one that does not
/// run the response is recorded in the store and notified; the owner
/// cancels it (see [`assert_cancelled_through_another_gateway`]).
#[tokio::test]
async fn a_cancel_sent_to_another_postgres_replica_stops_the_response_where_it_runs() {
    let url = postgres::fresh_database().await;
    let (worker, fleet) = stalling_worker();
    let history = ["--history-backend", "postgres", "--history-url", &url];
    let a = gateway(
        &fleet,
        &[&history[..], &["--history-instance", "replica-a"]].concat(),
    );
    let b = gateway(
        &fleet,
        &[&history[..], &["--history-instance", "replica-b"]].concat(),
    );
    assert_cancelled_through_another_gateway(&a, &b, &worker).await;
    // And the other way round.
    assert_cancelled_through_another_gateway(&b, &a, &worker).await;
}

/// Two gateways on one sqlite file (one host): sqlite pushes no notice,
/// so the owner finds the request on its heartbeat, and cancels as above.
#[tokio::test]
async fn a_cancel_sent_to_another_gateway_on_one_sqlite_file_is_found_on_a_heartbeat() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("h.sqlite3");
    let file = file.to_str().expect("a UTF-8 path");
    let (worker, fleet) = stalling_worker();
    let history = ["--history-backend", "sqlite", "--history-path", file];
    let a = gateway(&fleet, &history);
    let b = gateway(&fleet, &history);
    assert_cancelled_through_another_gateway(&a, &b, &worker).await;
}

#[tokio::test]
async fn two_gateways_share_one_postgres_history() {
    let url = postgres::fresh_database().await;
    let (_worker, fleet) = worker();
    let history = ["--history-backend", "postgres", "--history-url", &url];
    // Started together: the schema is migrated once, under the lock.
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| gateway(&fleet, &history));
        let b = scope.spawn(|| gateway(&fleet, &history));
        (
            a.join().expect("gateway A starts"),
            b.join().expect("gateway B starts"),
        )
    });

    // A chain that alternates between the gateways.
    let one = step(&a, "one", None).await;
    let two = step(&b, "two", Some(&one)).await;
    let three = step(&a, "three", Some(&two)).await;
    assert_replayed(&a, &[("one", &one), ("two", &two), ("three", &three)]).await;
    assert_replayed(&b, &[("one", &one), ("two", &two)]).await;
    let id = three["id"].as_str().expect("id");
    let (status, stored) = get(&b, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored, three);

    // A conversation made on A, added to on B, answered on A, listed on B.
    let (status, conversation) = post(
        &a,
        "/v1/conversations",
        &json!({"items": [{"type": "message", "role": "user", "content": "first"}]}),
    )
    .await;
    assert_eq!(status, 200, "{conversation}");
    let conversation_id = conversation["id"].as_str().expect("id");
    let items_path = format!("/v1/conversations/{conversation_id}/items");
    let (status, added) = post(
        &b,
        &items_path,
        &json!({"items": [
            {"role": "assistant", "content": "FIRST"},
            {"role": "user", "content": "second"},
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    let response = create(
        &a,
        json!({"input": "third", "conversation": conversation_id, "max_output_tokens": 64}),
    )
    .await;
    let turns = json!([
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "FIRST"},
        {"role": "user", "content": "second"},
        {"role": "user", "content": "third"},
    ]);
    assert_eq!(
        digest(&output_text(&response)),
        digest(&chat_text(&b, turns).await),
        "A's response saw the items B added"
    );
    let (status, listed) = get(&b, &format!("{items_path}?order=asc")).await;
    assert_eq!(status, 200, "{listed}");
    let texts: Vec<&str> = listed["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|item| item["content"][0]["text"].as_str().unwrap_or_default())
        .collect();
    let answer = output_text(&response);
    assert_eq!(
        texts,
        ["first", "FIRST", "second", "third", answer.as_str()]
    );
}

/// Polls `GET /v1/responses/{id}` until the store answers it (a server
/// started again is found back by the gateway's next probe), and returns
/// that answer.
async fn once_the_store_answers(gateway: &Gateway, id: &str) -> (u16, Value) {
    poll_until("the gateway to find the store back", async || {
        let (status, body) = get(gateway, &format!("/v1/responses/{id}")).await;
        (status != 503).then_some((status, body))
    })
    .await
}

/// The PostgreSQL server stops under a running gateway whose calls may
/// wait 120 s for a connection. Requests that need the store fail at
/// their history step with `history_unavailable`, naming the store, the
/// step and the cause, and they fail fast: each HTTP exchange is bounded
/// to 30 s (`support::responses::send`), so a call that waited for the
/// pool would fail the test. What needs no history is served meanwhile;
/// once the server is back, the chain made before the outage goes on.
#[tokio::test]
async fn a_postgres_outage_fails_requests_fast_with_their_cause_and_passes() {
    let mut server = postgres::private_server().await;
    let url = server.create_database().await;
    let (_worker, fleet) = worker();
    let gateway = gateway(
        &fleet,
        &[
            "--history-backend",
            "postgres",
            "--history-url",
            &url,
            "--history-connect-timeout-secs",
            "120",
        ],
    );
    let one = step(&gateway, "one", None).await;

    server.stop().await;
    // Continuing a chain fails at its read, before anything is generated;
    // the first call finds the outage, the next ones know it.
    for _ in 0..3 {
        let (status, body) = post(
            &gateway,
            "/v1/responses",
            &json!({"input": "two", "previous_response_id": one["id"], "max_output_tokens": 64}),
        )
        .await;
        assert_eq!((status, code(&body)), (503, Some("history_unavailable")));
        assert_eq!(
            body["error"]["message"],
            "the history store (postgres) failed to read the previous_response_id chain: \
             it is out of reach (connection refused); nothing was changed",
            "the message names the store, the step and the cause"
        );
    }
    // A new stored response is generated, then fails at its save.
    let (status, body) = post(
        &gateway,
        "/v1/responses",
        &json!({"input": "lost", "max_output_tokens": 64}),
    )
    .await;
    assert_eq!((status, code(&body)), (503, Some("history_unavailable")));
    assert_eq!(
        body["error"]["message"],
        "the history store (postgres) failed to save the response: it is out of reach \
         (connection refused); nothing was changed"
    );
    // The gateway is up: what needs no history is served.
    let chat = chat_text(&gateway, json!([{"role": "user", "content": "still here"}])).await;
    digest(&chat);
    let unstored = create(
        &gateway,
        json!({"input": "unstored", "store": false, "max_output_tokens": 64}),
    )
    .await;
    assert_eq!(unstored["store"], false);

    server.start_again().await;
    // The gateway finds it back; the chain made before the outage goes on.
    let (status, stored) = once_the_store_answers(&gateway, one["id"].as_str().expect("id")).await;
    assert_eq!((status, &stored), (200, &one));
    let two = step(&gateway, "two", Some(&one)).await;
    assert_replayed(&gateway, &[("one", &one), ("two", &two)]).await;
    let three = step(&gateway, "three", Some(&two)).await;
    assert_replayed(&gateway, &[("one", &one), ("two", &two), ("three", &three)]).await;
}

/// What the gateway holds for running requests: admission slots taken
/// (`smg_admission_in_flight`) and the requests it counts on the worker at
/// `worker_url` (the admin API's `in_flight`).
async fn held(gateway: &Gateway, worker_url: &str) -> (f64, u64) {
    let slots = metric(&metrics_text(gateway).await, "smg_admission_in_flight", &[]);
    let (status, body) = send(http().get(gateway.admin_url("/workers"))).await;
    assert_eq!(status, 200, "{body}");
    let load = body["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|worker| worker["url"] == worker_url)
        .and_then(|worker| worker["in_flight"].as_u64())
        .unwrap_or_else(|| panic!("{worker_url} is not listed: {body}"));
    (slots, load)
}

/// The store fails exactly at the save of a streamed response: its worker
/// holds the stream after two tokens (`--hold-after-tokens`) while the
/// test stops the server, then lets it end (SIGUSR1). The stream has sent
/// its events and finished its output; then comes `error` (the store's
/// failure, as the gateway words it) and `response.failed` carrying the
/// whole output, numbered on from the rest with no gap. Only the save
/// failed; the admission slot and the worker's load count taken while it
/// ran are given back; nothing was stored.
#[tokio::test]
async fn a_streamed_response_whose_save_fails_ends_with_error_then_response_failed() {
    let mut server = postgres::private_server().await;
    let url = server.create_database().await;
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--hold-after-tokens", "2"],
    );
    let worker_url = worker.grpc_url();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker_url,
        "--served-model-name",
        "model",
        "--max-concurrent-requests",
        "1",
        "--history-backend",
        "postgres",
        "--history-url",
        &url,
        "--history-connect-timeout-secs",
        "2",
    ]);

    let stream = bounded(
        "the stream's head",
        http()
            .post(gateway.url("/v1/responses"))
            .json(&json!({"input": "held", "stream": true, "max_output_tokens": 64}))
            .send(),
    )
    .await
    .expect("sent");
    assert_eq!(stream.status().as_u16(), 200);
    poll_until("the response to hold a slot and its worker", async || {
        (held(&gateway, &worker_url).await == (1.0, 1)).then_some(())
    })
    .await;

    server.stop().await;
    worker.signal(Signal::SIGUSR1);
    let text = bounded("the rest of the stream", stream.text())
        .await
        .expect("the stream's body");
    let events = parse_events(&text);
    let names = names(&events);
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(
        names[names.len() - 2..],
        ["error", "response.failed"],
        "{names:?}"
    );
    for (index, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], index, "{names:?}");
    }
    let done = names
        .iter()
        .position(|name| *name == "response.output_item.done")
        .expect("the message was finished");
    assert!(done < names.len() - 2, "before the save: {names:?}");
    let deltas: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .filter_map(|(_, data)| data["delta"].as_str())
        .collect();

    let message = "the history store (postgres) failed to save the response: it is out of \
                   reach (connection refused); nothing was changed";
    let error = &events[events.len() - 2].1;
    assert_eq!(error["code"], "history_unavailable", "{error}");
    assert_eq!(error["message"], message);
    let failed = &events[events.len() - 1].1["response"];
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "history_unavailable");
    assert_eq!(failed["error"]["message"], message);
    let answer = output_text(failed);
    digest(&answer);
    assert_eq!(
        answer, deltas,
        "the failed response carries what was streamed"
    );

    let metrics = metrics_text(&gateway).await;
    let errors = |labels: &[&str]| metric(&metrics, "smg_history_errors_total", labels);
    assert_eq!(errors(&["operation=\"save_response\""]), 1.0, "{metrics}");
    assert_eq!(errors(&[]), 1.0, "the save was the only call that failed");
    poll_until(
        "the slot and the worker's load to be given back",
        async || (held(&gateway, &worker_url).await == (0.0, 0)).then_some(()),
    )
    .await;

    server.start_again().await;
    let id = failed["id"].as_str().expect("id");
    let (status, body) = once_the_store_answers(&gateway, id).await;
    assert_eq!((status, code(&body)), (404, Some("response_not_found")));
    // The one slot is free, and the worker holds no more streams.
    let after = step(&gateway, "after", None).await;
    let (status, stored) = get(
        &gateway,
        &format!("/v1/responses/{}", after["id"].as_str().expect("id")),
    )
    .await;
    assert_eq!((status, stored), (200, after));
}

#[tokio::test]
async fn history_backend_none_serves_responses_but_keeps_nothing() {
    let (_worker, fleet) = worker();
    let gateway = gateway(&fleet, &["--history-backend", "none"]);
    let response = create(&gateway, json!({"input": "hi", "max_output_tokens": 64})).await;
    assert_eq!(response["store"], false, "nothing is kept: store is false");
    digest(&output_text(&response));
    let id = response["id"].as_str().expect("id");
    let (status, body) = get(&gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!((status, code(&body)), (404, Some("response_not_found")));

    let (status, body) = post(
        &gateway,
        "/v1/responses",
        &json!({"input": "later", "background": true}),
    )
    .await;
    assert_eq!((status, code(&body)), (501, Some("history_disabled")));
    let (status, body) = post(&gateway, "/v1/conversations", &json!({})).await;
    assert_eq!((status, code(&body)), (501, Some("history_disabled")));
    let (status, body) = post(
        &gateway,
        "/v1/responses",
        &json!({"input": "more", "previous_response_id": id}),
    )
    .await;
    assert_eq!((status, code(&body)), (501, Some("history_disabled")));
}

/// The last line of a failed start's stderr: the one-line error.
fn error_line(stderr: &str) -> &str {
    stderr.trim_end().lines().last().unwrap_or_default()
}

#[tokio::test]
async fn a_postgres_backend_without_a_url_does_not_start() {
    let (_worker, fleet) = worker();
    let mut args: Vec<&str> = fleet.iter().map(String::as_str).collect();
    args.extend(["--history-backend", "postgres"]);
    let (status, stderr) = Gateway::fail_to_start(&args);
    assert!(!status.success(), "{stderr}");
    // Refused as the flags are read: one line, naming the missing flag.
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(error_line(&stderr).contains("--history-url"), "{stderr}");
}

/// A postgres backend out of reach (nothing listens on port 1) or that
/// refuses the gateway (a database the server does not have) fails
/// start-up at once, in one line with the server's address and the cause,
/// without the URL's password. With `--history-connect-timeout-secs 60`, a
/// start that waited for the timeout (as retrying a refused connection
/// does) would fail the harness' 30 s bound instead.
#[tokio::test]
async fn a_postgres_backend_out_of_reach_fails_start_up_at_once_with_its_cause() {
    let (_worker, fleet) = worker();
    let mut missing = url::Url::parse(&postgres::fresh_database().await).expect("a URL");
    missing.set_path("/no_such_database");
    missing
        .set_password(Some("hunter2-secret"))
        .expect("a password");
    let server = format!(
        "{}:{}",
        missing.host_str().expect("a host"),
        missing.port().expect("a port")
    );
    let cases = [
        (
            "postgres://smg:hunter2-secret@127.0.0.1:1/history".to_owned(),
            "127.0.0.1:1".to_owned(),
            "Connection refused",
        ),
        (
            missing.to_string(),
            server,
            "database \"no_such_database\" does not exist",
        ),
    ];
    for (url, server, cause) in &cases {
        let mut args: Vec<&str> = fleet.iter().map(String::as_str).collect();
        args.extend([
            "--history-backend",
            "postgres",
            "--history-url",
            url,
            "--history-connect-timeout-secs",
            "60",
        ]);
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let run = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Gateway::fail_to_start(&args)
        });
        let (status, stderr) = bounded("a failed start", run).await.expect("ran smg");
        assert!(!status.success(), "{url}: {stderr}");
        let line = error_line(&stderr);
        assert!(
            line.starts_with(&format!(
                "smg: history store unavailable: cannot connect to postgres at {server}: "
            )),
            "{stderr}"
        );
        assert!(line.contains(cause), "{stderr}");
        assert!(line.ends_with("(postgres, --history-url)"), "{stderr}");
        assert!(!stderr.contains("hunter2-secret"), "{stderr}");
    }
}
