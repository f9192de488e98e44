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
        "the request exceeded --request-timeout-secs",
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
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
    use crate::error::Reach;
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
        /// Fails to start with UNAVAILABLE, having got this far.
        Break(Reach),
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
        /// What HealthCheck answers.
        healthy: AtomicBool,
        health_checks: AtomicUsize,
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
                healthy: AtomicBool::new(true),
                health_checks: AtomicUsize::new(0),
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
                Script::Break(reach) => Err(self.status(Code::Unavailable).with_reach(reach)),
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
            self.health_checks.fetch_add(1, Ordering::Relaxed);
            Box::pin(futures::future::ready(Ok(self
                .healthy
                .load(Ordering::Relaxed))))
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
        panicking_router(mode, workers, retry, timeout, 0)
    }

    /// A policy that always picks the first worker it may: a retry goes
    /// elsewhere only if selection passes that one over.
    #[derive(Debug)]
    struct First;

    impl crate::policies::Policy for First {
        fn name(&self) -> &'static str {
            "first"
        }

        fn select(&self, pool: &crate::policies::Pool<'_>, _: &SelectionRequest<'_>) -> usize {
            pool.available()[0]
        }
    }

    /// [`router`] whose every role picks with [`First`].
    fn sticky_router(workers: WorkerSet, retry: RetryConfig) -> Router {
        let mut router = router(Mode::Regular, workers, retry, Duration::from_secs(30));
        let first: Arc<dyn crate::policies::Policy> = Arc::new(First);
        router.parts.policies = RolePolicies {
            regular: Arc::clone(&first),
            prefill: Arc::clone(&first),
            decode: Arc::clone(&first),
            encode: first,
            panic_threshold: 0,
        };
        router
    }

    /// A router whose selection panics below `panic_threshold` percent.
    fn panicking_router(
        mode: Mode,
        workers: WorkerSet,
        retry: RetryConfig,
        timeout: Duration,
        panic_threshold: u8,
    ) -> Router {
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
                panic_threshold,
            },
            tokenizer: tokenizer(),
            model: ServedModel {
                name: "fixture".into(),
                max_context_length: 4096,
                vocab_size: 4007,
                parsers: Default::default(),
            },
            retry,
            request_timeout: timeout,
            media: None,
            tasks: crate::shutdown::RequestTasks::new(),
            offload: crate::offload::Offload::new(1),
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
            logprobs: None,
            parsing: None,
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
        let mut next = async || {
            generation
                .output
                .next()
                .await
                .expect("an event")
                .expect("text")
        };
        assert!(matches!(next().await, OutputEvent::Started(_)));
        assert!(matches!(next().await, OutputEvent::Delta { .. }));
        let worker = Arc::clone(&router.workers().members(WorkerRole::Regular).0[0]);
        assert_eq!(worker.in_flight(), 1, "held while the response streams");
        drop(generation);
        let aborted = hanging_after_output.first_abort().await;
        assert_eq!(aborted, hanging_after_output.generated()[0].request_id);
        assert_eq!(worker.in_flight(), 0, "released with the response");
        assert!(worker.is_available(), "a client leaving is nobody's fault");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_mid_answer_is_retried_unless_output_reached_the_client() {
        let ids = hello_ids();
        // Each engine's first answer fails after its first token; later
        // ones are whole.
        let cut_once = |url: &str| {
            ScriptedEngine::new(
                url,
                vec![Script::FailAfter(vec![chunk(&ids)], Code::Internal)],
                Script::Answer(answer(&ids)),
            )
        };
        let fleet = || {
            let engines = [cut_once("grpc://a:1"), cut_once("grpc://b:1")];
            let workers = WorkerSet::default();
            for engine in &engines {
                workers.add(worker_opening_at(engine, 100));
            }
            let router = router(Mode::Regular, workers, retry(), Duration::from_secs(600));
            (engines, router)
        };
        let calls = |engines: &[Arc<ScriptedEngine>; 2]| {
            engines.iter().map(|e| e.generated().len()).sum::<usize>()
        };

        // Not streamed: the client has been sent nothing, so the answer is
        // run again, and the client gets the whole one.
        let (engines, router) = fleet();
        let generation = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect("the retry answers");
        let collected = crate::pipeline::respond::collect(generation.output, 1)
            .await
            .expect("a whole answer");
        assert_eq!(collected.choices[0].text, "Hello");
        assert_eq!(
            collected.choices[0].finish_reason,
            Some(crate::pipeline::respond::FinishReason::Stop)
        );
        assert_eq!(
            calls(&engines),
            3,
            "each worker's cut answer (round robin), then a whole one"
        );
        assert!(generation.first_token_at.is_some());

        // Streamed: the first event has gone to the client, so the failure
        // ends the stream instead.
        let (engines, router) = fleet();
        let generation = router
            .generate(Endpoint::Completions, spec(true), None)
            .await
            .expect("starts");
        let events: Vec<Result<OutputEvent>> = generation.output.collect().await;
        assert!(
            matches!(events.first(), Some(Ok(OutputEvent::Started(_)))),
            "{events:?}"
        );
        let last = events.last().expect("events");
        assert!(
            matches!(last, Err(err) if err.code == ErrorCode::WorkerError),
            "{events:?}"
        );
        assert_eq!(calls(&engines), 1, "not run again");
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

    /// A worker over `engine` whose circuit opens at `threshold` failures.
    fn worker_opening_at(engine: &Arc<ScriptedEngine>, threshold: u32) -> Worker {
        let engine: Arc<dyn Engine> = engine.clone();
        Worker::new(engine, WorkerRole::Regular, None)
            .expect("worker")
            .with_breaker(BreakerConfig {
                failure_threshold: threshold,
                ..Default::default()
            })
    }

    #[tokio::test(start_paused = true)]
    async fn one_connection_death_counts_once_however_many_requests_it_fails() {
        // Five requests fail together on one broken connection: the engine
        // reports the first failure as the first of that death, the others
        // as the same death seen again (as the pool's epochs do).
        let echo = Reach::Connection { first: false };
        let first = Reach::Connection { first: true };
        let engine = ScriptedEngine::new(
            "grpc://a:1",
            vec![
                Script::Break(first),
                Script::Break(echo),
                Script::Break(echo),
                Script::Break(echo),
                Script::Break(echo),
            ],
            Script::Break(first),
        );
        let workers = WorkerSet::default();
        workers.add(worker_opening_at(&engine, 2));
        let router = router(
            Mode::Regular,
            workers,
            no_retries(),
            Duration::from_secs(30),
        );
        let requests = (0..5).map(|_| router.generate(Endpoint::Completions, spec(false), None));
        for result in futures::future::join_all(requests).await {
            let err = result.expect_err("the connection broke");
            assert_eq!(err.code, ErrorCode::WorkerUnavailable);
        }
        let worker = &router.workers().members(WorkerRole::Regular).0[0];
        assert_eq!(
            worker.breaker().state(),
            crate::workers::BreakerState::Closed,
            "one death, one failure (the threshold is two)"
        );
        // The next death is a second failure in a row: now it opens.
        let err = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect_err("broken again");
        assert_eq!(err.code, ErrorCode::WorkerUnavailable);
        assert_eq!(worker.breaker().state(), crate::workers::BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_the_worker_never_saw_is_retried_and_charges_nobody() {
        let ids = hello_ids();
        let going_away =
            ScriptedEngine::new("grpc://a:1", Vec::new(), Script::Break(Reach::Unsent));
        let healthy = ScriptedEngine::answering("grpc://b:1", &ids);
        let workers = WorkerSet::default();
        workers.add(worker(&going_away, WorkerRole::Regular, None));
        workers.add(worker(&healthy, WorkerRole::Regular, None));
        let router = router(Mode::Regular, workers, retry(), Duration::from_secs(30));
        let generation = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect("the retry succeeds");
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        assert_eq!(going_away.generated().len(), 1);
        assert_eq!(healthy.generated().len(), 1);
        let members = router.workers().members(WorkerRole::Regular).0;
        assert!(
            members[0].is_available(),
            "a worker that never saw the call is not charged (threshold 1)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_never_sent_goes_to_another_worker_outside_the_retry_budget() {
        // The policy would pick the first worker again, and retries are off:
        // only the resend rule can take the call to the second.
        let ids = hello_ids();
        let dying = ScriptedEngine::new(
            "grpc://a:1",
            vec![Script::Break(Reach::Unsent)],
            Script::Answer(answer(&ids)),
        );
        let healthy = ScriptedEngine::answering("grpc://b:1", &ids);
        let workers = WorkerSet::default();
        workers.add(worker_opening_at(&dying, 2));
        workers.add(worker_opening_at(&healthy, 2));
        let router = sticky_router(workers, no_retries());
        let generation = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect("resent to the other worker");
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        assert_eq!(dying.generated().len(), 1, "not sent to the first again");
        assert_eq!(healthy.generated().len(), 1);
        let members = router.workers().members(WorkerRole::Regular).0;
        assert_eq!(members[0].breaker().failures(), 0, "charged nobody");
        // The next request is the policy's again: the first worker.
        let next = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect("answered");
        assert_eq!(text_of(next.output).await.expect("answers"), "Hello");
        assert_eq!(dying.generated().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_worker_gets_a_call_it_never_saw_again() {
        let ids = hello_ids();
        let dying = ScriptedEngine::new(
            "grpc://a:1",
            vec![Script::Break(Reach::Unsent)],
            Script::Answer(answer(&ids)),
        );
        let workers = WorkerSet::default();
        workers.add(worker_opening_at(&dying, 2));
        let router = sticky_router(workers, no_retries());
        let generation = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect("resent to the same worker");
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        assert_eq!(dying.generated().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_a_broken_connection_passes_its_worker_over() {
        let ids = hello_ids();
        let broken = ScriptedEngine::new(
            "grpc://a:1",
            vec![Script::Break(Reach::Connection { first: true })],
            Script::Answer(answer(&ids)),
        );
        let healthy = ScriptedEngine::answering("grpc://b:1", &ids);
        let workers = WorkerSet::default();
        workers.add(worker_opening_at(&broken, 2));
        workers.add(worker_opening_at(&healthy, 2));
        let router = sticky_router(workers, retry());
        let generation = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect("retried on the other worker");
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        assert_eq!(broken.generated().len(), 1);
        assert_eq!(healthy.generated().len(), 1);
        let members = router.workers().members(WorkerRole::Regular).0;
        assert_eq!(members[0].breaker().failures(), 1, "the death, once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_failing_on_every_attempt_charges_its_worker_once() {
        // A lone worker fails all four attempts of a request (retries 3).
        let failing = ScriptedEngine::new("grpc://a:1", Vec::new(), Script::Refuse(Code::Internal));
        let workers = WorkerSet::default();
        workers.add(worker_opening_at(&failing, 2));
        let router = router(Mode::Regular, workers, retry(), Duration::from_secs(30));
        let err = router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect_err("every attempt fails");
        assert_eq!(err.code, ErrorCode::WorkerError);
        assert_eq!(failing.generated().len(), 4, "retried three times");
        let worker = &router.workers().members(WorkerRole::Regular).0[0];
        assert_eq!(
            worker.breaker().state(),
            crate::workers::BreakerState::Closed,
            "one request, one failure (the threshold is two)"
        );
        router
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect_err("fails again");
        assert_eq!(
            worker.breaker().state(),
            crate::workers::BreakerState::Open,
            "a second request is a second failure"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_the_gateway_gives_up_on_before_any_output_charges_nobody() {
        // The caller (a client disconnect, an outer timeout) drops the
        // request while the worker has not answered its first token.
        let engine = ScriptedEngine::new("grpc://a:1", Vec::new(), Script::Hang);
        let workers = WorkerSet::default();
        workers.add(worker(&engine, WorkerRole::Regular, None));
        let router = router(Mode::Regular, workers, retry(), Duration::from_secs(600));
        let given_up = tokio::time::timeout(
            Duration::from_secs(1),
            router.generate(Endpoint::Completions, spec(false), None),
        )
        .await;
        assert!(given_up.is_err(), "still waiting when dropped");
        let aborted = engine.first_abort().await;
        assert_eq!(aborted, engine.generated()[0].request_id);
        let worker = &router.workers().members(WorkerRole::Regular).0[0];
        assert!(worker.is_available(), "the gateway's choice, not a failure");
        assert_eq!(worker.in_flight(), 0);
    }

    /// Opens `worker`'s circuit (its threshold is one failure).
    fn open_circuit(worker: &Worker) {
        worker.record_outcome(false);
        assert_eq!(worker.breaker().state(), crate::workers::BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn panic_mode_routes_across_every_worker_when_too_few_are_available() {
        let ids = hello_ids();
        let (a, b) = (
            ScriptedEngine::answering("grpc://a:1", &ids),
            ScriptedEngine::answering("grpc://b:1", &ids),
        );
        let workers = WorkerSet::default();
        let worker_a = workers.add(worker(&a, WorkerRole::Regular, None));
        let worker_b = workers.add(worker(&b, WorkerRole::Regular, None));
        let panicking = panicking_router(
            Mode::Regular,
            workers.clone(),
            no_retries(),
            Duration::from_secs(30),
            50,
        );
        let refusing = router(
            Mode::Regular,
            workers,
            no_retries(),
            Duration::from_secs(30),
        );

        // Half out is not below 50%: the open worker stays out.
        open_circuit(&worker_a);
        for _ in 0..4 {
            let generation = panicking
                .generate(Endpoint::Completions, spec(false), None)
                .await
                .expect("b serves");
            text_of(generation.output).await.expect("answers");
        }
        assert!(a.generated().is_empty(), "no panic at exactly half");
        assert_eq!(b.generated().len(), 4);

        // All out: without panic mode everything is refused; with it, both
        // workers take requests again, their circuits notwithstanding.
        open_circuit(&worker_b);
        let err = refusing
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect_err("no worker is available");
        assert_eq!(err.code, ErrorCode::NoHealthyWorker);
        for _ in 0..4 {
            let generation = panicking
                .generate(Endpoint::Completions, spec(false), None)
                .await
                .expect("panic mode serves");
            assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        }
        assert_eq!((a.generated().len(), b.generated().len()), (2, 6));
        // A draining worker is never a candidate, panic or not.
        worker_a.start_draining();
        worker_b.start_draining();
        let err = panicking
            .generate(Endpoint::Completions, spec(false), None)
            .await
            .expect_err("nobody left");
        assert_eq!(err.code, ErrorCode::NoHealthyWorker);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_circuit_is_probed_back_in_long_before_its_timeout() {
        let engine = ScriptedEngine::answering("grpc://a:1", &hello_ids());
        engine.healthy.store(false, Ordering::Relaxed);
        let workers = WorkerSet::default();
        let config = BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::from_secs(60),
            probe_interval: Duration::from_millis(250),
            max_probe_interval: Duration::from_secs(2),
            ..Default::default()
        };
        let engine_dyn: Arc<dyn Engine> = engine.clone();
        let worker = workers.add(
            Worker::new(engine_dyn, WorkerRole::Regular, None)
                .expect("worker")
                .with_breaker(config),
        );
        crate::workers::spawn_circuit_probe(Arc::clone(&worker), Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            engine.health_checks.load(Ordering::Relaxed),
            0,
            "a closed circuit is not probed"
        );
        open_circuit(&worker);
        // Unhealthy: probed at 0.25, 0.75, 1.75, 3.75, 5.75 s... and kept open.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(engine.health_checks.load(Ordering::Relaxed), 4);
        assert_eq!(worker.breaker().state(), crate::workers::BreakerState::Open);
        engine.healthy.store(true, Ordering::Relaxed);
        let recovered = Instant::now();
        while worker.breaker().state() == crate::workers::BreakerState::Open {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            worker.breaker().state(),
            crate::workers::BreakerState::HalfOpen
        );
        assert!(
            recovered.elapsed() <= config.max_probe_interval,
            "back within one probe pause ({:?}), not open_for (60 s)",
            recovered.elapsed()
        );
        // Half-open: the next request is a trial, and closes it.
        let generation = router(
            Mode::Regular,
            workers,
            no_retries(),
            Duration::from_secs(30),
        )
        .generate(Endpoint::Completions, spec(false), None)
        .await
        .expect("the trial");
        assert_eq!(text_of(generation.output).await.expect("answers"), "Hello");
        assert!(worker.is_available());
        worker.retire();
    }

    /// Waits (in paused time) until `done` holds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(60), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_worker_makes_the_next_request_wait_for_its_slot() {
        let engine = ScriptedEngine::new(
            "grpc://a:1",
            vec![Script::Hang],
            Script::Answer(answer(&hello_ids())),
        );
        let workers = WorkerSet::default();
        let worker = workers.add(
            self::worker(&engine, WorkerRole::Regular, None)
                .with_in_flight_limit(crate::workers::InFlightLimit::Fixed(1)),
        );
        let router = Arc::new(router(
            Mode::Regular,
            workers,
            no_retries(),
            Duration::from_secs(600),
        ));
        let generate = |router: &Arc<Router>| {
            let router = Arc::clone(router);
            tokio::spawn(async move {
                let generation = router
                    .generate(Endpoint::Completions, spec(false), None)
                    .await?;
                text_of(generation.output).await
            })
        };
        let first = generate(&router);
        until("the first request is on the worker", || {
            engine.generated().len() == 1
        })
        .await;
        let second = generate(&router);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            engine.generated().len(),
            1,
            "the second waits in the gateway"
        );
        assert_eq!(worker.in_flight(), 1);
        // The first ends (its client leaves): its slot passes to the second.
        first.abort();
        let text = second.await.expect("joins").expect("the second is served");
        assert_eq!(text, "Hello");
        assert_eq!(engine.generated().len(), 2);
        assert_eq!(worker.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn pd_legs_take_their_slots_together_or_not_at_all() {
        let prefill = ScriptedEngine::new(
            "grpc://prefill:1",
            Vec::new(),
            Script::Answer(vec![complete(&[])]),
        );
        let decode = ScriptedEngine::answering("grpc://decode:1", &hello_ids());
        let workers = WorkerSet::default();
        let prefill_worker = workers.add(
            worker(&prefill, WorkerRole::Prefill, Some(8998))
                .with_in_flight_limit(crate::workers::InFlightLimit::Fixed(1)),
        );
        let decode_worker = workers.add(
            worker(&decode, WorkerRole::Decode, None)
                .with_in_flight_limit(crate::workers::InFlightLimit::Fixed(1)),
        );
        let router = Arc::new(router(
            Mode::PrefillDecode,
            workers,
            no_retries(),
            Duration::from_secs(600),
        ));
        // Decode is full (another request holds its one slot).
        let held = decode_worker.acquire();
        let request = {
            let router = Arc::clone(&router);
            tokio::spawn(async move {
                let generation = router
                    .generate(Endpoint::Completions, spec(true), None)
                    .await?;
                text_of(generation.output).await
            })
        };
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            prefill_worker.in_flight(),
            0,
            "prefill's slot is not held while decode's is awaited"
        );
        assert!(prefill.generated().is_empty() && decode.generated().is_empty());
        drop(held);
        let text = request.await.expect("joins").expect("served");
        assert_eq!(text, "Hello");
        assert_eq!(
            (prefill.generated().len(), decode.generated().len()),
            (1, 1)
        );
        assert_eq!(
            (prefill_worker.in_flight(), decode_worker.in_flight()),
            (0, 0)
        );
    }
}
