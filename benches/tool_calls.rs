//! What tool calling costs the gateway per core: requests per gateway
//! CPU-second with `tools` set and a tool-call answer, against the same
//! gateway in the same run answering plain text without tools.
//!
//! Why it exists: issue 16 asks that a request with tools, whose answer is
//! a think block and tool calls, cost the gateway within 15% of one without
//! (req/s per core). Tools add work on both sides of the engine: the
//! request path renders every tool's JSON schema into the chat template and
//! tokenizes the longer prompt; the response path runs the reasoning parser
//! and the tool-call parser over the output and builds `tool_calls`. This
//! bench measures that whole path; `parsers/benches/tool_parsers.rs` times
//! the parsers alone.
//!
//! Set-up: the `qwen3` family fixture served as `Qwen/Qwen3-8B` (so the
//! `qwen` tool parser and the `qwen3` reasoning parser are picked), a
//! zero-delay `smg-sim-worker --script` pinned to core 0, one gateway pinned
//! to core 1 with `taskset` (when there are two cores), the load generator
//! unpinned; closed loop, 64 in flight, every prompt different; routing
//! round robin, as in `gateway_overhead` (the scenario the issue names;
//! `SMG_BENCH_POLICY=cache_aware` measures the default policy). The script
//! answers a prompt that carries tools (the template's `<tools>` block) with
//! a think block and two Hermes `<tool_call>` blocks, and any other prompt
//! with plain text of about the same token count. Rows, in order:
//!
//! - chat completions without tools (the baseline), whole and streamed;
//! - whole chat without tools whose answer starts with a think block like
//!   the tool answer's (its prompt asks to think first): Qwen3 reasons with
//!   or without tools, so "vs think" compares the tools alone, where the
//!   baseline's "vs same" also charges the tools with the reasoning;
//! - chat completions with 1 and with 8 tools (realistic JSON schemas),
//!   whole and streamed;
//! - `/v1/responses` with the same tools, whole, `store: false`, and
//!   without tools (the Responses API's own cost, for reading the others).
//!
//! Before its row each scenario is checked once (tool calls parsed, or
//! plain text with none), so a row cannot measure a path that silently
//! skipped the parsers. Prints a table with each row's ratio to the
//! baseline and to the same API and shape without tools, and writes
//! `bench-results/tool_calls.json`. Run: `cargo bench --bench tool_calls`
//! (`SMG_BENCH_SECS` per row, default 8; `SMG_BENCH_ROUNDS`, default 1,
//! runs every row that many times, round after round, and pools each row's
//! rounds, printing each round's ratio to the row without tools: on a
//! shared machine the load swings between rows, and a ratio of two rows
//! run minutes apart carries the swing; `SMG_BENCH_ONLY`, a `|`-separated
//! list of row labels, runs only those rows, e.g. to profile one; the
//! gateway's pid is printed first). The load generator sends each row's
//! `tools` as text serialized once, so its own work per request stays that
//! of a small body. Not a test: nothing here asserts a speed.

// The e2e harness (process start-up, ports, the family fixtures); its
// digest unit tests are not run here, so their imports look unused in this
// target.
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{closed_loop, cpu_seconds, load_average, percentile, pin};
use serde_json::{Value, json};
use support::chat::FamilyModel;

const MODEL_ID: &str = "Qwen/Qwen3-8B";
const CONCURRENCY: usize = 64;
const MAX_TOKENS: u32 = 300;

/// The answer to a prompt with tools: reasoning, a sentence, two calls.
const TOOL_ANSWER: &str = "<think>\nThe user wants the weather in two cities, so I will call \
    get_weather once for each of them.\n</think>\n\nLet me check both cities.\n<tool_call>\n\
    {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n\
    </tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \
    \"unit\": \"celsius\"}}\n</tool_call>";

/// The answer to a prompt without tools: plain text of about as many
/// tokens (the counts are printed from `usage` before the rows).
const PLAIN_ANSWER: &str = "The weather in Paris is mild today, around sixteen degrees with \
    a light breeze from the west and some clouds in the afternoon. Rome is warmer and sunny, \
    about twenty one degrees, with clear skies expected until the evening. If you travel \
    between the two this week, pack a light jacket for the Paris evenings and sunglasses for \
    Rome; no rain is expected in either city before the weekend.";

/// The answer to a prompt without tools that asks the model to think
/// first: the tool answer's kind of think block, then plain text, about as
/// many tokens as the others. A thinking model (Qwen3 thinks by default)
/// reasons whether or not it has tools; against this row, a row with tools
/// differs from its baseline by the tools alone.
const THINKING_ANSWER: &str = "<think>\nThe user wants the weather in two cities, so I will \
    describe each of them in turn.\n</think>\n\nThe weather in Paris is mild today, around \
    sixteen degrees with a light breeze from the west and some clouds in the afternoon. Rome is \
    warmer and sunny, about twenty one degrees, with clear skies expected until the evening. \
    Pack a light jacket for Paris and sunglasses for Rome.";

/// What a thinking row's prompt carries for the script to match.
const THINK_FIRST: &str = "Think it over first.";

/// Eight function tools with schemas of the size real agents send: nested
/// objects, enums, arrays, descriptions. `get_weather` comes first, so the
/// 1-tool rows carry it alone.
fn chat_tools() -> Vec<Value> {
    let function = |name: &str, description: &str, parameters: Value| {
        json!({"type": "function", "function": {
            "name": name, "description": description, "parameters": parameters}})
    };
    vec![
        function(
            "get_weather",
            "Get the current weather and today's forecast for a city.",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "country": {"type": "string", "description": "ISO 3166-1 alpha-2 code"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "Temperature unit"},
                "include_hourly": {"type": "boolean", "default": false}},
                "required": ["city"], "additionalProperties": false}),
        ),
        function(
            "search_web",
            "Search the web and return the top results with titles, URLs and snippets.",
            json!({"type": "object", "properties": {
                "query": {"type": "string", "description": "The search query"},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5},
                "recency_days": {"type": "integer", "minimum": 1,
                                 "description": "Only results newer than this"},
                "site": {"type": "string", "description": "Restrict to one domain"}},
                "required": ["query"]}),
        ),
        function(
            "send_email",
            "Send an email on the user's behalf. Ask before sending to new recipients.",
            json!({"type": "object", "properties": {
                "to": {"type": "array", "items": {"type": "string", "format": "email"},
                       "minItems": 1},
                "cc": {"type": "array", "items": {"type": "string", "format": "email"}},
                "subject": {"type": "string", "maxLength": 200},
                "body": {"type": "string", "description": "Plain-text body"},
                "priority": {"type": "string", "enum": ["low", "normal", "high"]}},
                "required": ["to", "subject", "body"]}),
        ),
        function(
            "create_calendar_event",
            "Create an event in the user's primary calendar.",
            json!({"type": "object", "properties": {
                "title": {"type": "string"},
                "start": {"type": "string", "format": "date-time"},
                "end": {"type": "string", "format": "date-time"},
                "location": {"type": "string"},
                "attendees": {"type": "array", "items": {"type": "object", "properties": {
                    "email": {"type": "string", "format": "email"},
                    "optional": {"type": "boolean"}}, "required": ["email"]}},
                "reminder_minutes": {"type": "integer", "minimum": 0, "maximum": 10080}},
                "required": ["title", "start", "end"]}),
        ),
        function(
            "get_stock_quote",
            "Latest price, change and volume for a listed stock.",
            json!({"type": "object", "properties": {
                "symbol": {"type": "string", "pattern": "^[A-Z.]{1,10}$"},
                "exchange": {"type": "string", "enum": ["NYSE", "NASDAQ", "LSE", "XETRA", "TSE"]},
                "fields": {"type": "array", "items": {"type": "string",
                    "enum": ["price", "change", "volume", "market_cap", "pe_ratio"]}}},
                "required": ["symbol"]}),
        ),
        function(
            "search_flights",
            "Search one-way or return flights between two airports.",
            json!({"type": "object", "properties": {
                "origin": {"type": "string", "description": "IATA airport code"},
                "destination": {"type": "string", "description": "IATA airport code"},
                "depart_date": {"type": "string", "format": "date"},
                "return_date": {"type": "string", "format": "date"},
                "passengers": {"type": "object", "properties": {
                    "adults": {"type": "integer", "minimum": 1},
                    "children": {"type": "integer", "minimum": 0}}, "required": ["adults"]},
                "cabin": {"type": "string", "enum": ["economy", "premium", "business", "first"]},
                "max_stops": {"type": "integer", "minimum": 0, "maximum": 3}},
                "required": ["origin", "destination", "depart_date", "passengers"]}),
        ),
        function(
            "translate_text",
            "Translate text between languages, keeping its formatting.",
            json!({"type": "object", "properties": {
                "text": {"type": "string"},
                "source_language": {"type": "string", "description": "BCP 47 tag; detected if absent"},
                "target_language": {"type": "string", "description": "BCP 47 tag"},
                "formality": {"type": "string", "enum": ["default", "formal", "informal"]}},
                "required": ["text", "target_language"]}),
        ),
        function(
            "query_orders",
            "Look up the user's orders by status and date range, newest first.",
            json!({"type": "object", "properties": {
                "status": {"type": "array", "items": {"type": "string",
                    "enum": ["pending", "paid", "shipped", "delivered", "cancelled", "returned"]}},
                "placed_after": {"type": "string", "format": "date"},
                "placed_before": {"type": "string", "format": "date"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
                "include_items": {"type": "boolean", "default": true}},
                "required": []}),
        ),
    ]
}

/// The same tools in the Responses API's flat shape.
fn responses_tools(chat: &[Value]) -> Vec<Value> {
    chat.iter()
        .map(|tool| {
            let function = &tool["function"];
            json!({"type": "function", "name": function["name"],
                   "description": function["description"],
                   "parameters": function["parameters"]})
        })
        .collect()
}

/// One row's request shape.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    label: &'static str,
    tools: usize,
    stream: bool,
    responses: bool,
    /// Asks for an answer with a think block (rows without tools only).
    thinking: bool,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        label: "chat, no tools",
        tools: 0,
        stream: false,
        responses: false,
        thinking: false,
    },
    Scenario {
        label: "chat, no tools, thinking",
        tools: 0,
        stream: false,
        responses: false,
        thinking: true,
    },
    Scenario {
        label: "chat, 1 tool",
        tools: 1,
        stream: false,
        responses: false,
        thinking: false,
    },
    Scenario {
        label: "chat, 8 tools",
        tools: 8,
        stream: false,
        responses: false,
        thinking: false,
    },
    Scenario {
        label: "chat streamed, no tools",
        tools: 0,
        stream: true,
        responses: false,
        thinking: false,
    },
    Scenario {
        label: "chat streamed, 1 tool",
        tools: 1,
        stream: true,
        responses: false,
        thinking: false,
    },
    Scenario {
        label: "chat streamed, 8 tools",
        tools: 8,
        stream: true,
        responses: false,
        thinking: false,
    },
    Scenario {
        label: "responses, no tools",
        tools: 0,
        stream: false,
        responses: true,
        thinking: false,
    },
    Scenario {
        label: "responses, 1 tool",
        tools: 1,
        stream: false,
        responses: true,
        thinking: false,
    },
    Scenario {
        label: "responses, 8 tools",
        tools: 8,
        stream: false,
        responses: true,
        thinking: false,
    },
];

impl Scenario {
    fn path(self) -> &'static str {
        if self.responses {
            "/v1/responses"
        } else {
            "/v1/chat/completions"
        }
    }

    /// Request `n` without `tools`: the same question each time, numbered
    /// so every prompt differs.
    fn body_without_tools(self, n: u64) -> Value {
        let think = if self.thinking { THINK_FIRST } else { "" };
        let text = format!("What is the weather in Paris and Rome? {think}Request {n}");
        if self.responses {
            json!({"model": MODEL_ID, "input": text, "store": false,
                   "max_output_tokens": MAX_TOKENS})
        } else {
            json!({"model": MODEL_ID, "max_tokens": MAX_TOKENS, "stream": self.stream,
                   "messages": [{"role": "user", "content": text}]})
        }
    }

    /// This row's `tools` (none for a row without).
    fn tools_value(self, tools: &[Value]) -> Option<Value> {
        let tools = &tools[..self.tools];
        match (tools.is_empty(), self.responses) {
            (true, _) => None,
            (false, true) => Some(Value::Array(responses_tools(tools))),
            (false, false) => Some(Value::Array(tools.to_vec())),
        }
    }

    /// The JSON body of request `n`, with `tools` given already serialized
    /// (`,"tools":[...]`, empty for none): the load generator shares its
    /// cores with the worker, so it does not rebuild and re-serialize the
    /// same schemas for every request.
    fn body_text(self, tools_field: &str, n: u64) -> String {
        let mut text = self.body_without_tools(n).to_string();
        if !tools_field.is_empty() {
            text.pop();
            text.push_str(tools_field);
            text.push('}');
        }
        text
    }

    /// The baseline this row's ratio is taken against: the first row.
    fn is_baseline(self) -> bool {
        self.tools == 0 && !self.stream && !self.responses && !self.thinking
    }

    /// The row of the same API and shape without tools (and without a
    /// think block).
    fn without_tools(self) -> Option<&'static Scenario> {
        SCENARIOS.iter().find(|other| {
            other.tools == 0
                && !other.thinking
                && other.stream == self.stream
                && other.responses == self.responses
        })
    }

    /// For whole chat with tools, the whole chat row without tools whose
    /// answer thinks as the tool answer does.
    fn thinking_without_tools(self) -> Option<&'static Scenario> {
        if self.tools == 0 || self.stream || self.responses {
            return None;
        }
        SCENARIOS
            .iter()
            .find(|other| other.thinking && !other.stream && !other.responses)
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    scenario: String,
    tools: usize,
    stream: bool,
    /// Prompt and output tokens of the checked answer (`usage`; 0 for a
    /// stream).
    prompt_tokens: u64,
    output_tokens: u64,
    requests: usize,
    failures: u64,
    requests_per_sec: f64,
    /// CPU the gateway used per wall second (1.0 = one full core).
    gateway_cpu_cores: f64,
    /// CPU the sim worker used per wall second: near 1.0, the worker (not
    /// the gateway) limited the row's req/s.
    worker_cpu_cores: f64,
    /// Requests per CPU-second of the gateway: the per-core figure.
    requests_per_gateway_cpu_sec: f64,
    /// That figure over the baseline row's (chat, no tools, whole).
    ratio_to_baseline: f64,
    /// That figure over the same API and shape's row without tools.
    ratio_to_same_without_tools: f64,
    /// Whole chat with tools: that figure over the thinking row without
    /// tools (the tools alone; NaN for other rows).
    ratio_to_thinking_without_tools: f64,
    load_average: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Sends one request of `scenario` and checks the answer went through the
/// path the row claims to measure; returns its prompt and output token
/// counts (0 for a stream, which carries no usage unless asked).
async fn check(http: &reqwest::Client, url: &str, scenario: Scenario, body: String) -> (u64, u64) {
    let response = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .expect("request sent");
    let status = response.status();
    let text = response.text().await.expect("a body");
    assert!(status.is_success(), "{}: {status}: {text}", scenario.label);
    let with_tools = scenario.tools > 0;
    if scenario.stream {
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        let calls = text.matches("\"tool_calls\":[{").count();
        assert_eq!(calls > 0, with_tools, "{}: {text}", scenario.label);
        assert_eq!(
            text.contains("\"reasoning_content\""),
            with_tools,
            "{}: {text}",
            scenario.label
        );
        return (0, 0);
    }
    let count = |usage: &Value, key: &str| usage[key].as_u64().unwrap_or(0);
    let body: Value = serde_json::from_str(&text).expect("a JSON answer");
    if scenario.responses {
        let calls = body["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|item| item["type"] == "function_call")
            .count();
        assert_eq!(calls, if with_tools { 2 } else { 0 }, "{body}");
        (
            count(&body["usage"], "input_tokens"),
            count(&body["usage"], "output_tokens"),
        )
    } else {
        let choice = &body["choices"][0];
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(calls, if with_tools { 2 } else { 0 }, "{body}");
        let reason = if with_tools { "tool_calls" } else { "stop" };
        assert_eq!(choice["finish_reason"], reason, "{body}");
        let reasoned = choice["message"]["reasoning_content"]
            .as_str()
            .is_some_and(|text| !text.is_empty());
        assert_eq!(
            reasoned,
            with_tools || scenario.thinking,
            "{}: {body}",
            scenario.label
        );
        (
            count(&body["usage"], "prompt_tokens"),
            count(&body["usage"], "completion_tokens"),
        )
    }
}

/// One timed run of one scenario.
#[derive(Debug, Default)]
struct Slice {
    prompt_tokens: u64,
    output_tokens: u64,
    /// Latencies of the successful requests, ms.
    latencies: Vec<f64>,
    failures: u64,
    wall: f64,
    gateway_cpu: f64,
    worker_cpu: f64,
    load_average: f64,
}

impl Slice {
    /// Requests per CPU-second of the gateway.
    fn per_gateway_cpu_sec(&self) -> f64 {
        self.latencies.len() as f64 / self.gateway_cpu
    }

    /// `later` added to this one (the rounds of one scenario pooled).
    fn pool(&mut self, later: Slice) {
        self.prompt_tokens = later.prompt_tokens;
        self.output_tokens = later.output_tokens;
        self.latencies.extend(later.latencies);
        self.failures += later.failures;
        self.wall += later.wall;
        self.gateway_cpu += later.gateway_cpu;
        self.worker_cpu += later.worker_cpu;
        self.load_average = self.load_average.max(later.load_average);
    }

    fn row(mut self, scenario: Scenario) -> Row {
        self.latencies.sort_by(f64::total_cmp);
        let requests = self.latencies.len();
        Row {
            scenario: scenario.label.to_owned(),
            tools: scenario.tools,
            stream: scenario.stream,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            requests,
            failures: self.failures,
            requests_per_sec: requests as f64 / self.wall,
            gateway_cpu_cores: self.gateway_cpu / self.wall,
            worker_cpu_cores: self.worker_cpu / self.wall,
            requests_per_gateway_cpu_sec: self.per_gateway_cpu_sec(),
            ratio_to_baseline: f64::NAN,
            ratio_to_same_without_tools: f64::NAN,
            ratio_to_thinking_without_tools: f64::NAN,
            load_average: self.load_average,
            p50_ms: percentile(&self.latencies, 0.5),
            p99_ms: percentile(&self.latencies, 0.99),
        }
    }
}

/// Runs `scenario` from [`CONCURRENCY`] loops for `duration`.
async fn throughput(
    http: &reqwest::Client,
    gateway: &support::Gateway,
    worker: &support::SimWorker,
    scenario: Scenario,
    tools: &Arc<Vec<Value>>,
    duration: Duration,
) -> Slice {
    let url = gateway.url(scenario.path());
    let sequence = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let tools_field = scenario
        .tools_value(tools)
        .map(|tools| format!(",\"tools\":{tools}"))
        .unwrap_or_default();
    let checked = scenario.body_text(&tools_field, u64::MAX);
    let (prompt_tokens, output_tokens) = check(http, &url, scenario, checked).await;
    let (http, count) = (http.clone(), Arc::clone(&failures));
    let cpu_before = cpu_seconds(gateway.pid());
    let worker_before = cpu_seconds(worker.pid());
    let started = Instant::now();
    let (latencies, _) = closed_loop(CONCURRENCY, duration, move || {
        let n = sequence.fetch_add(1, Ordering::Relaxed);
        let body = scenario.body_text(&tools_field, n);
        let (http, url, failures) = (http.clone(), url.clone(), Arc::clone(&count));
        async move {
            // The whole body is read, streamed or not: a stream's time is
            // to its last event.
            let request = http
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
            let ok = match request.send().await {
                Ok(response) if response.status().is_success() => response.bytes().await.is_ok(),
                _ => false,
            };
            if !ok {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            ok
        }
    })
    .await;
    let wall = started.elapsed().as_secs_f64();
    let used = |pid: u32, before: Option<f64>| {
        cpu_seconds(pid)
            .zip(before)
            .map_or(f64::NAN, |(after, before)| after - before)
    };
    Slice {
        prompt_tokens,
        output_tokens,
        latencies,
        failures: failures.load(Ordering::Relaxed),
        wall,
        gateway_cpu: used(gateway.pid(), cpu_before),
        worker_cpu: used(worker.pid(), worker_before),
        load_average: load_average().unwrap_or(f64::NAN),
    }
}

fn main() {
    let secs = std::env::var("SMG_BENCH_SECS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(8);
    let only: Vec<String> = std::env::var("SMG_BENCH_ONLY")
        .map(|list| list.split('|').map(str::to_owned).collect())
        .unwrap_or_default();
    let duration = Duration::from_secs(secs);
    let rounds: usize = std::env::var("SMG_BENCH_ROUNDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1)
        .max(1);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let model = FamilyModel::new("qwen3", MODEL_ID);
    // A prompt with tools holds the template's `<tools>` block; the first
    // matching line wins, and the empty `when` matches every other prompt.
    let script = support::chat::script(&[
        json!({"when": "<tools>", "text": TOOL_ANSWER}),
        json!({"when": THINK_FIRST, "text": THINKING_ANSWER}),
        json!({"when": "", "text": PLAIN_ANSWER}),
    ]);
    let worker = model.worker("regular", &script);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= 2 {
        pin(worker.pid(), 0);
    }
    // The scenario is gateway_overhead's, which routes round robin;
    // `SMG_BENCH_POLICY=cache_aware` (the gateway's default) adds the prefix
    // tree's hashing and insert, which grow with the prompt.
    let policy = std::env::var("SMG_BENCH_POLICY").unwrap_or_else(|_| "round_robin".to_owned());
    let gateway = model.gateway(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--disable-health-check",
        "--policy",
        &policy,
    ]);
    if cores >= 2 {
        pin(gateway.pid(), 1);
    }
    println!(
        "gateway pid {}, worker pid {}, --policy {policy}",
        gateway.pid(),
        worker.pid()
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client");
    let tools = Arc::new(chat_tools());
    let chosen: Vec<Scenario> = SCENARIOS
        .iter()
        .filter(|scenario| only.is_empty() || only.iter().any(|label| label == scenario.label))
        .copied()
        .collect();
    // Round after round of every chosen row: the machine's swings (other
    // tenants' load) then reach every row alike instead of one row's run.
    let mut pooled: Vec<Slice> = chosen.iter().map(|_| Slice::default()).collect();
    let mut per_round: Vec<Vec<f64>> = chosen.iter().map(|_| Vec::new()).collect();
    runtime.block_on(async {
        for _ in 0..rounds {
            for (index, scenario) in chosen.iter().enumerate() {
                let slice = throughput(&http, &gateway, &worker, *scenario, &tools, duration).await;
                per_round[index].push(slice.per_gateway_cpu_sec());
                pooled[index].pool(slice);
            }
        }
    });
    let mut rows: Vec<Row> = pooled
        .into_iter()
        .zip(&chosen)
        .map(|(slice, scenario)| slice.row(*scenario))
        .collect();
    let per_core = |label: &str| {
        rows.iter()
            .find(|row| row.scenario == label)
            .map(|row| row.requests_per_gateway_cpu_sec)
    };
    let baseline = SCENARIOS
        .iter()
        .find(|s| s.is_baseline())
        .and_then(|s| per_core(s.label));
    let mut ratios = Vec::new();
    for row in &rows {
        let same = SCENARIOS
            .iter()
            .find(|s| s.label == row.scenario)
            .and_then(|s| s.without_tools())
            .and_then(|s| per_core(s.label));
        let ratio = |base: Option<f64>| {
            base.map_or(f64::NAN, |base| row.requests_per_gateway_cpu_sec / base)
        };
        let thinking = SCENARIOS
            .iter()
            .find(|s| s.label == row.scenario)
            .and_then(|s| s.thinking_without_tools())
            .and_then(|s| per_core(s.label));
        ratios.push((ratio(baseline), ratio(same), ratio(thinking)));
    }
    for (row, (to_baseline, to_same, to_thinking)) in rows.iter_mut().zip(ratios) {
        row.ratio_to_baseline = to_baseline;
        row.ratio_to_same_without_tools = to_same;
        row.ratio_to_thinking_without_tools = to_thinking;
    }

    println!(
        "\n{:<24} {:>7} {:>6} {:>8} {:>5} {:>7} {:>6} {:>6} {:>12} {:>6} {:>6} {:>6} {:>5} {:>7} {:>7}",
        "scenario",
        "prompt",
        "output",
        "requests",
        "fails",
        "req/s",
        "gw cpu",
        "wk cpu",
        "req/gw-cpu-s",
        "vs (a)",
        "vs same",
        "vs think",
        "load",
        "p50 ms",
        "p99 ms"
    );
    for r in &rows {
        println!(
            "{:<24} {:>7} {:>6} {:>8} {:>5} {:>7.0} {:>6.2} {:>6.2} {:>12.0} {:>6.2} {:>6.2} {:>6.2} {:>5.1} {:>7.2} {:>7.2}",
            r.scenario,
            r.prompt_tokens,
            r.output_tokens,
            r.requests,
            r.failures,
            r.requests_per_sec,
            r.gateway_cpu_cores,
            r.worker_cpu_cores,
            r.requests_per_gateway_cpu_sec,
            r.ratio_to_baseline,
            r.ratio_to_same_without_tools,
            r.ratio_to_thinking_without_tools,
            r.load_average,
            r.p50_ms,
            r.p99_ms
        );
    }
    println!(
        "req/gw-cpu-s: requests per CPU-second of the gateway (the per-core figure); vs (a): \
         that over chat completions without tools, whole; vs same: over the same API and \
         shape without tools; vs think: whole chat with tools over whole chat without tools \
         whose answer thinks as the tool answer does (the tools alone). prompt/output: tokens of the checked answer (streams carry no \
         usage); gw/wk cpu: cores the gateway/worker used."
    );
    // Each round's ratio of a row with tools to its row without: the
    // spread the pooled figure above averages over.
    let mut round_ratios = serde_json::Map::new();
    for (index, scenario) in chosen.iter().enumerate() {
        let baselines = [
            ("vs same", scenario.without_tools()),
            ("vs think", scenario.thinking_without_tools()),
        ];
        for (kind, baseline) in baselines {
            let Some(without) = baseline
                .filter(|without| without.label != scenario.label)
                .and_then(|without| chosen.iter().position(|s| s.label == without.label))
            else {
                continue;
            };
            let mut ratios: Vec<f64> = per_round[index]
                .iter()
                .zip(&per_round[without])
                .map(|(with, without)| with / without)
                .collect();
            let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            round_ratios.insert(format!("{} {kind}", scenario.label), json!(ratios));
            ratios.sort_by(f64::total_cmp);
            println!(
                "{}: {kind} per round {} (median {:.2})",
                scenario.label,
                listed.join(" "),
                percentile(&ratios, 0.5)
            );
        }
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    if std::fs::create_dir_all(&out).is_ok() {
        let json = serde_json::to_string_pretty(&json!({
            "cores": cores, "seconds": secs, "rounds": rounds, "concurrency": CONCURRENCY,
            "policy": policy,
            "model": MODEL_ID, "rows": rows, "ratios_per_round": round_ratios}))
        .unwrap_or_default();
        let _ = std::fs::write(out.join("tool_calls.json"), json);
    }
}
