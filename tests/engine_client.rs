//! End-to-end tests of `EngineClient` against real `smg-sim-worker`
//! processes on loopback, for both engine protocols.
//!
//! Everything goes through `EngineClient` only, as the gateway's pipelines
//! will: the generated stubs never appear here. The digest a sim worker puts
//! at the start of its output proves which token ids and tensor bytes
//! reached it, so each test checks content, not just that a call returned.

mod support;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use smg::engine::{
    EncodeBootstrap, EngineClient, GenerateEvent, GenerateRequest, KvBootstrap, MatchedStop,
    MediaItem, Modality, Runtime, Sampling, Tensor, TensorPayload,
};
use smg::error::{Error, ErrorCode};
use smg_shared::tensor::DType;
use support::{SimWorker, bounded, digest, expected_header};

const RUNTIMES: [Runtime; 2] = [Runtime::TokenSpeed, Runtime::Sglang];

/// `<|im_end|>`, the fixture model's first EOS id.
const IM_END: u32 = 4002;
/// `<|image_pad|>`.
const IMAGE_PAD: u32 = 4005;

fn start(runtime: Runtime, role: &str, extra: &[&str]) -> SimWorker {
    SimWorker::start(runtime.name(), role, extra)
}

fn client(worker: &SimWorker, runtime: Runtime) -> EngineClient {
    EngineClient::new(&worker.grpc_url(), runtime).expect("an engine client")
}

fn prompt() -> Vec<u32> {
    support::encode("<|im_start|>user\nTell me about gateways.<|im_end|>\n")
}

/// A request for exactly `tokens` tokens (EOS ignored).
fn request(id: &str, input_ids: &[u32], tokens: u32, stream: bool) -> GenerateRequest {
    GenerateRequest {
        request_id: id.to_owned(),
        input_ids: input_ids.to_vec(),
        sampling: Sampling {
            max_new_tokens: Some(tokens),
            ignore_eos: true,
            ..Sampling::default()
        },
        stream,
        ..GenerateRequest::default()
    }
}

/// A completed sequence, as the tests check it.
#[derive(Debug, Clone)]
struct Completion {
    output_ids: Vec<u32>,
    finish_reason: String,
    matched_stop: Option<MatchedStop>,
    prompt_tokens: u32,
    completion_tokens: u32,
}

/// Everything a Generate stream yielded.
#[derive(Debug, Default)]
struct Outcome {
    chunks: Vec<(u32, Vec<u32>)>,
    completions: Vec<(u32, Completion)>,
    error: Option<Error>,
}

impl Outcome {
    fn only_completion(&self) -> &Completion {
        assert!(self.error.is_none(), "unexpected error {:?}", self.error);
        assert_eq!(self.completions.len(), 1, "{self:?}");
        &self.completions[0].1
    }

    fn streamed(&self, index: u32) -> Vec<u32> {
        self.chunks
            .iter()
            .filter(|(i, _)| *i == index)
            .flat_map(|(_, ids)| ids.clone())
            .collect()
    }

    fn error(self) -> Error {
        self.error.expect("the call failed")
    }
}

/// Runs one Generate call to its end; an error must be the stream's last item.
async fn run(client: &EngineClient, request: GenerateRequest) -> Outcome {
    let mut outcome = Outcome::default();
    let mut events = match client.generate(request).await {
        Ok(events) => events,
        Err(err) => {
            outcome.error = Some(err);
            return outcome;
        }
    };
    while let Some(item) = bounded("generate stream", events.next()).await {
        assert!(
            outcome.error.is_none(),
            "nothing may follow an error: {item:?}"
        );
        match item {
            Ok(GenerateEvent::Chunk {
                index, token_ids, ..
            }) => outcome.chunks.push((index, token_ids)),
            Ok(GenerateEvent::Complete {
                index,
                output_ids,
                finish_reason,
                matched_stop,
                prompt_tokens,
                completion_tokens,
                ..
            }) => outcome.completions.push((
                index,
                Completion {
                    output_ids,
                    finish_reason,
                    matched_stop,
                    prompt_tokens,
                    completion_tokens,
                },
            )),
            Err(err) => outcome.error = Some(err),
        }
    }
    outcome
}

fn assert_digest(output_ids: &[u32], input_ids: &[u32], items: &[[u8; 32]]) {
    let text = support::decode(output_ids);
    let header = expected_header(input_ids, items);
    assert!(
        text.starts_with(&header),
        "{text:?} should start {header:?}"
    );
}

/// A URL where nothing listens.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);
    format!("grpc://{addr}")
}

fn int64_le(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn inline(dtype: DType, shape: &[u32], bytes: &[u8]) -> Tensor {
    Tensor {
        dtype,
        shape: shape.to_vec(),
        payload: Some(TensorPayload::Inline(Bytes::copy_from_slice(bytes))),
    }
}

/// An image item: bf16 pixel rows of 1176 values plus an inline grid.
fn image(pixels: TensorPayload, rows: u32, grid: &[u8], placeholder_offset: u32) -> MediaItem {
    MediaItem {
        modality: Modality::Image,
        content_hash: *blake3::hash(&placeholder_offset.to_le_bytes()).as_bytes(),
        encoder_input: Tensor {
            dtype: DType::BFloat16,
            shape: vec![rows, 1176],
            payload: Some(pixels),
        },
        model_specific: vec![(
            "image_grid_thw".to_owned(),
            inline(DType::Int64, &[1, 3], grid),
        )],
        placeholders: vec![(placeholder_offset, 1)],
        placeholder_token_id: Some(IMAGE_PAD),
    }
}

fn metadata_only(mut item: MediaItem) -> MediaItem {
    item.encoder_input.payload = None;
    item
}

fn pixel_bytes(rows: u32, seed: u8) -> Vec<u8> {
    support::pixels(rows as usize * 1176 * 2, seed)
}

#[tokio::test]
async fn detect_tells_tokenspeed_from_sglang_for_every_url_form() {
    let tokenspeed = start(Runtime::TokenSpeed, "regular", &["--zero-delay"]);
    let sglang = start(Runtime::Sglang, "regular", &["--zero-delay"]);
    let encoder = start(Runtime::TokenSpeed, "encode", &["--zero-delay"]);
    let cases = [
        (&tokenspeed, Runtime::TokenSpeed),
        (&sglang, Runtime::Sglang),
        (&encoder, Runtime::TokenSpeed),
    ];
    for (worker, runtime) in cases {
        // An HTTP URL is refused before any dialling: smg speaks gRPC.
        let http = format!("http://{}", worker.grpc);
        let refused = EngineClient::detect(&http, Default::default())
            .await
            .expect_err("an http:// worker URL is refused");
        assert!(refused.message.contains("speaks gRPC"), "{refused}");
        for url in [format!("grpc://{}", worker.grpc), worker.grpc.to_string()] {
            let client = bounded("detect", EngineClient::detect(&url, Default::default()))
                .await
                .expect("detected");
            assert_eq!(client.runtime(), runtime, "{url}");
            assert_eq!(client.url(), url);
            assert!(client.health_check().await.expect("health"), "{url}");
        }
    }
}

/// A gRPC server that serves neither scheduler protocol.
mod not_an_engine {
    use smg::proto::tokenspeed_encoder as enc;
    use tonic::{Request, Response, Status};

    #[derive(Debug)]
    pub struct EncoderOnly;

    #[tonic::async_trait]
    impl enc::token_speed_encoder_server::TokenSpeedEncoder for EncoderOnly {
        async fn encode(
            &self,
            _request: Request<enc::EncodeRequest>,
        ) -> Result<Response<enc::EncodeResponse>, Status> {
            Ok(Response::new(enc::EncodeResponse { accepted: false }))
        }
    }

    /// Serves it on an ephemeral loopback port; returns the address.
    pub async fn serve() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let server = tonic::transport::Server::builder()
            .add_service(enc::token_speed_encoder_server::TokenSpeedEncoderServer::new(EncoderOnly))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        addr
    }
}

#[tokio::test]
async fn detect_refuses_a_server_that_speaks_neither_protocol() {
    let addr = not_an_engine::serve().await;
    let err = bounded(
        "detect",
        EngineClient::detect(&addr.to_string(), Default::default()),
    )
    .await
    .expect_err("neither protocol");
    assert_eq!(err.code, ErrorCode::WorkerError);
    assert!(err.message.contains("neither"), "{err}");
    assert!(err.message.contains(&addr.to_string()), "{err}");
}

#[tokio::test]
async fn regular_generate_streams_and_answers_unary_on_both_runtimes() {
    let ids = prompt();
    for runtime in RUNTIMES {
        let worker = start(runtime, "regular", &["--zero-delay"]);
        let client = client(&worker, runtime);

        let streamed = run(&client, request("s", &ids, 24, true)).await;
        let done = streamed.only_completion().clone();
        assert_eq!(done.finish_reason, "length", "{runtime:?}");
        assert_eq!(done.completion_tokens, 24);
        assert_eq!(done.prompt_tokens as usize, ids.len());
        assert_eq!(streamed.chunks.len(), 24, "one token per chunk");
        assert_eq!(streamed.streamed(0), done.output_ids);
        assert_digest(&done.output_ids, &ids, &[]);

        let unary = run(&client, request("u", &ids, 24, false)).await;
        assert!(unary.chunks.is_empty(), "no chunks when stream=false");
        assert_eq!(unary.only_completion().output_ids, done.output_ids);

        // Left alone, the model ends with EOS, and says which stop matched.
        let natural = GenerateRequest {
            sampling: Sampling::default(),
            ..request("n", &ids, 0, false)
        };
        let natural = run(&client, natural).await;
        let done = natural.only_completion();
        assert_eq!(done.finish_reason, "stop", "{runtime:?}");
        assert_eq!(done.output_ids.last(), Some(&IM_END));
        assert_eq!(done.matched_stop, Some(MatchedStop::TokenId(IM_END)));
    }
}

#[tokio::test]
async fn n_sequences_arrive_indexed() {
    let ids = prompt();
    for runtime in RUNTIMES {
        let worker = start(runtime, "regular", &["--zero-delay"]);
        let mut many = request("n3", &ids, 40, true);
        many.sampling.n = 3;
        let outcome = run(&client(&worker, runtime), many).await;
        assert!(outcome.error.is_none(), "{:?}", outcome.error);
        let mut indexes: Vec<u32> = outcome.completions.iter().map(|(i, _)| *i).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, [0, 1, 2], "{runtime:?}");
        for (index, done) in &outcome.completions {
            assert_eq!(outcome.streamed(*index), done.output_ids);
            assert_digest(&done.output_ids, &ids, &[]);
        }
    }
}

#[tokio::test]
async fn pd_legs_share_the_room_and_prefill_bootstrap_on_both_runtimes() {
    let ids = prompt();
    for runtime in RUNTIMES {
        let prefill = start(runtime, "prefill", &["--zero-delay"]);
        let decode = start(runtime, "decode", &["--zero-delay"]);
        let room = match runtime {
            // Only fits TokenSpeed's int64 rooms.
            Runtime::TokenSpeed => i64::from(i32::MAX) + 12_345,
            Runtime::Sglang => i64::from(i32::MAX) - 7,
        };
        let leg = |stream| GenerateRequest {
            kv_bootstrap: Some(KvBootstrap {
                host: "127.0.0.1".to_owned(),
                port: prefill.bootstrap_port(),
                room,
            }),
            ..request("pd-1", &ids, 32, stream)
        };
        let (prefill_client, decode_client) = (client(&prefill, runtime), client(&decode, runtime));
        let (decoded, prefilled) = tokio::join!(
            run(&decode_client, leg(true)),
            run(&prefill_client, leg(false))
        );
        assert_eq!(
            prefilled.only_completion().completion_tokens,
            1,
            "{runtime:?}: prefill stops after the first token"
        );
        let done = decoded.only_completion();
        assert_eq!(done.completion_tokens, 32, "{runtime:?}");
        assert_eq!(decoded.streamed(0), done.output_ids);
        assert_digest(&done.output_ids, &ids, &[]);
    }
}

#[tokio::test]
async fn sglang_refuses_a_room_wider_than_int32_before_sending() {
    let worker = start(Runtime::Sglang, "decode", &["--zero-delay"]);
    let wide = GenerateRequest {
        kv_bootstrap: Some(KvBootstrap {
            host: "127.0.0.1".to_owned(),
            port: 1,
            room: i64::from(i32::MAX) + 1,
        }),
        ..request("wide", &prompt(), 4, true)
    };
    let err = run(&client(&worker, Runtime::Sglang), wide).await.error();
    assert_eq!(err.code, ErrorCode::InvalidParameter);
    assert_eq!(err.param.as_deref(), Some("bootstrap_room"));
}

#[tokio::test]
async fn epd_encodes_each_item_then_prefill_fetches_embeddings_by_room() {
    let flags = ["--zero-delay"];
    let encoders = [
        start(Runtime::TokenSpeed, "encode", &flags),
        start(Runtime::TokenSpeed, "encode", &flags),
    ];
    let prefill = start(Runtime::TokenSpeed, "prefill", &flags);
    let decode = start(Runtime::TokenSpeed, "decode", &flags);
    let ids = prompt();

    let grid = int64_le(&[1, 2, 2]);
    let inline_pixels = pixel_bytes(4, 1);
    let shm_pixels = pixel_bytes(4, 2);
    let shm_name = support::shm_file(&shm_pixels);
    let items = [
        image(
            TensorPayload::Inline(Bytes::from(inline_pixels.clone())),
            4,
            &grid,
            3,
        ),
        image(
            TensorPayload::Shm {
                name: shm_name.clone(),
                offset: 0,
                nbytes: shm_pixels.len() as u64,
                owner_id: "engine-client-test".to_owned(),
            },
            4,
            &grid,
            5,
        ),
    ];
    let rooms = [1_000_001_i64, i64::MAX - 3];
    for (index, item) in items.iter().enumerate() {
        let encoder = client(&encoders[index], Runtime::TokenSpeed);
        let accepted = bounded("encode", encoder.encode("epd-1", item, rooms[index]))
            .await
            .expect("encode");
        assert!(accepted, "item {index}");
    }
    assert!(
        !support::shm_path(&shm_name).exists(),
        "the encoder read and unlinked the shm tensor before answering"
    );

    let kv = KvBootstrap {
        host: "127.0.0.1".to_owned(),
        port: prefill.bootstrap_port(),
        room: 77,
    };
    let metadata: Vec<MediaItem> = items.iter().cloned().map(metadata_only).collect();
    let prefill_leg = GenerateRequest {
        media: metadata.clone(),
        encode_bootstrap: (0..2)
            .map(|index| EncodeBootstrap {
                item_index: index as u32,
                host: "127.0.0.1".to_owned(),
                port: encoders[index].bootstrap_port(),
                room: rooms[index],
            })
            .collect(),
        kv_bootstrap: Some(kv.clone()),
        ..request("epd-1", &ids, 32, false)
    };
    let decode_leg = GenerateRequest {
        media: metadata,
        kv_bootstrap: Some(kv),
        ..request("epd-1", &ids, 32, true)
    };
    let (prefill_client, decode_client) = (
        client(&prefill, Runtime::TokenSpeed),
        client(&decode, Runtime::TokenSpeed),
    );
    let (prefilled, decoded) = tokio::join!(
        run(&prefill_client, prefill_leg),
        run(&decode_client, decode_leg)
    );
    prefilled.only_completion();
    let done = decoded.only_completion();

    let grid_digest = digest::tensor_digest("int64", &[1, 3], &grid);
    let item_digest = |pixels: &[u8]| {
        digest::item_digest(
            &digest::tensor_digest("bfloat16", &[4, 1176], pixels),
            &[("image_grid_thw".to_owned(), grid_digest)],
        )
    };
    assert_digest(
        &done.output_ids,
        &ids,
        &[item_digest(&inline_pixels), item_digest(&shm_pixels)],
    );
}

#[tokio::test]
async fn sglang_concatenates_media_items_into_one_pixel_tensor() {
    let worker = start(Runtime::Sglang, "regular", &["--zero-delay"]);
    let ids = prompt();
    // Together over tonic's default 4 MiB message limit.
    let (rows_a, rows_b) = (1024, 1200);
    let (pixels_a, pixels_b) = (pixel_bytes(rows_a, 3), pixel_bytes(rows_b, 4));
    let (grid_a, grid_b) = (int64_le(&[1, 32, 32]), int64_le(&[1, 30, 40]));
    let request = GenerateRequest {
        media: vec![
            image(
                TensorPayload::Inline(Bytes::from(pixels_a.clone())),
                rows_a,
                &grid_a,
                3,
            ),
            image(
                TensorPayload::Inline(Bytes::from(pixels_b.clone())),
                rows_b,
                &grid_b,
                9,
            ),
        ],
        ..request("mm", &ids, 16, false)
    };
    let outcome = run(&client(&worker, Runtime::Sglang), request).await;
    let done = outcome.only_completion();

    // SGLang sees ONE item: the concatenation of both, rows then grids.
    let pixels = [pixels_a, pixels_b].concat();
    let grids = [grid_a, grid_b].concat();
    let concatenated = digest::item_digest(
        &digest::tensor_digest("bfloat16", &[rows_a + rows_b, 1176], &pixels),
        &[(
            "image_grid_thw".to_owned(),
            digest::tensor_digest("int64", &[2, 3], &grids),
        )],
    );
    assert_digest(&done.output_ids, &ids, &[concatenated]);
}

#[tokio::test]
async fn a_worker_failing_mid_stream_ends_the_stream_with_worker_error() {
    let ids = prompt();
    for runtime in RUNTIMES {
        let worker = start(
            runtime,
            "regular",
            &["--zero-delay", "--fail-after-tokens", "3"],
        );
        let outcome = run(&client(&worker, runtime), request("f", &ids, 10, true)).await;
        assert_eq!(outcome.chunks.len(), 3, "{runtime:?}");
        assert!(outcome.completions.is_empty());
        let err = outcome.error();
        assert_eq!(err.code, ErrorCode::WorkerError, "{runtime:?}: {err}");
        assert_eq!(
            err.worker.as_deref(),
            Some(worker.grpc_url().as_str()),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_stream_that_ends_without_completion_is_interrupted() {
    let ids = prompt();
    for runtime in RUNTIMES {
        let worker = start(
            runtime,
            "regular",
            &["--zero-delay", "--drop-after-tokens", "2"],
        );
        let outcome = run(&client(&worker, runtime), request("d", &ids, 10, true)).await;
        assert_eq!(outcome.chunks.len(), 2, "{runtime:?}");
        let err = outcome.error();
        assert_eq!(err.code, ErrorCode::StreamInterrupted, "{runtime:?}: {err}");
    }
}

#[tokio::test]
async fn an_unreachable_worker_is_worker_unavailable() {
    let url = dead_url();
    for runtime in RUNTIMES {
        let client = EngineClient::new(&url, runtime).expect("no I/O until first use");
        let err = run(&client, request("x", &prompt(), 4, true)).await.error();
        assert_eq!(err.code, ErrorCode::WorkerUnavailable, "{runtime:?}: {err}");
        assert_eq!(err.worker.as_deref(), Some(url.as_str()), "{err}");
        let err = bounded("health", client.health_check())
            .await
            .expect_err("unreachable");
        assert_eq!(err.code, ErrorCode::WorkerUnavailable);
    }
    let err = bounded("detect", EngineClient::detect(&url, Default::default()))
        .await
        .expect_err("unreachable");
    assert_eq!(err.code, ErrorCode::WorkerUnavailable);
}

#[tokio::test]
async fn abort_stops_a_running_request_and_loads_follow() {
    let ids = prompt();
    for runtime in RUNTIMES {
        let worker = start(runtime, "regular", &["--decode-ms-per-token", "20"]);
        let client = client(&worker, runtime);
        let mut events = client
            .generate(request("to-abort", &ids, 10_000, true))
            .await
            .expect("generate");
        for _ in 0..2 {
            let event = bounded("first chunks", events.next()).await;
            assert!(
                matches!(event, Some(Ok(GenerateEvent::Chunk { .. }))),
                "{event:?}"
            );
        }
        assert_eq!(client.loads().await.expect("loads").running_requests, 1);
        let aborted = client
            .abort("to-abort", "client went away")
            .await
            .expect("abort");
        assert!(aborted, "{runtime:?}");
        let mut finish = None;
        while let Some(event) = bounded("aborted stream", events.next()).await {
            if let GenerateEvent::Complete { finish_reason, .. } = event.expect("no error") {
                finish = Some(finish_reason);
            }
        }
        assert_eq!(finish.as_deref(), Some("abort"), "{runtime:?}");
        assert_eq!(client.loads().await.expect("loads").running_requests, 0);
        assert!(
            !client.abort("never-existed", "").await.expect("abort"),
            "unknown requests are not aborted"
        );
    }
}

#[tokio::test]
async fn discovery_describes_the_worker_on_both_runtimes() {
    let model_dir = support::model_dir().canonicalize().expect("model dir");
    let fixture_tokenizer =
        std::fs::read(model_dir.join("tokenizer.json")).expect("fixture tokenizer");
    let local_shm = smg_shared::shm::ShmNamespace::current().expect("shm identity");
    for runtime in RUNTIMES {
        // SGLang advertises a made-up identity: it must come from the wire.
        let mut flags = vec!["--zero-delay", "--served-model-name", "qwen-test"];
        let advertised = match runtime {
            Runtime::TokenSpeed => local_shm.as_str().to_owned(),
            Runtime::Sglang => {
                flags.extend(["--shm-namespace-id", "test-boot:77"]);
                "test-boot:77".to_owned()
            }
        };
        let worker = start(runtime, "regular", &flags);
        let client = client(&worker, runtime);

        assert!(client.health_check().await.expect("health"));

        let info = client.model_info().await.expect("model info");
        assert_eq!(info.model_path, model_dir.display().to_string());
        assert_eq!(info.tokenizer_path, info.model_path);
        assert_eq!(info.served_model_name, "qwen-test", "{runtime:?}");
        assert_eq!(info.model_type, "qwen2_vl");
        assert_eq!(info.architectures, ["Qwen2VLForConditionalGeneration"]);
        assert_eq!(info.vocab_size, 4007);
        assert_eq!(info.eos_token_ids, [IM_END, 4000]);
        assert_eq!(info.bos_token_id, Some(4000));
        assert_eq!(info.pad_token_id, Some(4000));
        assert!(info.supports_vision);
        assert!(info.max_context_length > 0);

        let server = client.server_info().await.expect("server info");
        assert_eq!(
            server.shm_namespace_id.as_deref(),
            Some(advertised.as_str())
        );
        assert!(server.version.starts_with("smg-sim-worker"), "{server:?}");
        assert_eq!(server.max_total_num_tokens, 262_144);
        assert_eq!(server.active_requests, 0);
        assert_eq!(server.server_args["protocol"], runtime.name());
        assert_eq!(server.server_args["served_model_name"], "qwen-test");
        assert_eq!(server.scheduler_info["simulated"], true);
        assert_eq!(server.scheduler_info["max_total_num_tokens"], 262_144);

        let load = client.loads().await.expect("loads");
        assert_eq!(load.dp_rank_count, 1);
        assert_eq!(load.running_requests, 0);
        assert_eq!(load.waiting_requests, 0);
        assert_eq!(load.max_total_tokens, 262_144);

        let archive = client.tokenizer_archive().await.expect("tokenizer archive");
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(archive)).expect("a zip");
        let mut tokenizer = Vec::new();
        std::io::Read::read_to_end(
            &mut zip.by_name("tokenizer.json").expect("tokenizer.json"),
            &mut tokenizer,
        )
        .expect("readable entry");
        assert_eq!(tokenizer, fixture_tokenizer, "{runtime:?}");
    }

    let unhealthy = start(Runtime::Sglang, "regular", &["--unhealthy"]);
    let client = client(&unhealthy, Runtime::Sglang);
    assert!(!client.health_check().await.expect("health"));
}

#[tokio::test]
async fn sglang_embeds_and_each_runtime_refuses_what_it_lacks() {
    let sglang = start(Runtime::Sglang, "regular", &["--zero-delay"]);
    let tokenspeed = start(Runtime::TokenSpeed, "regular", &["--zero-delay"]);
    let (sglang, tokenspeed) = (
        client(&sglang, Runtime::Sglang),
        client(&tokenspeed, Runtime::TokenSpeed),
    );
    let ids = prompt();

    let embedding = sglang.embed("e1", ids.clone()).await.expect("embed");
    assert_eq!(embedding.values.len(), 64, "the fixture's hidden size");
    assert_eq!(embedding.prompt_tokens as usize, ids.len());
    let norm = embedding.values.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "unit vector, got norm {norm}");
    let again = sglang.embed("e2", ids.clone()).await.expect("embed");
    assert_eq!(again, embedding, "deterministic for the same input");
    let other = sglang.embed("e3", ids[1..].to_vec()).await.expect("embed");
    assert_ne!(other.values, embedding.values);

    let err = tokenspeed
        .embed("e4", ids.clone())
        .await
        .expect_err("no Embed");
    assert_eq!(err.code, ErrorCode::UnsupportedEndpoint);
    let item = image(
        TensorPayload::Inline(Bytes::from(pixel_bytes(4, 0))),
        4,
        &int64_le(&[1, 2, 2]),
        0,
    );
    let err = sglang.encode("enc", &item, 1).await.expect_err("no Encode");
    assert_eq!(err.code, ErrorCode::UnsupportedEndpoint);
    assert!(err.message.contains("sglang"), "{err}");

    // A TokenSpeed regular worker is not an encoder: its refusal arrives as
    // a worker error, not a hang.
    let err = bounded("encode", tokenspeed.encode("enc", &item, 1))
        .await
        .expect_err("not an encode worker");
    assert_eq!(err.code, ErrorCode::WorkerError);
}

#[tokio::test]
async fn a_dropped_stream_frees_the_request_on_the_worker() {
    for runtime in RUNTIMES {
        let worker = start(runtime, "regular", &["--decode-ms-per-token", "20"]);
        let client = client(&worker, runtime);
        let mut events = client
            .generate(request("to-drop", &prompt(), 10_000, true))
            .await
            .expect("generate");
        assert!(matches!(
            bounded("first chunk", events.next()).await,
            Some(Ok(GenerateEvent::Chunk { .. }))
        ));
        assert_eq!(client.loads().await.expect("loads").running_requests, 1);
        drop(events);
        bounded("running back to zero", async {
            while client.loads().await.expect("loads").running_requests != 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}
