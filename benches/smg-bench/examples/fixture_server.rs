//! The scripted endpoint smg-bench tests itself against, as a process: point
//! smg-bench (or any client) at it to see the client's own overhead.
//!
//! `cargo run --release -p smg-bench --example fixture_server -- [TTFT_MS ITL_MS TOKENS]`
//! prints `fixture ready http=127.0.0.1:PORT` and serves until killed, on one
//! current-thread runtime (pin it with `taskset`).

use std::time::Duration;

use smg_bench::fixture::{FixtureConfig, FixtureServer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let numbers: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let [ttft_ms, itl_ms, tokens] = match numbers.as_slice() {
        [] => [0, 0, 8],
        [a, b, c] => [*a, *b, *c],
        _ => return Err("usage: fixture_server [TTFT_MS ITL_MS TOKENS]".into()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let server = FixtureServer::start(FixtureConfig {
            ttft: Duration::from_millis(ttft_ms),
            itl: Duration::from_millis(itl_ms),
            tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            ..FixtureConfig::default()
        })
        .await?;
        println!("fixture ready http={}", server.addr);
        std::future::pending::<()>().await;
        Ok(())
    })
}
