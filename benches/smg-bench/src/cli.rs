//! Command-line flags and the small value types they parse into.
//!
//! Flag names follow the tools people already use (`vllm bench serve`,
//! sglang `bench_serving`), so existing invocations mostly carry over. Every
//! value that can be wrong is parsed here into a typed value with a clear
//! message; [`crate::error::SetupError`] carries the stable code.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, ValueEnum};
use serde::Serialize;

/// `smg-bench`: drive an OpenAI-compatible endpoint with an open-loop
/// arrival process and report TTFT, ITL, TPOT, E2E, throughput and goodput.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "smg-bench", version, about, long_about = None, args_override_self = true)]
pub struct Args {
    /// Server root, `http://host:port` (paths are added per endpoint).
    #[arg(long, default_value = "http://127.0.0.1:30000")]
    pub base_url: String,

    /// Model name sent in each request; asked from `GET /v1/models` when unset.
    #[arg(long)]
    pub model: Option<String>,

    /// `chat` (/v1/chat/completions), `completions` (/v1/completions) or
    /// `generate` (SGLang /generate). The paths themselves are accepted too.
    #[arg(long, default_value = "chat")]
    pub endpoint: Endpoint,

    /// Ask for SSE streams (`data: ... data: [DONE]`); TTFT and ITL need it.
    #[arg(long)]
    pub stream: bool,

    /// Requests to send (sessions, with `--dataset multi-turn`). With
    /// `--duration`, the size of the prompt pool that is cycled.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,

    /// Run for this many seconds of arrivals instead of a fixed count.
    #[arg(long)]
    pub duration: Option<f64>,

    /// Mean arrivals per second (`inf`: send as fast as the concurrency cap allows).
    #[arg(long, default_value = "inf")]
    pub request_rate: Rate,

    /// Gamma shape of inter-arrival times: 1 is Poisson, < 1 burstier, > 1 smoother.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,

    /// At most this many requests in flight (one connection each).
    #[arg(long)]
    pub max_concurrency: Option<usize>,

    /// Prompt length in tokens: `N`, `uniform:MIN:MAX`, `normal:MEAN:STD` or `exp:MEAN`.
    #[arg(long, default_value = "1024")]
    pub input_len: LengthDist,

    /// Output length in tokens (`max_tokens`), same forms as `--input-len`.
    /// ShareGPT defaults to each conversation's own reply length.
    #[arg(long)]
    pub output_len: Option<LengthDist>,

    /// Send `ignore_eos: true` so every request generates its full output length.
    #[arg(long)]
    pub ignore_eos: bool,

    /// `random`, `sharegpt` (with `--dataset-path`), `shared-prefix` or `multi-turn`.
    #[arg(long, default_value = "random")]
    pub dataset: DatasetKind,

    /// A ShareGPT-format JSON file (`[{"conversations": [{"from", "value"}, ...]}]`).
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,

    /// `shared-prefix`: number of groups sharing one prefix.
    #[arg(long, default_value_t = 8)]
    pub prefix_groups: usize,

    /// `shared-prefix`: prefix length in tokens (the suffix follows `--input-len`).
    #[arg(long, default_value_t = 512)]
    pub prefix_len: usize,

    /// `multi-turn`: turns per session; each turn resends the history.
    #[arg(long, default_value_t = 3)]
    pub turns: usize,

    /// Images per request (chat and generate only).
    #[arg(long, default_value_t = 0)]
    pub image_count: usize,

    /// `360p`, `720p`, `1080p`, `4k` or `WxH`.
    #[arg(long, default_value = "720p")]
    pub image_resolution: Resolution,

    /// Encoding of the generated images.
    #[arg(long, value_enum, default_value_t = ImageFormat::Jpeg)]
    pub image_format: ImageFormat,

    /// `unique`: every image differs (no cache hits); `repeated`: all requests
    /// send the same images.
    #[arg(long, value_enum, default_value_t = ImageContent::Unique)]
    pub image_content: ImageContent,

    /// `data-url` inlines the bytes as base64; `file-url` writes the images to
    /// `--image-dir` and sends `file://` URLs (the server must allow that directory).
    #[arg(long, value_enum, default_value_t = ImageTransport::DataUrl)]
    pub image_transport: ImageTransport,

    /// Where `file-url` images are written (default: a fresh temporary
    /// directory, removed at exit).
    #[arg(long)]
    pub image_dir: Option<PathBuf>,

    /// Requests sent before measuring (not counted; they also open connections).
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,

    /// Seed for prompts, images and arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Service-level objectives for goodput, e.g. `ttft:500,tpot:50,e2e:10000` (ms).
    #[arg(long)]
    pub slo: Option<Slo>,

    /// Write the summary (and the full configuration) as JSON.
    #[arg(long)]
    pub output_json: Option<PathBuf>,

    /// Write one JSON line per request: timestamps, token counts, ITLs, error.
    #[arg(long)]
    pub output_jsonl: Option<PathBuf>,

    /// Write a self-contained HTML report (latency CDFs, time series).
    #[arg(long)]
    pub output_html: Option<PathBuf>,

    /// Run one point per value: `request-rate=1,2,4,inf` or `max-concurrency=1,8,64`.
    #[arg(long)]
    pub sweep: Option<Sweep>,

    /// Before anything else, ask `GET /readiness` of the base URL until it
    /// answers 200, for up to this many seconds (then fail with
    /// `server_not_ready`): for a run started right after the gateway.
    #[arg(long, value_name = "SECS")]
    pub wait_ready: Option<f64>,

    /// Prometheus endpoint scraped before and after each run; deltas are printed.
    #[arg(long)]
    pub metrics_url: Option<String>,

    /// A Hugging Face `tokenizer.json` (or a directory holding one) to count
    /// tokens when the server reports no usage, and to size random prompts.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,

    /// Runtime worker threads; 1 runs everything on one current-thread runtime.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,

    /// Per-request timeout in seconds (counted as `timeout`).
    #[arg(long, default_value_t = 600.0)]
    pub timeout_secs: f64,

    /// For `https` base URLs: a PEM file of CA certificates to trust besides
    /// the public web PKI roots (a private fleet's CA).
    #[arg(long)]
    pub ca_cert: Option<std::path::PathBuf>,

    /// Sent as `Authorization: Bearer ...`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    #[serde(skip)]
    pub api_key: Option<String>,

    /// A JSON object merged into every request body (e.g. `{"temperature": 0}`).
    #[arg(long)]
    pub extra_body: Option<String>,

    /// Never draw the progress bar (it is only drawn on a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
}

/// Which API a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Chat,
    Completions,
    Generate,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => "/generate",
        }
    }
}

impl FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chat" | "/v1/chat/completions" | "openai-chat" => Ok(Endpoint::Chat),
            "completions" | "/v1/completions" | "openai" => Ok(Endpoint::Completions),
            "generate" | "/generate" | "sglang" => Ok(Endpoint::Generate),
            _ => Err(format!(
                "unknown endpoint `{s}` (chat, completions, generate or their paths)"
            )),
        }
    }
}

/// Arrivals per second, or as fast as allowed. Serialized as a number or `"inf"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    Finite(f64),
    Infinite,
}

impl Rate {
    pub fn is_infinite(self) -> bool {
        matches!(self, Rate::Infinite)
    }
}

impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Rate::Finite(r) => serializer.serialize_f64(*r),
            Rate::Infinite => serializer.serialize_str("inf"),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rate::Finite(r) => write!(f, "{r}"),
            Rate::Infinite => f.write_str("inf"),
        }
    }
}

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("inf") {
            return Ok(Rate::Infinite);
        }
        match s.parse::<f64>() {
            Ok(r) if r.is_infinite() && r > 0.0 => Ok(Rate::Infinite),
            Ok(r) if r > 0.0 && r.is_finite() => Ok(Rate::Finite(r)),
            _ => Err(format!(
                "request rate must be a positive number or `inf`, got `{s}`"
            )),
        }
    }
}

/// A distribution of token counts; samples are rounded and at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LengthDist {
    Fixed { tokens: usize },
    Uniform { min: usize, max: usize },
    Normal { mean: f64, std: f64 },
    Exp { mean: f64 },
}

impl LengthDist {
    /// The mean, for sizing and documentation.
    pub fn mean(&self) -> f64 {
        match *self {
            LengthDist::Fixed { tokens } => tokens as f64,
            LengthDist::Uniform { min, max } => (min + max) as f64 / 2.0,
            LengthDist::Normal { mean, .. } | LengthDist::Exp { mean } => mean,
        }
    }
}

impl FromStr for LengthDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("length `{s}`: expected N, uniform:MIN:MAX, normal:MEAN:STD or exp:MEAN");
        let parts: Vec<&str> = s.split(':').collect();
        let count = |p: &str| p.trim().parse::<usize>().map_err(|_| bad());
        let real = |p: &str| match p.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err(bad()),
        };
        let dist = match parts.as_slice() {
            [n] => LengthDist::Fixed { tokens: count(n)? },
            ["uniform", a, b] => {
                let (min, max) = (count(a)?, count(b)?);
                if min > max {
                    return Err(format!("length `{s}`: MIN is above MAX"));
                }
                LengthDist::Uniform { min, max }
            }
            ["normal", m, d] => LengthDist::Normal {
                mean: real(m)?,
                std: real(d)?,
            },
            ["exp", m] => LengthDist::Exp { mean: real(m)? },
            _ => return Err(bad()),
        };
        if dist.mean() < 1.0 {
            return Err(format!("length `{s}`: the mean must be at least 1 token"));
        }
        Ok(dist)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    Random,
    Sharegpt,
    SharedPrefix,
    MultiTurn,
}

impl FromStr for DatasetKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(DatasetKind::Random),
            "sharegpt" => Ok(DatasetKind::Sharegpt),
            "shared-prefix" | "prefix" => Ok(DatasetKind::SharedPrefix),
            "multi-turn" | "multiturn" => Ok(DatasetKind::MultiTurn),
            _ => Err(format!(
                "unknown dataset `{s}` (random, sharegpt, shared-prefix, multi-turn)"
            )),
        }
    }
}

/// Image width and height in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Resolution {
    pub width: u32,
    pub height: u32,
}

impl FromStr for Resolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let preset = |width, height| Ok(Resolution { width, height });
        match s.to_ascii_lowercase().as_str() {
            "360p" => preset(640, 360),
            "720p" => preset(1280, 720),
            "1080p" => preset(1920, 1080),
            "4k" | "2160p" => preset(3840, 2160),
            other => {
                let bad =
                    || format!("image resolution `{s}`: expected 360p, 720p, 1080p, 4k or WxH");
                let (w, h) = other.split_once('x').ok_or_else(bad)?;
                let width: u32 = w.parse().map_err(|_| bad())?;
                let height: u32 = h.parse().map_err(|_| bad())?;
                if width == 0 || height == 0 || width > 16384 || height > 16384 {
                    return Err(format!(
                        "image resolution `{s}`: each side must be 1..=16384"
                    ));
                }
                preset(width, height)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageFormat {
    Jpeg,
    Png,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageContent {
    Unique,
    Repeated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageTransport {
    DataUrl,
    FileUrl,
}

/// Latency objectives in milliseconds; a request meets the SLO when it
/// meets every objective given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl FromStr for Slo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut slo = Slo::default();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = part
                .split_once(':')
                .ok_or_else(|| format!("slo `{part}`: expected NAME:MS"))?;
            let ms = match value.trim().parse::<f64>() {
                Ok(v) if v > 0.0 && v.is_finite() => v,
                _ => return Err(format!("slo `{part}`: MS must be a positive number")),
            };
            match key.trim() {
                "ttft" => slo.ttft_ms = Some(ms),
                "tpot" => slo.tpot_ms = Some(ms),
                "e2e" | "e2el" => slo.e2e_ms = Some(ms),
                other => {
                    return Err(format!("slo: unknown metric `{other}` (ttft, tpot, e2e)"));
                }
            }
        }
        if slo == Slo::default() {
            return Err("slo: give at least one of ttft:MS, tpot:MS, e2e:MS".into());
        }
        Ok(slo)
    }
}

/// One value swept across runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "over", content = "values", rename_all = "kebab-case")]
pub enum Sweep {
    RequestRate(Vec<Rate>),
    MaxConcurrency(Vec<usize>),
}

impl Sweep {
    pub fn len(&self) -> usize {
        match self {
            Sweep::RequestRate(v) => v.len(),
            Sweep::MaxConcurrency(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FromStr for Sweep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (key, values) = s.split_once('=').ok_or_else(|| {
            format!("sweep `{s}`: expected request-rate=A,B,... or max-concurrency=A,B,...")
        })?;
        let values: Vec<&str> = values
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(format!("sweep `{s}`: no values"));
        }
        match key.trim() {
            "request-rate" | "rate" => Ok(Sweep::RequestRate(
                values.iter().map(|v| v.parse()).collect::<Result<_, _>>()?,
            )),
            "max-concurrency" | "concurrency" => Ok(Sweep::MaxConcurrency(
                values
                    .iter()
                    .map(|v| match v.parse::<usize>() {
                        Ok(n) if n > 0 => Ok(n),
                        _ => Err(format!(
                            "sweep: concurrency `{v}` must be a positive integer"
                        )),
                    })
                    .collect::<Result<_, _>>()?,
            )),
            other => Err(format!(
                "sweep: unknown parameter `{other}` (request-rate, max-concurrency)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lengths_parse_in_every_form() {
        assert_eq!(
            "128".parse::<LengthDist>().unwrap(),
            LengthDist::Fixed { tokens: 128 }
        );
        assert_eq!(
            "uniform:10:20".parse::<LengthDist>().unwrap(),
            LengthDist::Uniform { min: 10, max: 20 }
        );
        assert_eq!(
            "normal:100:10".parse::<LengthDist>().unwrap(),
            LengthDist::Normal {
                mean: 100.0,
                std: 10.0
            }
        );
        assert_eq!(
            "exp:50".parse::<LengthDist>().unwrap(),
            LengthDist::Exp { mean: 50.0 }
        );
        assert!("uniform:20:10".parse::<LengthDist>().is_err());
        assert!("0".parse::<LengthDist>().is_err());
        assert!("gauss:1".parse::<LengthDist>().is_err());
    }

    #[test]
    fn rates_resolutions_slos_and_sweeps_parse() {
        assert_eq!("inf".parse::<Rate>().unwrap(), Rate::Infinite);
        assert_eq!("2.5".parse::<Rate>().unwrap(), Rate::Finite(2.5));
        assert!("0".parse::<Rate>().is_err());
        assert!("-1".parse::<Rate>().is_err());
        assert_eq!(
            "4K".parse::<Resolution>().unwrap(),
            Resolution {
                width: 3840,
                height: 2160
            }
        );
        assert_eq!(
            "100x50".parse::<Resolution>().unwrap(),
            Resolution {
                width: 100,
                height: 50
            }
        );
        assert!("0x50".parse::<Resolution>().is_err());
        let slo: Slo = "ttft:500,e2e:2000".parse().unwrap();
        assert_eq!(
            (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms),
            (Some(500.0), None, Some(2000.0))
        );
        assert!("ttft:abc".parse::<Slo>().is_err());
        assert!("itl:5".parse::<Slo>().is_err());
        assert_eq!(
            "request-rate=1,inf".parse::<Sweep>().unwrap(),
            Sweep::RequestRate(vec![Rate::Finite(1.0), Rate::Infinite])
        );
        assert_eq!(
            "max-concurrency=1,8".parse::<Sweep>().unwrap(),
            Sweep::MaxConcurrency(vec![1, 8])
        );
        assert!("max-concurrency=0".parse::<Sweep>().is_err());
        assert!("temperature=1".parse::<Sweep>().is_err());
    }
}
