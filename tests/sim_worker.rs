//! End-to-end tests of `smg-sim-worker` as real processes on loopback, driven
//! through the generated tonic clients: the ground every gateway test stands
//! on. Each proves, through the digest in the output, that the right ids and
//! tensor bytes reached the right worker over the right path.

mod support;

use std::time::Duration;

use smg::proto::common;
use smg::proto::sglang_scheduler as sg;
use smg::proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient;
use smg::proto::tokenspeed_encoder as enc;
use smg::proto::tokenspeed_encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use smg::proto::tokenspeed_scheduler as ts;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use support::{SimWorker, bounded, digest, expected_header, poll_until};
use tonic::Code;
use tonic::transport::Channel;

type Ts = TokenSpeedSchedulerClient<Channel>;

async fn ts_client(worker: &SimWorker) -> Ts {
    TokenSpeedSchedulerClient::connect(worker.url())
        .await
        .expect("connect TokenSpeedScheduler")
}

async fn encoder_client(worker: &SimWorker) -> TokenSpeedEncoderClient<Channel> {
    TokenSpeedEncoderClient::connect(worker.url())
        .await
        .expect("connect TokenSpeedEncoder")
}

async fn sg_client(worker: &SimWorker) -> SglangSchedulerClient<Channel> {
    SglangSchedulerClient::connect(worker.url())
        .await
        .expect("connect SglangScheduler")
}

fn prompt() -> Vec<u32> {
    support::encode("<|im_start|>user\nTell me about gateways.<|im_end|>\n")
}

fn ts_request(
    id: &str,
    input_ids: &[u32],
    sampling: ts::SamplingParams,
    stream: bool,
) -> ts::GenerateRequest {
    ts::GenerateRequest {
        request_id: id.to_owned(),
        tokenized: Some(ts::TokenizedInput {
            input_ids: input_ids.to_vec(),
            original_text: String::new(),
        }),
        sampling_params: Some(sampling),
        logprob_start_len: Some(-1),
        stream,
        ..Default::default()
    }
}

fn max_tokens(n: u32) -> ts::SamplingParams {
    ts::SamplingParams {
        max_new_tokens: Some(n),
        ..Default::default()
    }
}

/// Exactly `n` tokens: the model's natural end (EOS) is ignored.
fn exactly(n: u32) -> ts::SamplingParams {
    ts::SamplingParams {
        ignore_eos: true,
        ..max_tokens(n)
    }
}

/// Everything a TokenSpeed Generate stream said.
#[derive(Debug, Default)]
struct TsOutcome {
    chunks: Vec<ts::GenerateStreamChunk>,
    completes: Vec<ts::GenerateComplete>,
    error: Option<tonic::Status>,
}

impl TsOutcome {
    fn only_complete(&self) -> &ts::GenerateComplete {
        assert!(self.error.is_none(), "unexpected error {:?}", self.error);
        assert_eq!(self.completes.len(), 1, "{self:?}");
        &self.completes[0]
    }
}

async fn ts_generate(client: &mut Ts, request: ts::GenerateRequest) -> TsOutcome {
    let request_id = request.request_id.clone();
    let mut outcome = TsOutcome::default();
    let mut stream = match client.generate(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            outcome.error = Some(status);
            return outcome;
        }
    };
    loop {
        match bounded("generate stream", stream.message()).await {
            Ok(Some(message)) => {
                assert_eq!(message.request_id, request_id);
                match message.response.expect("a response") {
                    ts::generate_response::Response::Chunk(chunk) => outcome.chunks.push(chunk),
                    ts::generate_response::Response::Complete(done) => outcome.completes.push(done),
                }
            }
            Ok(None) => return outcome,
            Err(status) => {
                outcome.error = Some(status);
                return outcome;
            }
        }
    }
}

async fn running_requests(client: &mut Ts) -> i32 {
    let loads = client
        .get_loads(ts::GetLoadsRequest {
            dp_rank: None,
            include: vec!["core".to_owned()],
        })
        .await
        .expect("GetLoads")
        .into_inner();
    loads.aggregate.expect("aggregate").total_running_reqs
}

#[tokio::test]
async fn regular_stream_sends_one_token_per_chunk_then_complete() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let mut client = ts_client(&worker).await;
    let ids = prompt();
    let outcome = ts_generate(&mut client, ts_request("r1", &ids, exactly(32), true)).await;
    let done = outcome.only_complete();
    assert_eq!(done.finish_reason, "length");
    assert_eq!(done.completion_tokens, 32);
    assert_eq!(done.prompt_tokens as usize, ids.len());
    assert_eq!(outcome.chunks.len(), 32, "token by token");
    let streamed: Vec<u32> = outcome
        .chunks
        .iter()
        .flat_map(|c| c.token_ids.clone())
        .collect();
    assert_eq!(streamed, done.output_ids);
    for (i, chunk) in outcome.chunks.iter().enumerate() {
        assert_eq!(chunk.token_ids.len(), 1);
        assert_eq!(chunk.completion_tokens as usize, i + 1);
    }
    let text = support::decode(&done.output_ids);
    assert!(text.starts_with(&expected_header(&ids, &[])), "{text:?}");
}

#[tokio::test]
async fn regular_unary_sends_only_the_completion_and_is_deterministic() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let mut client = ts_client(&worker).await;
    let ids = prompt();
    let first = ts_generate(&mut client, ts_request("u1", &ids, max_tokens(20), false)).await;
    assert!(first.chunks.is_empty(), "no chunks when stream=false");
    let second = ts_generate(&mut client, ts_request("u2", &ids, max_tokens(20), false)).await;
    assert_eq!(
        first.only_complete().output_ids,
        second.only_complete().output_ids
    );
    let mut other = ids.clone();
    other.push(ids[0]);
    let third = ts_generate(&mut client, ts_request("u3", &other, max_tokens(20), false)).await;
    assert_ne!(
        first.only_complete().output_ids,
        third.only_complete().output_ids
    );
}

#[tokio::test]
async fn sampling_controls_are_honored() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let mut client = ts_client(&worker).await;
    let ids = prompt();
    let eos = 4002; // <|im_end|> in the fixture model.

    // Left alone, the model ends with EOS.
    let natural = ts_generate(
        &mut client,
        ts_request("s1", &ids, ts::SamplingParams::default(), false),
    )
    .await;
    let done = natural.only_complete();
    assert_eq!(done.finish_reason, "stop");
    assert_eq!(done.output_ids.last(), Some(&eos));
    assert_eq!(
        done.matched_stop,
        Some(ts::generate_complete::MatchedStop::MatchedTokenId(eos))
    );
    let natural_len = done.output_ids.len() as u32;

    // ignore_eos runs to max_new_tokens with no EOS.
    let long = natural_len + 30;
    let sampling = ts::SamplingParams {
        ignore_eos: true,
        ..max_tokens(long)
    };
    let ignored = ts_generate(&mut client, ts_request("s2", &ids, sampling, false)).await;
    let done = ignored.only_complete();
    assert_eq!(done.finish_reason, "length");
    assert_eq!(done.completion_tokens, long);
    assert!(!done.output_ids.contains(&eos));

    // A stop token id ends the sequence where it first appears.
    let third_token = done.output_ids[2];
    let sampling = ts::SamplingParams {
        stop_token_ids: vec![third_token],
        ..max_tokens(long)
    };
    let stopped = ts_generate(&mut client, ts_request("s3", &ids, sampling, false)).await;
    let done = stopped.only_complete();
    assert_eq!(done.finish_reason, "stop");
    let first_hit = done
        .output_ids
        .iter()
        .position(|&t| t == third_token)
        .expect("stop token emitted");
    assert_eq!(first_hit + 1, done.output_ids.len());
    assert_eq!(
        done.matched_stop,
        Some(ts::generate_complete::MatchedStop::MatchedTokenId(
            third_token
        ))
    );

    // n = 3 gives three indexed sequences with the same digest header.
    let sampling = ts::SamplingParams {
        n: 3,
        ..max_tokens(40)
    };
    let many = ts_generate(&mut client, ts_request("s4", &ids, sampling, true)).await;
    assert!(many.error.is_none());
    let mut indexes: Vec<u32> = many.completes.iter().map(|c| c.index).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1, 2]);
    let header = expected_header(&ids, &[]);
    for done in &many.completes {
        assert!(support::decode(&done.output_ids).starts_with(&header));
        let streamed: Vec<u32> = many
            .chunks
            .iter()
            .filter(|c| c.index == done.index)
            .flat_map(|c| c.token_ids.clone())
            .collect();
        assert_eq!(
            streamed, done.output_ids,
            "chunks carry their sequence index"
        );
    }
    assert_ne!(many.completes[0].output_ids, many.completes[1].output_ids);

    // String stops are the gateway's job.
    let sampling = ts::SamplingParams {
        stop: vec!["\n\n".to_owned()],
        ..Default::default()
    };
    let refused = ts_generate(&mut client, ts_request("s5", &ids, sampling, false)).await;
    assert_eq!(
        refused.error.expect("rejected").code(),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn repeated_prompts_report_cached_tokens() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let mut client = ts_client(&worker).await;
    let ids: Vec<u32> = (100..150).collect();
    let first = ts_generate(&mut client, ts_request("c1", &ids, max_tokens(2), false)).await;
    assert_eq!(first.only_complete().cached_tokens, 0);
    let second = ts_generate(&mut client, ts_request("c2", &ids, max_tokens(2), false)).await;
    assert_eq!(
        second.only_complete().cached_tokens,
        48,
        "three whole 16-token pages"
    );
}

#[tokio::test]
async fn sglang_regular_generate_streams_the_same_digest() {
    let worker = SimWorker::start("sglang", "regular", &["--zero-delay"]);
    let mut client = sg_client(&worker).await;
    let ids = prompt();
    let request = sg::GenerateRequest {
        request_id: "g1".to_owned(),
        tokenized: Some(sg::TokenizedInput {
            original_text: String::new(),
            input_ids: ids.clone(),
        }),
        sampling_params: Some(sg::SamplingParams {
            max_new_tokens: Some(32),
            ignore_eos: true,
            ..Default::default()
        }),
        stream: true,
        ..Default::default()
    };
    let mut stream = client
        .generate(request)
        .await
        .expect("generate")
        .into_inner();
    let mut tokens = Vec::new();
    let mut complete = None;
    while let Some(message) = bounded("sglang stream", stream.message())
        .await
        .expect("stream")
    {
        match message.response.expect("response") {
            sg::generate_response::Response::Chunk(chunk) => tokens.extend(chunk.token_ids),
            sg::generate_response::Response::Complete(done) => complete = Some(done),
        }
    }
    let done = complete.expect("a completion");
    assert_eq!(done.finish_reason, "length");
    assert_eq!(tokens, done.output_ids);
    assert!(support::decode(&tokens).starts_with(&expected_header(&ids, &[])));
}

#[tokio::test]
async fn sglang_pixel_values_reach_the_digest_and_embed_works() {
    let worker = SimWorker::start("sglang", "regular", &["--zero-delay"]);
    let mut client = sg_client(&worker).await;
    let ids = prompt();
    let pixels = support::pixels(4 * 1176 * 2, 3);
    let grid: Vec<u8> = [1i64, 2, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mm = sg::MultimodalInputs {
        pixel_values: Some(sg::TensorData {
            data: pixels.clone().into(),
            shape: vec![4, 1176],
            dtype: "bfloat16".to_owned(),
        }),
        model_specific_tensors: [(
            "image_grid_thw".to_owned(),
            sg::TensorData {
                data: grid.clone().into(),
                shape: vec![1, 3],
                dtype: "int64".to_owned(),
            },
        )]
        .into(),
        ..Default::default()
    };
    let request = sg::GenerateRequest {
        request_id: "mm".to_owned(),
        tokenized: Some(sg::TokenizedInput {
            original_text: String::new(),
            input_ids: ids.clone(),
        }),
        mm_inputs: Some(mm),
        sampling_params: Some(sg::SamplingParams {
            max_new_tokens: Some(16),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut stream = client
        .generate(request)
        .await
        .expect("generate")
        .into_inner();
    let message = stream.message().await.expect("stream").expect("a message");
    let Some(sg::generate_response::Response::Complete(done)) = message.response else {
        panic!("unary generate answers with the completion: {message:?}");
    };
    let item = digest::item_digest(
        &digest::tensor_digest("bfloat16", &[4, 1176], &pixels),
        &[(
            "image_grid_thw".to_owned(),
            digest::tensor_digest("int64", &[1, 3], &grid),
        )],
    );
    assert!(support::decode(&done.output_ids).starts_with(&expected_header(&ids, &[item])));

    let embedded = client
        .embed(sg::EmbedRequest {
            request_id: "e1".to_owned(),
            tokenized: Some(sg::TokenizedInput {
                original_text: String::new(),
                input_ids: ids.clone(),
            }),
            ..Default::default()
        })
        .await
        .expect("embed")
        .into_inner();
    assert_eq!(embedded.embedding.len(), embedded.embedding_dim as usize);
    assert_eq!(embedded.prompt_tokens as usize, ids.len());
    let norm: f32 = embedded.embedding.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "unit vector, got norm {norm}");
}

#[tokio::test]
async fn tokenspeed_pd_decode_gets_prefill_kv_by_int64_room() {
    let prefill = SimWorker::start("tokenspeed", "prefill", &["--zero-delay"]);
    let decode = SimWorker::start("tokenspeed", "decode", &["--zero-delay"]);
    let (mut prefill_client, mut decode_client) =
        (ts_client(&prefill).await, ts_client(&decode).await);
    let ids = prompt();
    let room = i64::from(i32::MAX) + 12_345; // only fits TokenSpeed's int64 rooms
    let kv = ts::KvBootstrapInfo {
        bootstrap_host: "127.0.0.1".to_owned(),
        bootstrap_port: i32::from(prefill.bootstrap_port()),
        bootstrap_room: room,
    };
    let leg = |id: &str| ts::GenerateRequest {
        kv_bootstrap_info: Some(kv.clone()),
        ..ts_request(id, &ids, exactly(32), true)
    };
    // Decode starts first and waits for the KV, as in a real rendezvous:
    // prefill is sent only once decode runs the request (counted as running
    // when it takes its scheduler slot, whose only next step is the KV
    // fetch).
    let mut decode_loads = decode_client.clone();
    let (decoded, prefilled) = tokio::join!(ts_generate(&mut decode_client, leg("pd-1")), async {
        poll_until("decode runs the request", async || {
            (running_requests(&mut decode_loads).await == 1).then_some(())
        })
        .await;
        ts_generate(&mut prefill_client, leg("pd-1")).await
    });
    let prefill_done = prefilled.only_complete();
    assert_eq!(
        prefill_done.completion_tokens, 1,
        "prefill stops after the first token"
    );
    let done = decoded.only_complete();
    assert_eq!(done.completion_tokens, 32);
    assert!(support::decode(&done.output_ids).starts_with(&expected_header(&ids, &[])));
}

#[tokio::test]
async fn sglang_pd_uses_int32_rooms_on_both_legs() {
    let prefill = SimWorker::start("sglang", "prefill", &["--zero-delay"]);
    let decode = SimWorker::start("sglang", "decode", &["--zero-delay"]);
    let (mut prefill_client, mut decode_client) =
        (sg_client(&prefill).await, sg_client(&decode).await);
    let ids = prompt();
    let leg = || sg::GenerateRequest {
        request_id: "pd-sg".to_owned(),
        tokenized: Some(sg::TokenizedInput {
            original_text: String::new(),
            input_ids: ids.clone(),
        }),
        sampling_params: Some(sg::SamplingParams {
            max_new_tokens: Some(32),
            ignore_eos: true,
            ..Default::default()
        }),
        disaggregated_params: Some(sg::DisaggregatedParams {
            bootstrap_host: "127.0.0.1".to_owned(),
            bootstrap_port: i32::from(prefill.bootstrap_port()),
            bootstrap_room: i32::MAX - 7,
        }),
        ..Default::default()
    };
    let (decoded, prefilled) = tokio::join!(
        decode_client.generate(leg()),
        prefill_client.generate(leg())
    );
    let mut prefill_stream = prefilled.expect("prefill leg").into_inner();
    while bounded("prefill leg", prefill_stream.message())
        .await
        .expect("prefill")
        .is_some()
    {}
    let mut stream = decoded.expect("decode leg").into_inner();
    let message = bounded("decode leg", stream.message())
        .await
        .expect("decode")
        .expect("a message");
    let Some(sg::generate_response::Response::Complete(done)) = message.response else {
        panic!("expected a completion: {message:?}");
    };
    assert_eq!(done.completion_tokens, 32);
    assert!(support::decode(&done.output_ids).starts_with(&expected_header(&ids, &[])));
}

fn image_item(
    payload: ts::tensor_data::Payload,
    shape: Vec<u32>,
    grid: &[u8],
    placeholder_offset: u32,
) -> ts::MultimodalItem {
    ts::MultimodalItem {
        modality: common::Modality::Image as i32,
        content_hash: vec![0xab; 32].into(),
        encoder_input: Some(ts::TensorData {
            shape,
            dtype: "bfloat16".to_owned(),
            payload: Some(payload),
        }),
        model_specific_tensors: [(
            "image_grid_thw".to_owned(),
            ts::TensorData {
                shape: vec![1, 3],
                dtype: "int64".to_owned(),
                payload: Some(ts::tensor_data::Payload::Inline(grid.to_vec().into())),
            },
        )]
        .into(),
        placeholders: vec![ts::PlaceholderRange {
            offset: placeholder_offset,
            length: 1,
        }],
        placeholder_token_id: Some(4005),
    }
}

/// The same item as prefill and decode see it in EPD: metadata only.
fn metadata_only(mut item: ts::MultimodalItem) -> ts::MultimodalItem {
    item.encoder_input = item.encoder_input.map(|tensor| ts::TensorData {
        payload: None,
        ..tensor
    });
    item
}

#[tokio::test]
async fn epd_prefill_gets_each_embedding_from_its_encoder_by_room() {
    let encode_a = SimWorker::start("tokenspeed", "encode", &["--zero-delay"]);
    let encode_b = SimWorker::start("tokenspeed", "encode", &["--zero-delay"]);
    let prefill = SimWorker::start("tokenspeed", "prefill", &["--zero-delay"]);
    let decode = SimWorker::start("tokenspeed", "decode", &["--zero-delay"]);

    let ids = prompt();
    let grid: Vec<u8> = [1i64, 2, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let shape = vec![4, 1176];
    let inline_pixels = support::pixels(4 * 1176 * 2, 1);
    let shm_pixels = support::pixels(4 * 1176 * 2, 2);
    let shm_name = support::shm_file(&shm_pixels);
    let items = [
        image_item(
            ts::tensor_data::Payload::Inline(inline_pixels.clone().into()),
            shape.clone(),
            &grid,
            3,
        ),
        image_item(
            ts::tensor_data::Payload::Shm(common::ShmHandle {
                name: shm_name.clone(),
                offset: 0,
                nbytes: shm_pixels.len() as u64,
                owner_id: "test".to_owned(),
            }),
            shape.clone(),
            &grid,
            5,
        ),
    ];
    let rooms = [1_000_001_i64, i64::MAX - 3];
    let encoders = [&encode_a, &encode_b];

    for (index, item) in items.iter().enumerate() {
        let mut client = encoder_client(encoders[index]).await;
        let response = client
            .encode(enc::EncodeRequest {
                request_id: format!("epd-1-{index}"),
                mm_inputs: Some(ts::MultimodalInputs {
                    items: vec![item.clone()],
                }),
                items: vec![enc::EncodeItemAssignment {
                    bootstrap_room: rooms[index],
                }],
            })
            .await
            .expect("encode")
            .into_inner();
        assert!(response.accepted);
    }
    assert!(
        !support::shm_path(&shm_name).exists(),
        "the encoder read and unlinked the shm tensor before answering"
    );

    let encode_info = ts::EncodeBootstrapInfo {
        items: (0..2)
            .map(|index| ts::EncodeItemBootstrapInfo {
                item_index: index as u32,
                bootstrap_host: "127.0.0.1".to_owned(),
                bootstrap_port: i32::from(encoders[index].bootstrap_port()),
                bootstrap_room: rooms[index],
            })
            .collect(),
    };
    let kv = ts::KvBootstrapInfo {
        bootstrap_host: "127.0.0.1".to_owned(),
        bootstrap_port: i32::from(prefill.bootstrap_port()),
        bootstrap_room: 77,
    };
    let metadata = ts::MultimodalInputs {
        items: items.iter().cloned().map(metadata_only).collect(),
    };
    let prefill_leg = ts::GenerateRequest {
        mm_inputs: Some(metadata.clone()),
        encode_bootstrap_info: Some(encode_info),
        kv_bootstrap_info: Some(kv.clone()),
        ..ts_request("epd-1", &ids, max_tokens(32), false)
    };
    let decode_leg = ts::GenerateRequest {
        mm_inputs: Some(metadata),
        kv_bootstrap_info: Some(kv),
        ..ts_request("epd-1", &ids, max_tokens(32), true)
    };
    let (mut prefill_client, mut decode_client) =
        (ts_client(&prefill).await, ts_client(&decode).await);
    let (prefilled, decoded) = tokio::join!(
        ts_generate(&mut prefill_client, prefill_leg),
        ts_generate(&mut decode_client, decode_leg)
    );
    prefilled.only_complete();
    let done = decoded.only_complete();

    let grid_digest = digest::tensor_digest("int64", &[1, 3], &grid);
    let item_digest = |pixels: &[u8]| {
        digest::item_digest(
            &digest::tensor_digest("bfloat16", &shape, pixels),
            &[("image_grid_thw".to_owned(), grid_digest)],
        )
    };
    let expected = expected_header(
        &ids,
        &[item_digest(&inline_pixels), item_digest(&shm_pixels)],
    );
    assert!(support::decode(&done.output_ids).starts_with(&expected));
}

#[tokio::test]
async fn a_peer_that_never_delivers_fails_the_leg_with_deadline_exceeded() {
    let flags = ["--zero-delay", "--bootstrap-timeout-ms", "300"];
    let prefill = SimWorker::start("tokenspeed", "prefill", &flags);
    let decode = SimWorker::start("tokenspeed", "decode", &flags);
    let encode = SimWorker::start("tokenspeed", "encode", &flags);
    let ids = prompt();

    // Decode waits for a KV cache that prefill never produces.
    let kv = ts::KvBootstrapInfo {
        bootstrap_host: "127.0.0.1".to_owned(),
        bootstrap_port: i32::from(prefill.bootstrap_port()),
        bootstrap_room: 5,
    };
    let mut decode_client = ts_client(&decode).await;
    let orphan = ts::GenerateRequest {
        kv_bootstrap_info: Some(kv.clone()),
        ..ts_request("lost-kv", &ids, max_tokens(4), true)
    };
    let outcome = ts_generate(&mut decode_client, orphan).await;
    let status = outcome.error.expect("decode fails");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(outcome.completes.is_empty());

    // Prefill waits for an embedding that no encoder was asked for.
    let mut prefill_client = ts_client(&prefill).await;
    let grid: Vec<u8> = [1i64, 2, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let item = image_item(
        ts::tensor_data::Payload::Inline(vec![0; 16].into()),
        vec![4, 2],
        &grid,
        0,
    );
    let orphan = ts::GenerateRequest {
        mm_inputs: Some(ts::MultimodalInputs {
            items: vec![metadata_only(item)],
        }),
        encode_bootstrap_info: Some(ts::EncodeBootstrapInfo {
            items: vec![ts::EncodeItemBootstrapInfo {
                item_index: 0,
                bootstrap_host: "127.0.0.1".to_owned(),
                bootstrap_port: i32::from(encode.bootstrap_port()),
                bootstrap_room: 9,
            }],
        }),
        kv_bootstrap_info: Some(kv),
        ..ts_request("lost-embedding", &ids, max_tokens(4), false)
    };
    let outcome = ts_generate(&mut prefill_client, orphan).await;
    assert_eq!(
        outcome.error.expect("prefill fails").code(),
        Code::DeadlineExceeded
    );
    assert_eq!(running_requests(&mut prefill_client).await, 0);
    assert_eq!(running_requests(&mut decode_client).await, 0);
}

#[tokio::test]
async fn abort_stops_a_running_request_and_frees_it() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "20"]);
    let mut client = ts_client(&worker).await;
    let ids = prompt();
    let mut stream = client
        .generate(ts_request("to-abort", &ids, max_tokens(10_000), true))
        .await
        .expect("generate")
        .into_inner();
    for _ in 0..2 {
        let message = bounded("first chunks", stream.message())
            .await
            .expect("stream");
        assert!(matches!(
            message.and_then(|m| m.response),
            Some(ts::generate_response::Response::Chunk(_))
        ));
    }
    assert_eq!(running_requests(&mut client).await, 1);
    let aborted = client
        .abort(ts::AbortRequest {
            request_id: "to-abort".to_owned(),
            reason: "client went away".to_owned(),
        })
        .await
        .expect("abort")
        .into_inner();
    assert!(aborted.success);
    let mut finish = None;
    while let Some(message) = bounded("aborted stream", stream.message())
        .await
        .expect("stream")
    {
        if let Some(ts::generate_response::Response::Complete(done)) = message.response {
            finish = Some(done.finish_reason);
        }
    }
    assert_eq!(finish.as_deref(), Some("abort"));
    assert_eq!(running_requests(&mut client).await, 0);

    let unknown = client
        .abort(ts::AbortRequest {
            request_id: "never-existed".to_owned(),
            reason: String::new(),
        })
        .await
        .expect("abort")
        .into_inner();
    assert!(!unknown.success);
}

#[tokio::test]
async fn a_cancelled_stream_frees_its_request() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "20"]);
    let mut client = ts_client(&worker).await;
    let mut stream = client
        .generate(ts_request("to-drop", &prompt(), max_tokens(10_000), true))
        .await
        .expect("generate")
        .into_inner();
    bounded("first chunk", stream.message())
        .await
        .expect("stream");
    assert_eq!(running_requests(&mut client).await, 1);
    drop(stream);
    poll_until("running back to zero", async || {
        (running_requests(&mut client).await == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn tensor_that_disagrees_with_its_shape_is_invalid_and_its_shm_name_is_consumed() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let mut client = ts_client(&worker).await;
    let bytes = support::pixels(100, 9);
    let name = support::shm_file(&bytes);
    let item = ts::MultimodalItem {
        encoder_input: Some(ts::TensorData {
            shape: vec![4, 1176],
            dtype: "bfloat16".to_owned(),
            payload: Some(ts::tensor_data::Payload::Shm(common::ShmHandle {
                name: name.clone(),
                offset: 0,
                nbytes: bytes.len() as u64,
                owner_id: String::new(),
            })),
        }),
        ..Default::default()
    };
    let request = ts::GenerateRequest {
        mm_inputs: Some(ts::MultimodalInputs { items: vec![item] }),
        ..ts_request("bad-tensor", &prompt(), max_tokens(4), false)
    };
    let outcome = ts_generate(&mut client, request).await;
    let status = outcome.error.expect("rejected");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("does not match"), "{status:?}");
    assert!(!support::shm_path(&name).exists());
}

#[tokio::test]
async fn discovery_rpcs_describe_the_worker_like_a_real_one() {
    let worker = SimWorker::start(
        "tokenspeed",
        "encode",
        &["--zero-delay", "--served-model-name", "qwen-test"],
    );
    let mut client = ts_client(&worker).await;
    let health = client
        .health_check(ts::HealthCheckRequest {})
        .await
        .expect("health")
        .into_inner();
    assert!(health.healthy);

    let info = client
        .get_model_info(ts::GetModelInfoRequest {})
        .await
        .expect("model info")
        .into_inner();
    let model_dir = support::model_dir().canonicalize().expect("model dir");
    assert_eq!(info.model_path, model_dir.display().to_string());
    assert_eq!(info.tokenizer_path, info.model_path);
    assert_eq!(info.served_model_name, "qwen-test");
    assert_eq!(info.model_type, "qwen2_vl");
    assert_eq!(info.vocab_size, 4007);
    assert_eq!(info.eos_token_ids, [4002, 4000]);
    assert!(info.supports_vision);
    assert!(info.max_context_length > 0);

    let server = client
        .get_server_info(ts::GetServerInfoRequest {})
        .await
        .expect("server info")
        .into_inner();
    let scheduler = server.scheduler_info.expect("scheduler info");
    let namespace = match scheduler
        .fields
        .get("shm_namespace_id")
        .and_then(|v| v.kind.clone())
    {
        Some(prost_types::value::Kind::StringValue(s)) => s,
        other => panic!("shm_namespace_id missing: {other:?}"),
    };
    let ours = smg_shared::shm::ShmNamespace::current().expect("shm identity");
    assert_eq!(namespace, ours.as_str());

    // The tokenizer archive arrives whole and matches its checksum.
    let mut chunks = client
        .get_tokenizer(common::GetTokenizerRequest {})
        .await
        .expect("tokenizer")
        .into_inner();
    let (mut zip, mut sha) = (Vec::new(), String::new());
    while let Some(chunk) = chunks.message().await.expect("chunk") {
        zip.extend(chunk.data);
        if !chunk.sha256.is_empty() {
            sha = chunk.sha256;
        }
    }
    use sha2::Digest as _;
    let actual: String = sha2::Sha256::digest(&zip)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(sha, actual);
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip)).expect("a zip");
    assert!(archive.by_name("tokenizer.json").is_ok());

    // An encode worker's scheduler is discovery-only.
    let outcome = ts_generate(
        &mut client,
        ts_request("gen", &prompt(), max_tokens(2), false),
    )
    .await;
    assert_eq!(
        outcome.error.expect("refused").code(),
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn injected_faults_behave_as_named() {
    let ids = prompt();

    let failing = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--fail-after-tokens", "3"],
    );
    let outcome = ts_generate(
        &mut ts_client(&failing).await,
        ts_request("f", &ids, max_tokens(10), true),
    )
    .await;
    assert_eq!(outcome.chunks.len(), 3);
    assert_eq!(outcome.error.expect("fails").code(), Code::Internal);

    let dropping = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--drop-after-tokens", "2"],
    );
    let outcome = ts_generate(
        &mut ts_client(&dropping).await,
        ts_request("d", &ids, max_tokens(10), true),
    )
    .await;
    assert_eq!(outcome.chunks.len(), 2);
    assert!(
        outcome.completes.is_empty(),
        "the stream ends without a completion"
    );

    let mut exiting = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--exit-after-tokens", "1"],
    );
    let outcome = ts_generate(
        &mut ts_client(&exiting).await,
        ts_request("x", &ids, max_tokens(10), true),
    )
    .await;
    assert!(outcome.completes.is_empty());
    assert!(
        exiting.wait_exit(Duration::from_secs(10)).is_some(),
        "the process exited"
    );

    let refusing = SimWorker::start(
        "tokenspeed",
        "encode",
        &["--zero-delay", "--refuse-encodes", "1"],
    );
    let mut client = encoder_client(&refusing).await;
    let request = enc::EncodeRequest {
        request_id: "r".to_owned(),
        mm_inputs: Some(ts::MultimodalInputs {
            items: vec![ts::MultimodalItem {
                encoder_input: Some(ts::TensorData {
                    shape: vec![2],
                    dtype: "float32".to_owned(),
                    payload: Some(ts::tensor_data::Payload::Inline(vec![0; 8].into())),
                }),
                ..Default::default()
            }],
        }),
        items: vec![enc::EncodeItemAssignment { bootstrap_room: 1 }],
    };
    let first = client
        .encode(request.clone())
        .await
        .expect("encode")
        .into_inner();
    let second = client.encode(request).await.expect("encode").into_inner();
    assert!(!first.accepted, "the first encode is refused");
    assert!(second.accepted);

    let unhealthy = SimWorker::start("tokenspeed", "regular", &["--unhealthy"]);
    let health = ts_client(&unhealthy)
        .await
        .health_check(ts::HealthCheckRequest {})
        .await
        .expect("health")
        .into_inner();
    assert!(!health.healthy);
}

#[tokio::test]
async fn record_dir_keeps_every_tensor_with_a_sidecar() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_arg = dir.path().to_str().expect("utf-8 path").to_owned();
    let worker = SimWorker::start(
        "tokenspeed",
        "encode",
        &["--zero-delay", "--record-dir", &dir_arg],
    );
    let pixels = support::pixels(64, 5);
    let name = support::shm_file(&pixels);
    let request = enc::EncodeRequest {
        request_id: "rec-1".to_owned(),
        mm_inputs: Some(ts::MultimodalInputs {
            items: vec![ts::MultimodalItem {
                encoder_input: Some(ts::TensorData {
                    shape: vec![4, 8],
                    dtype: "bfloat16".to_owned(),
                    payload: Some(ts::tensor_data::Payload::Shm(common::ShmHandle {
                        name,
                        offset: 0,
                        nbytes: 64,
                        owner_id: String::new(),
                    })),
                }),
                ..Default::default()
            }],
        }),
        items: vec![enc::EncodeItemAssignment { bootstrap_room: 3 }],
    };
    let mut client = encoder_client(&worker).await;
    assert!(
        client
            .encode(request)
            .await
            .expect("encode")
            .into_inner()
            .accepted
    );
    let mut sidecars: Vec<_> = std::fs::read_dir(dir.path())
        .expect("record dir")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    assert_eq!(sidecars.len(), 1);
    let sidecar_path = sidecars.remove(0);
    let sidecar: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sidecar_path).expect("sidecar"))
            .expect("json");
    assert_eq!(sidecar["request_id"], "rec-1");
    assert_eq!(sidecar["role"], "encode");
    assert_eq!(sidecar["lane"], "shm");
    assert_eq!(sidecar["dtype"], "bfloat16");
    assert_eq!(sidecar["shape"], serde_json::json!([4, 8]));
    let raw = std::fs::read(sidecar_path.with_extension("bin")).expect("raw tensor");
    assert_eq!(raw, pixels);
}
