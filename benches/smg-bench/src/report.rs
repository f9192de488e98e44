//! Presenting results: the summary table on stdout, the sweep table,
//! `--output-json`, `--output-jsonl` and a self-contained HTML report
//! (inline SVG latency CDFs and time series; no scripts, no external files).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::error::{SetupError, SetupResult};
use crate::record::RequestRecord;
use crate::run::{PointResult, Report};
use crate::stats::{Distribution, Summary};

fn fmt_rate(r: &crate::cli::Rate) -> String {
    match r {
        crate::cli::Rate::Infinite => "inf".into(),
        crate::cli::Rate::Finite(r) => format!("{r}"),
    }
}

fn dist_row(out: &mut String, name: &str, d: &Option<Distribution>) {
    match d {
        Some(d) => {
            let _ = writeln!(
                out,
                "{name:<12}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}",
                d.mean, d.p50, d.p90, d.p95, d.p99, d.max
            );
        }
        None => {
            let _ = writeln!(out, "{name:<12}{:>10}", "-");
        }
    }
}

/// The readable summary of one point.
pub fn summary_text(report: &Report, point: &PointResult) -> String {
    let s: &Summary = &point.summary;
    let cfg = &report.config;
    let mut out = String::new();
    let rule = "=".repeat(72);
    let _ = writeln!(out, "{rule}");
    let _ = writeln!(
        out,
        "{:<28}{} {}{}",
        "Endpoint:",
        cfg.base_url,
        cfg.endpoint.path(),
        if cfg.stream { " (stream)" } else { "" }
    );
    if !report.model.is_empty() {
        let _ = writeln!(out, "{:<28}{}", "Model:", report.model);
    }
    let _ = writeln!(
        out,
        "{:<28}{} req/s (burstiness {})",
        "Offered rate:",
        fmt_rate(&s.offered_rate),
        cfg.burstiness
    );
    let _ = writeln!(
        out,
        "{:<28}{}",
        "Max concurrency:",
        s.max_concurrency
            .map_or_else(|| "unlimited".to_string(), |c| c.to_string())
    );
    let _ = writeln!(
        out,
        "{:<28}{} ({} ok, {} failed)",
        "Requests:", s.requests, s.completed, s.failed
    );
    let _ = writeln!(out, "{:<28}{:.3} s", "Duration:", s.duration_s);
    let _ = writeln!(out, "{:<28}{:.2} req/s", "Achieved rate:", s.achieved_rate);
    if s.dispatch_rate.is_finite() {
        let _ = writeln!(out, "{:<28}{:.2} req/s", "Dispatch rate:", s.dispatch_rate);
    }
    let _ = writeln!(
        out,
        "{:<28}{} ({:.1} tok/s)",
        "Input tokens:", s.input_tokens, s.input_tokens_per_s
    );
    let _ = writeln!(
        out,
        "{:<28}{} ({:.1} tok/s)",
        "Output tokens:", s.output_tokens, s.output_tokens_per_s
    );
    let _ = writeln!(
        out,
        "{:<28}{:.1} tok/s",
        "Total tokens:", s.total_tokens_per_s
    );
    if s.images > 0 {
        let _ = writeln!(
            out,
            "{:<28}{} ({:.2} /s)",
            "Images:", s.images, s.images_per_s
        );
    }
    let _ = writeln!(out, "{:<28}{:.2}", "Mean in flight:", s.mean_concurrency);
    let threads = cfg.threads.max(1) as f64;
    let _ = writeln!(
        out,
        "{:<28}{:.2} of {threads} core(s){}",
        "Client CPU:",
        s.client_cpu_utilization,
        if s.client_cpu_utilization > 0.9 * threads {
            "  (saturated: the client may be the limit; add --threads)"
        } else {
            ""
        }
    );
    if let Some(g) = &s.goodput {
        let mut slo = Vec::new();
        if let Some(v) = g.slo.ttft_ms {
            slo.push(format!("ttft<={v}ms"));
        }
        if let Some(v) = g.slo.tpot_ms {
            slo.push(format!("tpot<={v}ms"));
        }
        if let Some(v) = g.slo.e2e_ms {
            slo.push(format!("e2e<={v}ms"));
        }
        let _ = writeln!(
            out,
            "{:<28}{:.2} req/s ({} good, {:.1}%) [{}]",
            "Goodput:",
            g.requests_per_s,
            g.good_requests,
            g.fraction * 100.0,
            slo.join(",")
        );
    }
    let sources: Vec<String> = s
        .output_token_sources
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(out, "{:<28}{}", "Output counts from:", sources.join(", "));
    if !s.errors.is_empty() {
        let _ = writeln!(out, "Errors:");
        for (class, count) in &s.errors {
            let _ = writeln!(out, "  {class:<26}{count}");
        }
    }
    let _ = writeln!(out, "{}", "-".repeat(72));
    let _ = writeln!(
        out,
        "{:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "(ms)", "mean", "p50", "p90", "p95", "p99", "max"
    );
    dist_row(&mut out, "TTFT", &s.ttft_ms);
    dist_row(&mut out, "TPOT", &s.tpot_ms);
    dist_row(&mut out, "ITL", &s.itl_ms);
    dist_row(&mut out, "E2E", &s.e2e_ms);
    dist_row(&mut out, "Sched lag", &s.schedule_lag_ms);
    if let Some(deltas) = &point.metrics_deltas {
        let _ = writeln!(out, "{}", "-".repeat(72));
        // Histogram buckets drown the rest; their _count and _sum stay.
        let (buckets, shown): (Vec<_>, Vec<_>) =
            deltas.iter().partition(|d| d.series.contains("_bucket{"));
        let _ = writeln!(out, "Server metrics that changed ({}):", deltas.len());
        for d in shown.iter().take(40) {
            let _ = writeln!(out, "  {:<60} {:+}", d.series, d.delta);
        }
        let hidden = shown.len().saturating_sub(40) + buckets.len();
        if hidden > 0 {
            let _ = writeln!(
                out,
                "  ... {hidden} more (histogram buckets included) in --output-json"
            );
        }
    }
    let _ = writeln!(out, "{rule}");
    out
}

/// One row per sweep point.
pub fn sweep_text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>8} {:>6} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "rate",
        "conc",
        "req/s",
        "in/s",
        "out tok/s",
        "ttft p50",
        "ttft p99",
        "tpot p50",
        "e2e p50",
        "e2e p99",
        "lag p99",
        "goodput",
        "errors"
    );
    let p = |d: &Option<Distribution>, f: fn(&Distribution) -> f64| {
        d.as_ref()
            .map_or_else(|| "-".to_string(), |d| format!("{:.2}", f(d)))
    };
    for point in &report.points {
        let s = &point.summary;
        let _ = writeln!(
            out,
            "{:>8} {:>6} {:>9.2} {:>9.1} {:>10.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
            fmt_rate(&s.offered_rate),
            s.max_concurrency
                .map_or_else(|| "-".to_string(), |c| c.to_string()),
            s.achieved_rate,
            s.input_tokens_per_s,
            s.output_tokens_per_s,
            p(&s.ttft_ms, |d| d.p50),
            p(&s.ttft_ms, |d| d.p99),
            p(&s.tpot_ms, |d| d.p50),
            p(&s.e2e_ms, |d| d.p50),
            p(&s.e2e_ms, |d| d.p99),
            p(&s.schedule_lag_ms, |d| d.p99),
            s.goodput
                .as_ref()
                .map_or_else(|| "-".to_string(), |g| format!("{:.2}", g.requests_per_s)),
            s.failed
        );
    }
    out
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> SetupError {
    SetupError::Io(format!("writing {}: {e}", path.display()))
}

pub fn write_json(report: &Report, path: &Path) -> SetupResult<()> {
    let text = serde_json::to_vec_pretty(report).map_err(|e| io_err(path, e))?;
    std::fs::write(path, text).map_err(|e| io_err(path, e))
}

#[derive(Serialize)]
struct JsonlLine<'a> {
    point: usize,
    #[serde(flatten)]
    record: &'a RequestRecord,
}

pub fn write_jsonl(report: &Report, path: &Path) -> SetupResult<()> {
    let file = std::fs::File::create(path).map_err(|e| io_err(path, e))?;
    let mut out = std::io::BufWriter::new(file);
    for (point, result) in report.points.iter().enumerate() {
        for record in &result.records {
            serde_json::to_writer(&mut out, &JsonlLine { point, record })
                .map_err(|e| io_err(path, e))?;
            out.write_all(b"\n").map_err(|e| io_err(path, e))?;
        }
    }
    out.flush().map_err(|e| io_err(path, e))
}

/// One line of a chart: name, colour, points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A line chart as inline SVG.
fn svg_chart(title: &str, x_label: &str, y_label: &str, series: &[Series<'_>]) -> String {
    const W: f64 = 560.0;
    const H: f64 = 300.0;
    const L: f64 = 60.0;
    const R: f64 = 130.0;
    const T: f64 = 30.0;
    const B: f64 = 45.0;
    let all = series.iter().flat_map(|(_, _, pts)| pts.iter());
    let (mut x_max, mut y_max) = (0.0f64, 0.0f64);
    for &(x, y) in all {
        if x.is_finite() {
            x_max = x_max.max(x);
        }
        if y.is_finite() {
            y_max = y_max.max(y);
        }
    }
    let x_max = if x_max > 0.0 { x_max * 1.02 } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max * 1.05 } else { 1.0 };
    let px = |x: f64| L + (x / x_max) * (W - L - R);
    let py = |y: f64| H - B - (y / y_max) * (H - T - B);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        svg,
        r#"<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>"#,
        L,
        html_escape(title)
    );
    let _ = write!(
        svg,
        r##"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
        W - L - R,
        H - T - B
    );
    for i in 0..=4 {
        let fx = x_max * f64::from(i) / 4.0;
        let fy = y_max * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
            px(fx),
            H - B + 14.0,
            short(fx)
        );
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text><line x1="{L}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
            L - 4.0,
            py(fy) + 4.0,
            short(fy),
            W - R,
            py(fy),
            py(fy)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        L + (W - L - R) / 2.0,
        H - 8.0,
        html_escape(x_label)
    );
    let _ = write!(
        svg,
        r#"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
        T + (H - T - B) / 2.0,
        T + (H - T - B) / 2.0,
        html_escape(y_label)
    );
    for (i, (name, colour, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        if !path.is_empty() {
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{}"/>"#,
                path.join(" ")
            );
        }
        let ly = T + 12.0 + 16.0 * i as f64;
        let _ = write!(
            svg,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{ly:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            W - R + 8.0,
            W - R + 24.0,
            W - R + 28.0,
            ly + 4.0,
            html_escape(name)
        );
    }
    svg.push_str("</svg>");
    svg
}

fn short(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Empirical CDF points (value, fraction), at most ~400 of them.
fn cdf(mut values: Vec<f64>) -> Vec<(f64, f64)> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(400).max(1);
    let mut pts: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (values[i], (i + 1) as f64 / n as f64))
        .collect();
    pts.push((values[n - 1], 1.0));
    pts
}

const COLOURS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"];

fn point_html(report: &Report, index: usize, point: &PointResult) -> String {
    let records = &point.records;
    let ok = || records.iter().filter(|r| r.ok);
    let mut html = String::new();
    let _ = write!(
        html,
        "<h2>Point {}: rate {} req/s, concurrency {}</h2><pre>{}</pre>",
        index + 1,
        fmt_rate(&point.point.request_rate),
        point
            .point
            .max_concurrency
            .map_or_else(|| "unlimited".to_string(), |c| c.to_string()),
        html_escape(&summary_text(report, point))
    );
    let mut latency = vec![("E2E", COLOURS[0], cdf(ok().map(|r| r.e2e_ms).collect()))];
    if report.config.stream {
        latency.push((
            "TTFT",
            COLOURS[1],
            cdf(ok().filter_map(|r| r.ttft_ms).collect()),
        ));
    }
    latency.push((
        "sched lag",
        COLOURS[4],
        cdf(records.iter().map(|r| r.schedule_lag_ms).collect()),
    ));
    html.push_str(&svg_chart(
        "Latency CDF",
        "ms",
        "fraction of requests",
        &latency,
    ));
    if report.config.stream {
        let tokens = vec![
            (
                "ITL",
                COLOURS[2],
                cdf(ok().flat_map(|r| r.itl_ms.iter().copied()).collect()),
            ),
            (
                "TPOT",
                COLOURS[3],
                cdf(ok().filter_map(|r| r.tpot_ms).collect()),
            ),
        ];
        html.push_str(&svg_chart(
            "Per-token latency CDF",
            "ms",
            "fraction",
            &tokens,
        ));
    }
    // Time series in one-second buckets by completion time.
    let end = records.iter().map(|r| r.end_s).fold(0.0, f64::max);
    let buckets = (end.ceil() as usize).clamp(1, 3600);
    let width = (end / buckets as f64).max(1e-3);
    let mut done = vec![0usize; buckets];
    let mut failed = vec![0usize; buckets];
    let mut e2e: Vec<Vec<f64>> = vec![Vec::new(); buckets];
    for r in records {
        let b = ((r.end_s / width) as usize).min(buckets - 1);
        if r.ok {
            done[b] += 1;
            e2e[b].push(r.e2e_ms);
        } else {
            failed[b] += 1;
        }
    }
    let x = |b: usize| (b as f64 + 0.5) * width;
    let rate = vec![
        (
            "completed/s",
            COLOURS[0],
            (0..buckets)
                .map(|b| (x(b), done[b] as f64 / width))
                .collect(),
        ),
        (
            "failed/s",
            COLOURS[1],
            (0..buckets)
                .map(|b| (x(b), failed[b] as f64 / width))
                .collect(),
        ),
    ];
    html.push_str(&svg_chart("Throughput over time", "s", "requests/s", &rate));
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    for (b, values) in e2e.iter_mut().enumerate() {
        if let Some(d) = Distribution::of(std::mem::take(values)) {
            p50.push((x(b), d.p50));
            p99.push((x(b), d.p99));
        }
    }
    html.push_str(&svg_chart(
        "E2E latency over time (by completion)",
        "s",
        "ms",
        &[("p50", COLOURS[0], p50), ("p99", COLOURS[1], p99)],
    ));
    html
}

pub fn write_html(report: &Report, path: &Path) -> SetupResult<()> {
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>smg-bench report</title>\
         <style>body{font-family:sans-serif;margin:24px;max-width:1200px}pre{background:#f6f6f6;padding:8px}svg{margin:6px}</style>\
         </head><body><h1>smg-bench report</h1>",
    );
    if report.points.len() > 1 {
        let _ = write!(
            html,
            "<h2>Sweep</h2><pre>{}</pre>",
            html_escape(&sweep_text(report))
        );
        let by_rate: Vec<(f64, f64)> = report
            .points
            .iter()
            .filter_map(|p| Some((p.summary.achieved_rate, p.summary.e2e_ms?.p99)))
            .collect();
        let by_rate_p50: Vec<(f64, f64)> = report
            .points
            .iter()
            .filter_map(|p| Some((p.summary.achieved_rate, p.summary.e2e_ms?.p50)))
            .collect();
        html.push_str(&svg_chart(
            "E2E latency vs achieved rate",
            "achieved req/s",
            "ms",
            &[
                ("p50", COLOURS[0], by_rate_p50),
                ("p99", COLOURS[1], by_rate),
            ],
        ));
    }
    for (i, point) in report.points.iter().enumerate() {
        html.push_str(&point_html(report, i, point));
    }
    let config = serde_json::to_string_pretty(&report.config).unwrap_or_default();
    let _ = write!(
        html,
        "<h2>Configuration</h2><pre>{}</pre></body></html>",
        html_escape(&config)
    );
    std::fs::write(path, html).map_err(|e| io_err(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_ends_at_one_and_is_monotone() {
        let pts = cdf((0..1000).map(f64::from).rev().collect());
        assert!(pts.len() <= 402);
        assert_eq!(pts.last().copied(), Some((999.0, 1.0)));
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!(cdf(vec![]).is_empty());
    }

    #[test]
    fn charts_are_well_formed_svg() {
        let svg = svg_chart(
            "t<1>",
            "x",
            "y",
            &[("a&b", "#000", vec![(0.0, 1.0), (2.0, 3.0)])],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("t&lt;1&gt;") && svg.contains("a&amp;b"));
        assert!(svg.contains("<polyline"));
    }
}
