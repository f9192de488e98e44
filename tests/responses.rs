//! The Responses API end to end, through real sim-worker processes in
//! Regular, PD and EPD: create / get / input_items / delete, chains by
//! `previous_response_id` whose replayed prompt the workers' digests prove,
//! conversations, `store: false`, the streamed event sequence, function
//! calls streamed as argument deltas, cancellation of a running response
//! (the engine's leg is aborted), and the stable error codes.
//!
//! How a replayed prompt is proved: a sim worker answers with a digest of
//! the prompt tokens it got. A chat completion carrying the same history as
//! messages must therefore be answered with the same digest as the
//! response that replayed it.

mod support;

use futures::StreamExt;
use serde_json::{Value, json};
use smg::proto::tokenspeed_scheduler as ts;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use support::chat::{FamilyModel, http};
use support::media::image_data_url;
use support::responses::{
    chat_text, create, delete, digest, events, get, names, output_text, parse_events, post,
};
use support::{Gateway, SimWorker, bounded, poll_until};

const ZERO: &[&str] = &["--zero-delay"];

/// The worker processes of one fleet and the gateway flags naming them.
struct Fleet {
    _workers: Vec<SimWorker>,
    flags: Vec<String>,
}

fn fleet(mode: &str) -> Fleet {
    let mut workers = Vec::new();
    let mut flags: Vec<String> = Vec::new();
    if mode == "regular" {
        let worker = SimWorker::start("tokenspeed", "regular", ZERO);
        flags.extend(["--worker-urls".into(), worker.grpc_url()]);
        workers.push(worker);
    } else {
        if mode == "epd" {
            let encoder = SimWorker::start("tokenspeed", "encode", ZERO);
            flags.extend([
                "--epd-disaggregation".into(),
                "--encode".into(),
                encoder.grpc_url(),
                encoder.bootstrap_port().to_string(),
            ]);
            workers.push(encoder);
        } else {
            flags.push("--pd-disaggregation".into());
        }
        let legs = ["--zero-delay", "--bootstrap-timeout-ms", "20000"];
        let prefill = SimWorker::start("tokenspeed", "prefill", &legs);
        let decode = SimWorker::start("tokenspeed", "decode", &legs);
        flags.extend([
            "--prefill".into(),
            prefill.grpc_url(),
            prefill.bootstrap_port().to_string(),
            "--decode".into(),
            decode.grpc_url(),
        ]);
        workers.extend([prefill, decode]);
    }
    flags.extend(["--served-model-name".into(), "model".into()]);
    Fleet {
        _workers: workers,
        flags,
    }
}

fn gateway(fleet: &Fleet) -> Gateway {
    let args: Vec<&str> = fleet.flags.iter().map(String::as_str).collect();
    Gateway::start(&args)
}

async fn check_lifecycle(gateway: &Gateway, input: Value) {
    let response = create(
        gateway,
        json!({"model": "model", "input": input, "max_output_tokens": 64,
               "metadata": {"run": "lifecycle"}}),
    )
    .await;
    let id = response["id"].as_str().expect("id");
    assert!(id.starts_with("resp_"), "{id}");
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["store"], true);
    assert_eq!(response["metadata"]["run"], "lifecycle");
    let message = &response["output"][0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    digest(&output_text(&response));
    let usage = &response["usage"];
    assert!(usage["input_tokens"].as_u64().expect("input_tokens") > 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["input_tokens"].as_u64().unwrap_or(0)
                + usage["output_tokens"].as_u64().unwrap_or(0)
        )
    );

    let (status, stored) = get(gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        stored, response,
        "GET answers the response as it was served"
    );

    let (status, items) = get(gateway, &format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(status, 200, "{items}");
    assert_eq!(items["object"], "list");
    let data = items["data"].as_array().expect("data");
    assert_eq!(data.len(), 1, "{items}");
    assert_eq!(data[0]["role"], "user");
    assert_eq!(items["first_id"], data[0]["id"]);
    assert_eq!(items["has_more"], false);

    let (status, deleted) = delete(gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response.deleted", "deleted": true})
    );
    let (status, body) = get(gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "response_not_found");
    let (status, _) = delete(gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn regular_mode_creates_gets_lists_and_deletes() {
    let fleet = fleet("regular");
    check_lifecycle(&gateway(&fleet), json!("Say hi")).await;
}

#[tokio::test]
async fn pd_mode_creates_gets_lists_and_deletes() {
    let fleet = fleet("pd");
    check_lifecycle(&gateway(&fleet), json!("Say hi")).await;
}

#[tokio::test]
async fn epd_mode_serves_an_image_input() {
    let fleet = fleet("epd");
    let gateway = gateway(&fleet);
    let input = json!([{"role": "user", "content": [
        {"type": "input_text", "text": "What is in the picture?"},
        {"type": "input_image", "image_url": image_data_url("palette_97x61.png")},
    ]}]);
    check_lifecycle(&gateway, input.clone()).await;
    // The image reached the workers: the digest differs from the text's
    // alone.
    let with_image = create(&gateway, json!({"input": input, "max_output_tokens": 64})).await;
    let text_only = create(
        &gateway,
        json!({"input": "What is in the picture?", "max_output_tokens": 64}),
    )
    .await;
    assert_ne!(
        digest(&output_text(&with_image)),
        digest(&output_text(&text_only))
    );
}

/// Three chained responses; the third's prompt is the whole history.
async fn check_chain(gateway: &Gateway) {
    let first = create(gateway, json!({"input": "one", "max_output_tokens": 64})).await;
    let second = create(
        gateway,
        json!({"input": "two", "previous_response_id": first["id"], "max_output_tokens": 64}),
    )
    .await;
    let third = create(
        gateway,
        json!({"input": "three", "previous_response_id": second["id"],
               "instructions": "Be brief.", "max_output_tokens": 64}),
    )
    .await;
    assert_eq!(third["previous_response_id"], second["id"]);
    let history = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": output_text(&first)},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": output_text(&second)},
        {"role": "user", "content": "three"},
    ]);
    assert_eq!(
        digest(&output_text(&third)),
        digest(&chat_text(gateway, history).await),
        "the third response saw the whole chain"
    );
    // Without the chain the prompt differs, and so does the digest.
    let alone = create(
        gateway,
        json!({"input": "three", "instructions": "Be brief.", "max_output_tokens": 64}),
    )
    .await;
    assert_ne!(digest(&output_text(&alone)), digest(&output_text(&third)));
    // Instructions are not carried on: the next step has only its own.
    let fourth = create(
        gateway,
        json!({"input": "four", "previous_response_id": third["id"], "max_output_tokens": 64}),
    )
    .await;
    let history = json!([
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": output_text(&first)},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": output_text(&second)},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": output_text(&third)},
        {"role": "user", "content": "four"},
    ]);
    assert_eq!(
        digest(&output_text(&fourth)),
        digest(&chat_text(gateway, history).await)
    );
}

#[tokio::test]
async fn regular_mode_replays_a_previous_response_chain() {
    let fleet = fleet("regular");
    check_chain(&gateway(&fleet)).await;
}

#[tokio::test]
async fn pd_mode_replays_a_previous_response_chain() {
    let fleet = fleet("pd");
    check_chain(&gateway(&fleet)).await;
}

#[tokio::test]
async fn epd_mode_replays_a_previous_response_chain() {
    let fleet = fleet("epd");
    check_chain(&gateway(&fleet)).await;
}

#[tokio::test]
async fn a_stream_tells_every_step_with_increasing_sequence_numbers() {
    let fleet = fleet("regular");
    let gateway = gateway(&fleet);
    let events = events(
        &gateway,
        &json!({"input": "Say hi", "max_output_tokens": 64, "stream": true}),
    )
    .await;
    let names = names(&events);
    let deltas = names
        .iter()
        .filter(|name| **name == "response.output_text.delta")
        .count();
    assert!(deltas >= 2, "{names:?}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    for (number, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], number as u64, "{data}");
    }
    let text: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, data)| data["delta"].as_str().expect("delta"))
        .collect();
    let (_, done) = &events[events.len() - 4];
    assert_eq!(done["text"], text);
    let (_, completed) = events.last().expect("events");
    let response = &completed["response"];
    assert_eq!(response["status"], "completed");
    assert_eq!(output_text(response), text);
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    let id = response["id"].as_str().expect("id");
    let (status, stored) = get(&gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(&stored, response);
}

#[tokio::test]
async fn store_false_keeps_nothing_and_a_cut_output_is_incomplete() {
    let fleet = fleet("regular");
    let gateway = gateway(&fleet);
    let response = create(
        &gateway,
        json!({"input": "hi", "store": false, "max_output_tokens": 64}),
    )
    .await;
    assert_eq!(response["store"], false);
    let id = response["id"].as_str().expect("id");
    let (status, _) = get(&gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404);
    let (status, body) = post(
        &gateway,
        "/v1/responses",
        &json!({"input": "more", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "previous_response_not_found");

    let cut = create(&gateway, json!({"input": "hi", "max_output_tokens": 2})).await;
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(cut["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(cut["output"][0]["status"], "incomplete");
}

#[tokio::test]
async fn bad_requests_get_stable_codes() {
    let fleet = fleet("regular");
    let gateway = gateway(&fleet);
    let done = create(&gateway, json!({"input": "hi", "max_output_tokens": 4})).await;
    let id = done["id"].as_str().expect("id");
    let cases = [
        (
            json!({"input": "x", "previous_response_id": "resp_nope"}),
            400,
            "previous_response_not_found",
        ),
        (
            json!({"input": "x", "previous_response_id": id, "conversation": "conv_1"}),
            400,
            "mutually_exclusive_parameters",
        ),
        (
            json!({"input": [{"type": "computer_call_output", "call_id": "c"}]}),
            400,
            "invalid_input_item",
        ),
        (
            json!({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}),
            400,
            "invalid_input_item",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            400,
            "unsupported_tool",
        ),
        (
            json!({"input": "x", "conversation": "conv_nope"}),
            404,
            "conversation_not_found",
        ),
        (json!({"input": []}), 400, "invalid_parameter"),
        (
            json!({"input": "x", "temperature": 9}),
            400,
            "invalid_parameter",
        ),
        (
            json!({"input": "x", "tool_choice": "required"}),
            400,
            "invalid_parameter",
        ),
    ];
    for (body, status, code) in cases {
        let (got, answer) = post(&gateway, "/v1/responses", &body).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {answer}"
        );
    }
    let (status, body) = post(&gateway, "/v1/responses/resp_nope/cancel", &json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("response_not_found"))
    );
    let (status, body) = post(&gateway, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("response_not_cancellable"))
    );
    let (status, body) = get(
        &gateway,
        &format!("/v1/responses/{id}/input_items?after=msg_nope"),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("item_not_found"))
    );
    let (status, body) = get(&gateway, &format!("/v1/responses/{id}/input_items?limit=0")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_parameter"))
    );
}

#[tokio::test]
async fn a_conversation_gathers_items_from_the_api_and_from_responses() {
    let fleet = fleet("regular");
    let gateway = gateway(&fleet);
    let (status, conversation) = post(
        &gateway,
        "/v1/conversations",
        &json!({"metadata": {"topic": "numbers"},
                "items": [{"type": "message", "role": "user", "content": "one"}]}),
    )
    .await;
    assert_eq!(status, 200, "{conversation}");
    let id = conversation["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("conv_"));
    assert_eq!(conversation["object"], "conversation");
    assert_eq!(conversation["metadata"]["topic"], "numbers");
    let items_path = format!("/v1/conversations/{id}/items");
    let (status, added) = post(
        &gateway,
        &items_path,
        &json!({"items": [
            {"role": "assistant", "content": "ONE"},
            {"role": "user", "content": "two"},
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    assert_eq!(added["data"].as_array().map(Vec::len), Some(2));

    let response = create(
        &gateway,
        json!({"input": "three", "conversation": id, "max_output_tokens": 64}),
    )
    .await;
    assert_eq!(response["conversation"]["id"], id);
    // The response saw the conversation's items before its input.
    let history = json!([
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ONE"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": "three"},
    ]);
    assert_eq!(
        digest(&output_text(&response)),
        digest(&chat_text(&gateway, history).await)
    );

    let (status, listed) = get(&gateway, &format!("{items_path}?order=asc")).await;
    assert_eq!(status, 200, "{listed}");
    let data = listed["data"].as_array().expect("data");
    let texts: Vec<String> = data
        .iter()
        .map(|item| {
            item["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(texts.len(), 5, "{listed}");
    assert_eq!(texts[..4], ["one", "ONE", "two", "three"]);
    assert_eq!(texts[4], output_text(&response));
    assert_eq!(listed["has_more"], false);

    // Newest first by default; pages of two.
    let (_, page) = get(&gateway, &format!("{items_path}?limit=2")).await;
    let page_data = page["data"].as_array().expect("data");
    assert_eq!(page_data.len(), 2);
    assert_eq!(page_data[0]["id"], data[4]["id"]);
    assert_eq!(page["has_more"], true);
    let last = page["last_id"].as_str().expect("last_id");
    let (_, next) = get(&gateway, &format!("{items_path}?limit=2&after={last}")).await;
    assert_eq!(next["data"][0]["id"], data[2]["id"]);
    assert_eq!(next["has_more"], true);
    let (_, rest) = get(
        &gateway,
        &format!(
            "{items_path}?limit=2&after={}",
            next["last_id"].as_str().expect("id")
        ),
    )
    .await;
    assert_eq!(rest["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(rest["has_more"], false);

    let first_id = data[0]["id"].as_str().expect("id");
    let (status, item) = get(&gateway, &format!("{items_path}/{first_id}")).await;
    assert_eq!(status, 200);
    assert_eq!(item, data[0]);
    let (status, after_delete) = delete(&gateway, &format!("{items_path}/{first_id}")).await;
    assert_eq!(status, 200);
    assert_eq!(after_delete["id"], id);
    let (status, body) = get(&gateway, &format!("{items_path}/{first_id}")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("item_not_found"))
    );

    let (status, updated) = post(
        &gateway,
        &format!("/v1/conversations/{id}"),
        &json!({"metadata": {"topic": "letters"}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(updated["metadata"]["topic"], "letters");
    let (status, deleted) = delete(&gateway, &format!("/v1/conversations/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(deleted["deleted"], true);
    let (status, body) = get(&gateway, &items_path).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("conversation_not_found"))
    );
}

const QWEN3: &str = "Qwen/Qwen3-8B";
const WEATHER: &str = "What is the weather in Paris and Rome?";
const WEATHER_ANSWER: &str = "<think>\nTwo cities: two calls.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"celsius\"}}\n</tool_call>";
const FOLLOW_UP: &str = "sunny in Paris";
const FOLLOW_UP_ANSWER: &str =
    "<think>\nBoth answered.\n</think>\n\nParis is sunny and Rome is 21 °C.";

fn weather_tool() -> Value {
    json!([{"type": "function", "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"]}}])
}

#[tokio::test]
async fn function_calls_stream_as_argument_deltas_and_the_loop_continues_by_id() {
    let model = FamilyModel::new("qwen3", QWEN3);
    let script = support::chat::script(&[
        json!({"when": FOLLOW_UP, "text": FOLLOW_UP_ANSWER}),
        json!({"when": WEATHER, "text": WEATHER_ANSWER}),
    ]);
    let worker = model.worker("regular", &script);
    let gateway = model.gateway(&["--worker-urls", &worker.grpc_url()]);
    let events = events(
        &gateway,
        &json!({"model": QWEN3, "input": WEATHER, "tools": weather_tool(),
                "max_output_tokens": 300, "stream": true}),
    )
    .await;
    let names = names(&events);
    assert!(
        names.contains(&"response.reasoning_text.delta"),
        "{names:?}"
    );
    let argument_deltas = names
        .iter()
        .filter(|name| **name == "response.function_call_arguments.delta")
        .count();
    assert!(
        argument_deltas >= 2,
        "arguments stream in pieces: {names:?}"
    );
    for (number, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], number as u64);
    }
    let (last, completed) = events.last().expect("events");
    assert_eq!(last, "response.completed");
    let response = &completed["response"];
    let output = response["output"].as_array().expect("output");
    let kinds: Vec<&str> = output
        .iter()
        .filter_map(|item| item["type"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["reasoning", "message", "function_call", "function_call"]
    );
    assert_eq!(
        output[0]["content"][0]["text"],
        "\nTwo cities: two calls.\n"
    );
    assert_eq!(output_text(response), "Let me check.");
    let calls: Vec<&Value> = output
        .iter()
        .filter(|item| item["type"] == "function_call")
        .collect();
    // The deltas of each call add up to its arguments.
    for call in &calls {
        let streamed: String = events
            .iter()
            .filter(|(name, data)| {
                name == "response.function_call_arguments.delta" && data["item_id"] == call["id"]
            })
            .map(|(_, data)| data["delta"].as_str().expect("delta"))
            .collect();
        assert_eq!(streamed, call["arguments"].as_str().expect("arguments"));
        assert!(
            call["call_id"]
                .as_str()
                .expect("call_id")
                .starts_with("call_")
        );
        assert_eq!(call["name"], "get_weather");
        assert_eq!(call["status"], "completed");
    }
    let arguments: Value =
        serde_json::from_str(calls[1]["arguments"].as_str().expect("text")).expect("JSON");
    assert_eq!(arguments, json!({"city": "Rome", "unit": "celsius"}));

    // The client runs the calls and continues the chain with their outputs.
    let follow_up = create(
        &gateway,
        json!({"model": QWEN3, "previous_response_id": response["id"],
        "tools": weather_tool(), "max_output_tokens": 300,
        "input": [
            {"type": "function_call_output", "call_id": calls[0]["call_id"],
             "output": FOLLOW_UP},
            {"type": "function_call_output", "call_id": calls[1]["call_id"],
             "output": "21 °C"},
        ]}),
    )
    .await;
    assert_eq!(follow_up["status"], "completed", "{follow_up}");
    assert_eq!(output_text(&follow_up), "Paris is sunny and Rome is 21 °C.");
    assert_eq!(follow_up["output"][0]["type"], "reasoning");
}

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

#[tokio::test]
async fn cancel_stops_a_streaming_response_and_aborts_its_leg() {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--stall-after-tokens", "2"],
    );
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let response = http()
        .post(gateway.url("/v1/responses"))
        .json(&json!({"input": "go on", "max_output_tokens": 100, "stream": true}))
        .send()
        .await
        .expect("sent");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    // Read until the response's id has been told.
    let id = bounded("the response's first events", async {
        loop {
            let piece = body.next().await.expect("more").expect("bytes");
            text.push_str(std::str::from_utf8(&piece).expect("UTF-8"));
            if let Some((_, created)) = text
                .split_once("\n\n")
                .map(|(frame, _)| parse_events(&format!("{frame}\n\n")))
                .and_then(|events| events.into_iter().next())
            {
                return created["response"]["id"].as_str().expect("id").to_owned();
            }
        }
    })
    .await;
    poll_until("the worker runs the request", async || {
        (running_requests(&worker.url()).await == 1).then_some(())
    })
    .await;
    let (status, cancelled) =
        post(&gateway, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["id"], id);
    // The stream ends with the cancelled response.
    let rest = bounded("the stream ends", async {
        while let Some(piece) = body.next().await {
            text.push_str(std::str::from_utf8(&piece.expect("bytes")).expect("UTF-8"));
        }
        text
    })
    .await;
    let events = parse_events(&rest);
    let (last, data) = events.last().expect("events");
    assert_eq!(last, "response.cancelled");
    assert_eq!(data["response"]["status"], "cancelled");
    poll_until("the worker's request is aborted", async || {
        (running_requests(&worker.url()).await == 0).then_some(())
    })
    .await;
    let (status, stored) = get(&gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(stored["status"], "cancelled");
    // Cancelled once is over.
    let (status, body) = post(&gateway, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("response_not_cancellable"))
    );
}

#[tokio::test]
async fn a_background_response_is_queued_polled_and_cancelled() {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--stall-after-tokens", "2"],
    );
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let queued = create(
        &gateway,
        json!({"input": "go on", "max_output_tokens": 100, "background": true}),
    )
    .await;
    assert_eq!(queued["status"], "queued");
    assert_eq!(queued["background"], true);
    let id = queued["id"].as_str().expect("id").to_owned();
    poll_until("the worker runs the request", async || {
        (running_requests(&worker.url()).await == 1).then_some(())
    })
    .await;
    // Once it runs, a poll says so.
    let (status, polled) = get(&gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(polled["status"], "in_progress");
    let (status, cancelled) =
        post(&gateway, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    poll_until("the worker's request is aborted", async || {
        (running_requests(&worker.url()).await == 0).then_some(())
    })
    .await;
    let (_, stored) = get(&gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(stored["status"], "cancelled");

    // Background needs storing.
    let (status, body) = post(
        &gateway,
        "/v1/responses",
        &json!({"input": "x", "background": true, "store": false}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_parameter"))
    );
}

#[tokio::test]
async fn a_background_response_keeps_its_admission_slot_until_it_ends() {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--stall-after-tokens", "2"],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--max-concurrent-requests",
        "1",
        "--queue-size",
        "0",
    ]);
    let queued = create(
        &gateway,
        json!({"input": "go on", "max_output_tokens": 100, "background": true}),
    )
    .await;
    let id = queued["id"].as_str().expect("id").to_owned();
    // The answer was sent, but the work still holds the only slot.
    let (status, refused) = post(
        &gateway,
        "/v1/responses",
        &json!({"input": "me too", "max_output_tokens": 8}),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (429, Some("queue_full"))
    );
    let (status, _) = post(&gateway, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200);
    // Once it has ended, the slot is free again (two tokens: the worker
    // stalls after two).
    let (status, body) = post(
        &gateway,
        "/v1/responses",
        &json!({"input": "me too", "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_tenant_cannot_see_or_continue_another_tenants_history() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--tenant-api-key",
        "alpha:key-alpha",
        "--tenant-api-key",
        "beta:key-beta",
    ]);
    let as_tenant = |request: reqwest::RequestBuilder, key: &str| {
        support::responses::send(request.bearer_auth(key))
    };
    let client = http();
    let (status, response) = as_tenant(
        client
            .post(gateway.url("/v1/responses"))
            .json(&json!({"input": "secret plans", "max_output_tokens": 64})),
        "key-alpha",
    )
    .await;
    assert_eq!(status, 200, "{response}");
    let id = response["id"].as_str().expect("id").to_owned();
    let (status, conversation) = as_tenant(
        client
            .post(gateway.url("/v1/conversations"))
            .json(&json!({"items": [{"role": "user", "content": "private"}]})),
        "key-alpha",
    )
    .await;
    assert_eq!(status, 200, "{conversation}");
    let conversation = conversation["id"].as_str().expect("id").to_owned();

    // Its owner reads both.
    let (status, _) = as_tenant(
        client.get(gateway.url(&format!("/v1/responses/{id}"))),
        "key-alpha",
    )
    .await;
    assert_eq!(status, 200);
    let items = format!("/v1/conversations/{conversation}/items");
    let (status, _) = as_tenant(client.get(gateway.url(&items)), "key-alpha").await;
    assert_eq!(status, 200);

    // Another tenant holding the ids is told they do not exist.
    let beta = "key-beta";
    let checks = [
        (
            client.get(gateway.url(&format!("/v1/responses/{id}"))),
            404,
            "response_not_found",
        ),
        (
            client.get(gateway.url(&format!("/v1/responses/{id}/input_items"))),
            404,
            "response_not_found",
        ),
        (
            client.delete(gateway.url(&format!("/v1/responses/{id}"))),
            404,
            "response_not_found",
        ),
        (
            client.post(gateway.url(&format!("/v1/responses/{id}/cancel"))),
            404,
            "response_not_found",
        ),
        (
            client
                .post(gateway.url("/v1/responses"))
                .json(&json!({"input": "and?", "previous_response_id": id})),
            400,
            "previous_response_not_found",
        ),
        (
            client
                .post(gateway.url("/v1/responses"))
                .json(&json!({"input": "and?", "conversation": conversation})),
            404,
            "conversation_not_found",
        ),
        (
            client.get(gateway.url(&format!("/v1/conversations/{conversation}"))),
            404,
            "conversation_not_found",
        ),
        (
            client.get(gateway.url(&items)),
            404,
            "conversation_not_found",
        ),
        (
            client
                .post(gateway.url(&items))
                .json(&json!({"items": [{"role": "user", "content": "x"}]})),
            404,
            "conversation_not_found",
        ),
        (
            client.delete(gateway.url(&format!("/v1/conversations/{conversation}"))),
            404,
            "conversation_not_found",
        ),
    ];
    for (request, status, code) in checks {
        let (got, body) = as_tenant(request, beta).await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }
    // Nothing of alpha's changed.
    let (status, stored) = as_tenant(
        client.get(gateway.url(&format!("/v1/responses/{id}"))),
        "key-alpha",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(stored, response);
    let (_, listed) = as_tenant(client.get(gateway.url(&items)), "key-alpha").await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1));
}
