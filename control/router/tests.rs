use super::*;

fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 3,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(300),
        multiplier: 2.0,
        jitter_factor: 0.0,
        disabled: false,
    }
}

#[test]
fn backoff_grows_and_is_capped() {
    let config = retry();
    assert_eq!(config.backoff(1), Duration::from_millis(100));
    assert_eq!(config.backoff(2), Duration::from_millis(200));
    assert_eq!(config.backoff(3), Duration::from_millis(300));
    assert_eq!(config.backoff(9), Duration::from_millis(300));
}

#[test]
fn jitter_stays_within_its_factor() {
    let config = RetryConfig {
        jitter_factor: 0.5,
        ..retry()
    };
    for _ in 0..100 {
        let pause = config.backoff(1).as_secs_f64();
        assert!((0.05..=0.15).contains(&pause), "{pause}");
    }
}

#[test]
fn disabled_retries_mean_one_attempt() {
    assert_eq!(
        RetryConfig {
            disabled: true,
            ..retry()
        }
        .attempts(),
        1
    );
    assert_eq!(retry().attempts(), 4);
}

fn worker_at(url: &str) -> Arc<Worker> {
    let client = crate::engine::EngineClient::new(url, Runtime::TokenSpeed).expect("valid URL");
    let breaker = crate::workers::BreakerConfig {
        failure_threshold: 1,
        ..Default::default()
    };
    Arc::new(
        Worker::new(Arc::new(client), WorkerRole::Regular, None)
            .expect("worker")
            .with_breaker(breaker),
    )
}

#[tokio::test]
async fn a_failure_charges_only_the_worker_it_blames() {
    let short = worker_at("grpc://h:5000");
    let long = worker_at("grpc://h:50001");
    let chosen = [Arc::clone(&short), Arc::clone(&long)];
    let unavailable = tonic::Status::unavailable("connection refused");
    // The message of the long URL's error contains the short URL.
    record_failure(
        &chosen,
        &Error::from_worker_status(&unavailable, "grpc://h:50001"),
    );
    assert!(short.is_available(), "h:5000 was not to blame");
    assert!(!long.is_available(), "h:50001's circuit opened");

    let other = worker_at("grpc://h:7");
    let gateway_fault = Error::new(
        ErrorCode::RequestTimeout,
        "the request exceeded its time limit",
    );
    let unnamed = Error::new(ErrorCode::StreamInterrupted, "grpc://h:7 ended early");
    let rejected = Error::from_worker_status(&tonic::Status::invalid_argument("bad"), "grpc://h:7");
    for err in [gateway_fault, unnamed, rejected] {
        record_failure(std::slice::from_ref(&other), &err);
        assert!(other.is_available(), "{err} must not open a circuit");
    }
}

/// In-process tests of the request path: a [`Router`] over scripted engines
/// (the [`Engine`](crate::engine::Engine) trait instead of gRPC), with
/// tokio's clock paused where time matters. The same paths run through
/// real processes in `tests/`; these pin retries, blame, leg coupling,
/// cancellation and the stages that run, deterministically.
mod in_process {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use futures::future::BoxFuture;
    use futures::stream;
    use smg_shared::tensor::DType;
    use tokio::sync::watch;
    use tonic::Code;

    use super::*;
    use crate::engine::{
        Engine, EventStream, GenerateEvent, GenerateRequest, Load, MediaItem, Modality, ModelInfo,
        Sampling, ServerInfo, Tensor, TensorPayload,
    };
    use crate::pipeline::respond::OutputEvent;
    use crate::pipeline::spec::Prompt;
    use crate::policies::PolicyKind;
    use crate::workers::BreakerConfig;

    /// What a scripted engine does with one Generate call.
    #[derive(Debug, Clone)]
    enum Script {
        /// Starts, sends these events, ends.
        Answer(Vec<GenerateEvent>),
        /// Refuses to start with this status.
        Refuse(Code),
        /// Starts, sends these events, then fails with this status.
        FailAfter(Vec<GenerateEvent>, Code),
        /// Starts and then sends nothing until cancelled.
        Hang,
    }

    /// An engine that plays one [`Script`] per Generate call and records
    /// every call it receives.
    #[derive(Debug)]
    struct ScriptedEngine {
        url: String,
        scripts: Mutex<VecDeque<Script>>,
        /// Played when `scripts` has run out.
        otherwise: Script,
        generated: Mutex<Vec<GenerateRequest>>,
        encoded: Mutex<Vec<(String, i64)>>,
        aborted: watch::Sender<Vec<String>>,
    }

    impl ScriptedEngine {
        fn new(url: &str, scripts: Vec<Script>, otherwise: Script) -> Arc<Self> {
            Arc::new(Self {
                url: url.to_owned(),
                scripts: Mutex::new(scripts.into()),
                otherwise,
                generated: Mutex::new(Vec::new()),
                encoded: Mutex::new(Vec::new()),
                aborted: watch::Sender::new(Vec::new()),
            })
        }

        fn answering(url: &str, ids: &[u32]) -> Arc<Self> {
            Self::new(url, Vec::new(), Script::Answer(answer(ids)))
        }

        fn generated(&self) -> Vec<GenerateRequest> {
            self.generated.lock().expect("unpoisoned").clone()
        }

        fn encoded(&self) -> Vec<(String, i64)> {
            self.encoded.lock().expect("unpoisoned").clone()
        }

        /// The first request id aborted on this engine; fails the test if
        /// none is within a minute (of paused time, where paused).
        async fn first_abort(&self) -> String {
            let mut aborted = self.aborted.subscribe();
            let seen = tokio::time::timeout(
                Duration::from_secs(60),
                aborted.wait_for(|ids| !ids.is_empty()),
            )
            .await
            .expect("the leg is aborted on the worker")
            .expect("the engine lives");
            seen[0].clone()
        }

        fn status(&self, code: Code) -> Error {
            Error::from_worker_status(&tonic::Status::new(code, "scripted"), &self.url)
        }
    }

    impl Engine for ScriptedEngine {
        fn url(&self) -> &str {
            &self.url
        }

        fn runtime(&self) -> Runtime {
            Runtime::TokenSpeed
        }

        fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream>> {
            self.generated.lock().expect("unpoisoned").push(request);
            let script = self
                .scripts
                .lock()
                .expect("unpoisoned")
                .pop_front()
                .unwrap_or_else(|| self.otherwise.clone());
            let started: Result<EventStream> = match script {
                Script::Answer(events) => Ok(Box::pin(stream::iter(events.into_iter().map(Ok)))),
                Script::Refuse(code) => Err(self.status(code)),
                Script::FailAfter(events, code) => Ok(Box::pin(
                    stream::iter(events.into_iter().map(Ok))
                        .chain(stream::once(futures::future::ready(Err(self.status(code))))),
                )),
                Script::Hang => Ok(Box::pin(stream::pending())),
            };
            Box::pin(futures::future::ready(started))
        }

        fn encode<'a>(
            &'a self,
            request_id: &'a str,
            _item: &'a MediaItem,
            room: i64,
        ) -> BoxFuture<'a, Result<bool>> {
            self.encoded
                .lock()
                .expect("unpoisoned")
                .push((request_id.to_owned(), room));
            Box::pin(futures::future::ready(Ok(true)))
        }

        fn abort<'a>(
            &'a self,
            request_id: &'a str,
            _reason: &'a str,
        ) -> BoxFuture<'a, Result<bool>> {
            self.aborted
                .send_modify(|ids| ids.push(request_id.to_owned()));
            Box::pin(futures::future::ready(Ok(true)))
        }

        fn embed<'a>(
            &'a self,
            _request_id: &'a str,
            _input_ids: Vec<u32>,
        ) -> BoxFuture<'a, Result<crate::engine::Embedding>> {
            Box::pin(futures::future::ready(Err(Error::internal("not scripted"))))
        }

        fn health_check(&self) -> BoxFuture<'_, Result<bool>> {
            Box::pin(futures::future::ready(Ok(true)))
        }

        fn model_info(&self) -> BoxFuture<'_, Result<ModelInfo>> {
            Box::pin(futures::future::ready(Ok(ModelInfo::default())))
        }

        fn server_info(&self) -> BoxFuture<'_, Result<ServerInfo>> {
            Box::pin(futures::future::ready(Ok(ServerInfo::default())))
        }

        fn loads(&self) -> BoxFuture<'_, Result<Load>> {
            Box::pin(futures::future::ready(Ok(Load::default())))
        }

        fn tokenizer_archive(&self) -> BoxFuture<'_, Result<Vec<u8>>> {
            Box::pin(futures::future::ready(Err(Error::internal("not scripted"))))
        }
    }

    fn complete(ids: &[u32]) -> GenerateEvent {
        GenerateEvent::Complete {
            index: 0,
            output_ids: ids.to_vec(),
            finish_reason: "stop".into(),
            matched_stop: None,
            prompt_tokens: 3,
            completion_tokens: ids.len() as u32,
            cached_tokens: 0,
            logprobs: None,
        }
    }

    fn chunk(ids: &[u32]) -> GenerateEvent {
        GenerateEvent::Chunk {
            index: 0,
            token_ids: ids.to_vec(),
            prompt_tokens: 3,
            completion_tokens: ids.len() as u32,
            cached_tokens: 0,
            logprobs: None,
        }
    }

    /// A streamed answer: the ids as one chunk, then the completion.
    fn answer(ids: &[u32]) -> Vec<GenerateEvent> {
        vec![chunk(ids), complete(&[])]
    }

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        Tokenizer::from_model_dir(&dir).expect("the fixture model loads")
    }

    fn hello_ids() -> Vec<u32> {
        tokenizer().encode("Hello", false).expect("encodes")
    }

    /// A worker over `engine`, whose circuit opens at its first failure (so
    /// "was it charged?" is "is it unavailable?").
    fn worker(engine: &Arc<ScriptedEngine>, role: WorkerRole, port: Option<u16>) -> Worker {
        let engine: Arc<dyn Engine> = engine.clone();
        Worker::new(engine, role, port)
            .expect("worker")
            .with_breaker(BreakerConfig {
                failure_threshold: 1,
                ..Default::default()
            })
    }

    fn router(mode: Mode, workers: WorkerSet, retry: RetryConfig, timeout: Duration) -> Router {
        let round_robin = PolicyKind::RoundRobin.build();
        Router::new(RouterParts {
            mode,
            runtime: Runtime::TokenSpeed,
            workers,
            policies: RolePolicies {
                regular: Arc::clone(&round_robin),
                prefill: Arc::clone(&round_robin),
                decode: Arc::clone(&round_robin),
                encode: round_robin,
            },
            tokenizer: tokenizer(),
            model: ServedModel {
                name: "fixture".into(),
                max_context_length: 4096,
                vocab_size: 4007,
            },
            retry,
            request_timeout: timeout,
            media: None,
            tasks: crate::shutdown::RequestTasks::new(),
        })
    }

    fn no_retries() -> RetryConfig {
        RetryConfig {
            disabled: true,
            ..retry()
        }
    }

    fn spec(stream: bool) -> GenerationSpec {
        GenerationSpec {
            model: None,
            prompt: Prompt::TokenIds(vec![10, 11, 12]),
            images: Vec::new(),
            sampling: Sampling {
                n: 1,
                max_new_tokens: Some(16),
                ..Default::default()
            },
            stop_strings: Vec::new(),
            stream,
            include_usage: false,
            logprobs: None,
            echo: false,
            request_id: None,
        }
    }

    /// A prepared request carrying `media`, as Preparation would leave it.
    fn prepared(media: Vec<MediaItem>) -> PreparedRequest {
        PreparedRequest {
            endpoint: Endpoint::ChatCompletions,
            model: "fixture".into(),
            request_id: "chatcmpl-test".into(),
            client_request_id: None,
            output_budget: 16,
            input_ids: vec![10, 11, 12, 13],
            prompt_text: String::new(),
            leases: vec![None; media.len()],
            media,
            sampling: Sampling {
                n: 1,
                max_new_tokens: Some(16),
                ..Default::default()
            },
            stop_strings: Vec::new(),
            stream: true,
            include_usage: false,
            logprobs: None,
            echo: false,
            routing_key: None,
        }
    }

    fn image() -> MediaItem {
        MediaItem {
            modality: Modality::Image,
            content_hash: [7; 32],
            encoder_input: Tensor {
                dtype: DType::BFloat16,
                shape: vec![4],
                payload: Some(TensorPayload::Inline(bytes::Bytes::from(vec![0u8; 8]))),
            },
            model_specific: Vec::new(),
            placeholders: vec![(1, 2)],
            placeholder_token_id: None,
        }
    }

    /// The text of a response, to its end.
    async fn text_of(mut output: OutputStream) -> Result<String> {
        let mut text = String::new();
        while let Some(event) = output.next().await {
            if let OutputEvent::Delta { text: delta, .. } = event? {
                text.push_str(&delta);
            }
        }
        Ok(text)
    }

    #[tokio::test]
    async fn the_stages_that_run_are_the_stages_each_pipeline_declares() {
        // Regular, through Preparation from a spec.
        let engine = ScriptedEngine::answering("grpc://regular:1", &hello_ids());
        let workers = WorkerSet::default();
        workers.add(worker(&engine, WorkerRole::Regular, None));
        let regular = router(
            Mode::Regular,
            workers,
            no_retries(),
            Duration::from_secs(30),
        );
        let generation = regular
            .generate(Endpoint::ChatCompletions, spec(true), None)
            .await
            .expect("generates");
        let declared = regular.pipeline(Endpoint::ChatCompletions).expect("served");
        assert_eq!(generation.stages, declared.stages());
        assert!(!generation.stages.contains(&StageKind::Encode));
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        let sent = engine.generated();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].request_id, format!("{}-1", generation.request_id));

        // EPD, from a prepared request with one image: Encode runs, between
        // ClientAcquisition and RequestBuilding, and every call is named
        // after the attempt.
        let prefill = ScriptedEngine::new(
            "grpc://prefill:1",
            Vec::new(),
            Script::Answer(vec![complete(&[])]),
        );
        let decode = ScriptedEngine::answering("grpc://decode:1", &hello_ids());
        let encoder = ScriptedEngine::answering("grpc://encode:1", &[]);
        let workers = WorkerSet::default();
        workers.add(worker(&prefill, WorkerRole::Prefill, Some(8998)));
        workers.add(worker(&decode, WorkerRole::Decode, None));
        workers.add(worker(&encoder, WorkerRole::Encode, Some(8999)));
        let epd = router(
            Mode::EncodePrefillDecode,
            workers,
            no_retries(),
            Duration::from_secs(30),
        );
        let pipeline = epd.pipeline(Endpoint::ChatCompletions).expect("served");
        let generation = epd
            .dispatch(pipeline, prepared(vec![image()]), Instant::now())
            .await
            .expect("generates");
        assert_eq!(generation.stages, pipeline.stages());
        assert!(generation.stages.contains(&StageKind::Encode));
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        let encoded = encoder.encoded();
        assert_eq!(encoded.len(), 1, "one Encode per image");
        assert_eq!(encoded[0].0, "chatcmpl-test-1-enc0");
        let (prefill_sent, decode_sent) = (prefill.generated(), decode.generated());
        assert_eq!(prefill_sent[0].request_id, "chatcmpl-test-1");
        assert_eq!(decode_sent[0].request_id, "chatcmpl-test-1");
        let bootstrap = &prefill_sent[0].encode_bootstrap;
        assert_eq!(bootstrap.len(), 1);
        assert_eq!((bootstrap[0].port, bootstrap[0].room), (8999, encoded[0].1));
        assert!(
            decode_sent[0].media[0].encoder_input.payload.is_none(),
            "decode gets metadata only"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_start_is_retried_on_another_worker_after_the_backoff() {
        let ids = hello_ids();
        let refusing =
            ScriptedEngine::new("grpc://a:1", Vec::new(), Script::Refuse(Code::Unavailable));
        let healthy = ScriptedEngine::answering("grpc://b:1", &ids);
        let workers = WorkerSet::default();
        workers.add(worker(&refusing, WorkerRole::Regular, None));
        workers.add(worker(&healthy, WorkerRole::Regular, None));
        let router = router(Mode::Regular, workers, retry(), Duration::from_secs(30));
        let started = Instant::now();
        let generation = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect("the retry succeeds");
        assert_eq!(
            started.elapsed(),
            retry().backoff(1),
            "one pause, as configured"
        );
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        assert_eq!(refusing.generated().len(), 1);
        let retried = healthy.generated();
        assert_eq!(retried.len(), 1);
        assert_eq!(
            retried[0].request_id,
            format!("{}-2", generation.request_id)
        );
        let members = router.workers().members(WorkerRole::Regular).0;
        assert!(
            !members[0].is_available(),
            "the refusing worker was charged"
        );
        assert!(members[1].is_available(), "the healthy one was not");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_request_is_not_retried_and_charges_nobody() {
        let rejecting = ScriptedEngine::new(
            "grpc://a:1",
            Vec::new(),
            Script::Refuse(Code::InvalidArgument),
        );
        let other = ScriptedEngine::answering("grpc://b:1", &hello_ids());
        let workers = WorkerSet::default();
        workers.add(worker(&rejecting, WorkerRole::Regular, None));
        workers.add(worker(&other, WorkerRole::Regular, None));
        let router = router(Mode::Regular, workers, retry(), Duration::from_secs(30));
        let err = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect_err("the worker rejected it");
        assert_eq!(err.code, ErrorCode::WorkerRejected);
        assert_eq!(rejecting.generated().len(), 1);
        assert!(other.generated().is_empty(), "not retried");
        let members = router.workers().members(WorkerRole::Regular).0;
        assert!(members.iter().all(|worker| worker.is_available()));
        assert!(members.iter().all(|worker| worker.in_flight() == 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_prefill_aborts_decode_at_once_and_only_prefill_is_blamed() {
        let prefill = ScriptedEngine::new(
            "grpc://prefill:1",
            Vec::new(),
            Script::FailAfter(Vec::new(), Code::Internal),
        );
        let decode = ScriptedEngine::new("grpc://decode:1", Vec::new(), Script::Hang);
        let workers = WorkerSet::default();
        workers.add(worker(&prefill, WorkerRole::Prefill, Some(8998)));
        workers.add(worker(&decode, WorkerRole::Decode, None));
        let router = router(
            Mode::PrefillDecode,
            workers,
            no_retries(),
            Duration::from_secs(600),
        );
        let started = Instant::now();
        let err = router
            .generate(Endpoint::Completions, spec(true), None)
            .await
            .expect_err("prefill failed");
        assert_eq!(err.code, ErrorCode::WorkerError);
        assert_eq!(err.worker.as_deref(), Some("grpc://prefill:1"));
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "no rendezvous timeout is awaited"
        );
        let decode_id = decode.first_abort().await;
        assert_eq!(decode_id, decode.generated()[0].request_id);
        let prefill_worker = &router.workers().members(WorkerRole::Prefill).0[0];
        let decode_worker = &router.workers().members(WorkerRole::Decode).0[0];
        assert!(!prefill_worker.is_available(), "prefill is blamed");
        assert!(decode_worker.is_available(), "decode is not");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_goes_away_aborts_the_leg_and_releases_the_worker() {
        let ids = hello_ids();
        // Text, then nothing: the response is still streaming.
        let hanging_after_output =
            ScriptedEngine::new("grpc://b:1", Vec::new(), Script::Answer(vec![chunk(&ids)]));
        let workers = WorkerSet::default();
        workers.add(worker(&hanging_after_output, WorkerRole::Regular, None));
        let router = router(
            Mode::Regular,
            workers,
            no_retries(),
            Duration::from_secs(600),
        );
        let mut generation = router
            .generate(Endpoint::Completions, spec(true), None)
            .await
            .expect("starts");
        let first = generation
            .output
            .next()
            .await
            .expect("an event")
            .expect("text");
        assert!(matches!(first, OutputEvent::Delta { .. }));
        let worker = Arc::clone(&router.workers().members(WorkerRole::Regular).0[0]);
        assert_eq!(worker.in_flight(), 1, "held while the response streams");
        drop(generation);
        let aborted = hanging_after_output.first_abort().await;
        assert_eq!(aborted, hanging_after_output.generated()[0].request_id);
        assert_eq!(worker.in_flight(), 0, "released with the response");
        assert!(worker.is_available(), "a client leaving is nobody's fault");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_worker_times_out_at_the_deadline_and_is_not_charged() {
        let engine = ScriptedEngine::new("grpc://a:1", Vec::new(), Script::Hang);
        let workers = WorkerSet::default();
        workers.add(worker(&engine, WorkerRole::Regular, None));
        let timeout = Duration::from_secs(30);
        let router = router(Mode::Regular, workers, retry(), timeout);
        let started = Instant::now();
        let err = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect_err("nothing came");
        assert_eq!(err.code, ErrorCode::RequestTimeout);
        assert_eq!(started.elapsed(), timeout);
        assert_eq!(
            engine.generated().len(),
            1,
            "the deadline covers the retries too"
        );
        let aborted = engine.first_abort().await;
        assert_eq!(aborted, engine.generated()[0].request_id);
        let worker = &router.workers().members(WorkerRole::Regular).0[0];
        assert!(
            worker.is_available(),
            "the gateway's deadline is not the worker's fault"
        );
        assert_eq!(worker.in_flight(), 0);
    }
}
