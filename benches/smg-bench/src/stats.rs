//! Percentiles and the run summary.
//!
//! Percentiles use linear interpolation between closest ranks (NumPy's
//! default): p of n sorted values is at rank `p/100 * (n-1)`. Latency
//! statistics are over successful requests only; TTFT and ITL exist only for
//! streams. Throughput divides by the run's span: from the first scheduled
//! send to the last completion.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cli::{Rate, Slo};
use crate::record::RequestRecord;

/// Linear-interpolated percentile of sorted values (`p` in 0..=100).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let low = rank.floor() as usize;
            let high = rank.ceil() as usize;
            let frac = rank - low as f64;
            sorted[low] + (sorted[high] - sorted[low]) * frac
        }
    }
}

/// Mean, spread and tail of one latency metric, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    pub count: usize,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Distribution {
    /// `None` for no values.
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        Some(Distribution {
            count: values.len(),
            mean,
            std: var.sqrt(),
            min: values[0],
            p50: percentile(&values, 50.0),
            p90: percentile(&values, 90.0),
            p95: percentile(&values, 95.0),
            p99: percentile(&values, 99.0),
            max: values[values.len() - 1],
        })
    }
}

/// Requests meeting every objective of the SLO.
#[derive(Debug, Clone, Serialize)]
pub struct Goodput {
    pub slo: Slo,
    pub good_requests: usize,
    pub requests_per_s: f64,
    /// Good requests over all measured requests (failures count as not good).
    pub fraction: f64,
}

/// The numbers of one run (one sweep point).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub request_rate: Rate,
    pub max_concurrency: Option<usize>,
    pub requests: usize,
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    /// Mean arrivals per second asked for (`inf` for as fast as allowed).
    pub offered_rate: Rate,
    /// Requests sent per second over the sending window.
    pub dispatch_rate: f64,
    /// Completed requests per second over the run's span.
    pub achieved_rate: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub input_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
    pub total_tokens_per_s: f64,
    pub images: u64,
    pub images_per_s: f64,
    /// Mean requests in flight (sum of E2E over the span).
    pub mean_concurrency: f64,
    pub ttft_ms: Option<Distribution>,
    pub tpot_ms: Option<Distribution>,
    /// Every gap between token events, across all requests.
    pub itl_ms: Option<Distribution>,
    pub e2e_ms: Option<Distribution>,
    /// Sent time minus scheduled time (timer lateness and waiting for a slot).
    pub schedule_lag_ms: Option<Distribution>,
    pub goodput: Option<Goodput>,
    /// Failed requests by class (`http_503:overloaded`, `timeout`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Where output token counts came from (server / tokenizer / approximate).
    pub output_token_sources: BTreeMap<String, u64>,
    /// CPU seconds this process used during the run (all threads).
    pub client_cpu_s: f64,
    /// `client_cpu_s` per wall second: near `--threads`, the client is the limit.
    pub client_cpu_utilization: f64,
}

/// Whether a successful record meets every objective of `slo`.
pub fn meets(record: &RequestRecord, slo: &Slo) -> bool {
    let within = |limit: Option<f64>, value: Option<f64>| match (limit, value) {
        (None, _) => true,
        (Some(limit), Some(value)) => value <= limit,
        // A stream-only metric without a stream: not judged.
        (Some(_), None) => true,
    };
    record.ok
        && within(slo.ttft_ms, record.ttft_ms)
        && within(slo.tpot_ms, record.tpot_ms)
        && within(slo.e2e_ms, Some(record.e2e_ms))
}

pub fn summarize(
    records: &[RequestRecord],
    request_rate: Rate,
    max_concurrency: Option<usize>,
    slo: Option<&Slo>,
) -> Summary {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    let start = records
        .iter()
        .map(|r| r.scheduled_s)
        .fold(f64::INFINITY, f64::min);
    let end = records.iter().map(|r| r.end_s).fold(0.0, f64::max);
    let duration_s = if records.is_empty() {
        0.0
    } else {
        (end - start).max(1e-9)
    };
    let last_sent = records.iter().map(|r| r.sent_s).fold(0.0, f64::max);
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    let input_tokens: u64 = ok.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let output_tokens: u64 = ok.iter().map(|r| u64::from(r.output_tokens)).sum();
    let images: u64 = ok.iter().map(|r| u64::from(r.images)).sum();
    let mut errors = BTreeMap::new();
    for r in records.iter().filter(|r| !r.ok) {
        let key = r.error.clone().unwrap_or_else(|| "unknown".into());
        *errors.entry(key).or_insert(0) += 1;
    }
    let mut output_token_sources = BTreeMap::new();
    for r in &ok {
        let key = serde_json::to_value(r.output_token_source)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        *output_token_sources.entry(key).or_insert(0) += 1;
    }
    let goodput = slo.map(|slo| {
        let good = ok.iter().filter(|r| meets(r, slo)).count();
        Goodput {
            slo: *slo,
            good_requests: good,
            requests_per_s: per_s(good as f64),
            fraction: if records.is_empty() {
                0.0
            } else {
                good as f64 / records.len() as f64
            },
        }
    });
    Summary {
        request_rate,
        max_concurrency,
        requests: records.len(),
        completed: ok.len(),
        failed: records.len() - ok.len(),
        duration_s,
        offered_rate: request_rate,
        dispatch_rate: if last_sent > start {
            records.len().saturating_sub(1) as f64 / (last_sent - start)
        } else {
            f64::INFINITY
        },
        achieved_rate: per_s(ok.len() as f64),
        input_tokens,
        output_tokens,
        input_tokens_per_s: per_s(input_tokens as f64),
        output_tokens_per_s: per_s(output_tokens as f64),
        total_tokens_per_s: per_s((input_tokens + output_tokens) as f64),
        images,
        images_per_s: per_s(images as f64),
        mean_concurrency: per_s(records.iter().map(|r| r.e2e_ms / 1e3).sum()),
        ttft_ms: Distribution::of(ok.iter().filter_map(|r| r.ttft_ms).collect()),
        tpot_ms: Distribution::of(ok.iter().filter_map(|r| r.tpot_ms).collect()),
        itl_ms: Distribution::of(ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect()),
        e2e_ms: Distribution::of(ok.iter().map(|r| r.e2e_ms).collect()),
        schedule_lag_ms: Distribution::of(records.iter().map(|r| r.schedule_lag_ms).collect()),
        goodput,
        errors,
        output_token_sources,
        client_cpu_s: 0.0,
        client_cpu_utilization: 0.0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert!((percentile(&v, 50.0) - 50.5).abs() < 1e-9);
        assert!((percentile(&v, 99.0) - 99.01).abs() < 1e-9);
        assert!((percentile(&v, 90.0) - 90.1).abs() < 1e-9);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert!((percentile(&[1.0, 2.0, 3.0, 4.0], 25.0) - 1.75).abs() < 1e-9);
    }

    #[test]
    fn distribution_sorts_and_summarizes() {
        let d = Distribution::of(vec![4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((d.count, d.min, d.max), (4, 1.0, 4.0));
        assert!((d.mean - 2.5).abs() < 1e-12);
        assert!((d.p50 - 2.5).abs() < 1e-12);
        assert!((d.std - 1.25f64.sqrt()).abs() < 1e-12);
        assert!(Distribution::of(vec![]).is_none());
    }

    fn record(ok: bool, ttft: f64, e2e: f64, tpot: f64) -> RequestRecord {
        RequestRecord {
            request: 0,
            unit: 0,
            turn: 0,
            scheduled_s: 0.0,
            sent_s: 0.0,
            end_s: e2e / 1e3,
            schedule_lag_ms: 0.0,
            ttft_ms: Some(ttft),
            e2e_ms: e2e,
            tpot_ms: Some(tpot),
            itl_ms: vec![tpot],
            prompt_tokens: 10,
            output_tokens: 2,
            prompt_token_source: crate::record::TokenSource::Server,
            output_token_source: crate::record::TokenSource::Server,
            images: 1,
            status: if ok { 200 } else { 503 },
            ok,
            error: (!ok).then(|| "http_503".to_string()),
            error_detail: None,
        }
    }

    #[test]
    fn goodput_counts_requests_meeting_every_objective() {
        let records = vec![
            record(true, 10.0, 100.0, 5.0),
            record(true, 60.0, 100.0, 5.0),
            record(true, 10.0, 100.0, 50.0),
            record(false, 1.0, 1000.0, 1.0),
        ];
        let slo: Slo = "ttft:50,tpot:20".parse().unwrap();
        let s = summarize(&records, Rate::Infinite, Some(4), Some(&slo));
        let g = s.goodput.unwrap();
        assert_eq!(g.good_requests, 1);
        assert!((g.fraction - 0.25).abs() < 1e-12);
        assert_eq!((s.completed, s.failed), (3, 1));
        assert_eq!(s.errors.get("http_503"), Some(&1));
        assert_eq!(s.input_tokens, 30);
        assert_eq!(s.images, 3);
        assert!(
            (s.duration_s - 1.0).abs() < 1e-9,
            "span to the failed one's end"
        );
        assert!((s.achieved_rate - 3.0).abs() < 1e-9);
    }
}
