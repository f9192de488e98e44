//! Server-side correlation: scrape a Prometheus text endpoint before and
//! after a run and report how each series moved (counters grow, histograms'
//! `_sum`/`_count`/`_bucket` series too, gauges may go either way).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::client::{BaseUrl, get};
use crate::error::{SetupError, SetupResult};

/// Series name with labels (`name{a="b"}`) to value.
pub type Samples = BTreeMap<String, f64>;

/// Parses the Prometheus text format (comments and blank lines skipped,
/// an optional timestamp after the value ignored).
pub fn parse(text: &str) -> Samples {
    let mut samples = Samples::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // The value follows the series; labels may contain spaces in quotes.
        let series_end = match line.find('}') {
            Some(close) => close + 1,
            None => line.find(char::is_whitespace).unwrap_or(line.len()),
        };
        let (series, rest) = line.split_at(series_end);
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        samples.insert(series.to_string(), value);
    }
    samples
}

/// One series that changed during the run.
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    pub series: String,
    pub before: f64,
    pub after: f64,
    pub delta: f64,
}

/// Series whose value changed (a series new after the run counts from 0).
pub fn deltas(before: &Samples, after: &Samples) -> Vec<Delta> {
    after
        .iter()
        .filter_map(|(series, &after)| {
            let before = before.get(series).copied().unwrap_or(0.0);
            let delta = after - before;
            (delta != 0.0 && delta.is_finite()).then(|| Delta {
                series: series.clone(),
                before,
                after,
                delta,
            })
        })
        .collect()
}

/// A metrics endpoint to scrape.
#[derive(Debug, Clone)]
pub struct Scraper {
    base: BaseUrl,
    path: String,
}

impl Scraper {
    pub async fn new(url: &str) -> SetupResult<Self> {
        let base = BaseUrl::resolve(url).await?;
        let path = if base.prefix.is_empty() {
            "/metrics".to_string()
        } else {
            base.prefix.clone()
        };
        Ok(Scraper { base, path })
    }

    pub async fn scrape(&self) -> SetupResult<Samples> {
        let (status, body) = get(&self.base, &self.path, Duration::from_secs(10))
            .await
            .map_err(|e| SetupError::InvalidUrl(format!("scraping {}: {e}", self.path)))?;
        if status != 200 {
            return Err(SetupError::InvalidUrl(format!(
                "scraping {}: status {status}",
                self.path
            )));
        }
        Ok(parse(&String::from_utf8_lossy(&body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_text_format_and_computes_deltas() {
        let before = parse(
            "# HELP x y\n# TYPE smg_requests_total counter\nsmg_requests_total{route=\"/a b\"} 5\nup 1\nh_bucket{le=\"+Inf\"} 3 1700000000\n",
        );
        assert_eq!(before.get("smg_requests_total{route=\"/a b\"}"), Some(&5.0));
        assert_eq!(before.get("h_bucket{le=\"+Inf\"}"), Some(&3.0));
        let after = parse(
            "smg_requests_total{route=\"/a b\"} 12\nup 1\nh_bucket{le=\"+Inf\"} 3\nnew_total 2\nbad x\n",
        );
        let d = deltas(&before, &after);
        let names: Vec<(&str, f64)> = d.iter().map(|d| (d.series.as_str(), d.delta)).collect();
        assert_eq!(
            names,
            vec![
                ("new_total", 2.0),
                ("smg_requests_total{route=\"/a b\"}", 7.0)
            ]
        );
    }
}
