//! smg-bench: an open-loop load generator for OpenAI-compatible LLM
//! endpoints (smg, SGLang, vLLM, ...), built to measure fleets without
//! becoming the bottleneck or hiding queueing.
//!
//! The library holds everything the `smg-bench` binary does, so the
//! self-tests can drive a real run against the scripted server in
//! [`fixture`]. Module map: [`cli`] flags, [`workload`] (+ [`text`],
//! [`images`]) builds every request up front, [`schedule`] draws arrival
//! times, [`client`] (+ [`sse`], [`response`]) is the hot path, [`run`]
//! dispatches and collects [`record`]s, [`stats`] summarizes, [`report`]
//! writes tables/JSON/JSONL/HTML, [`prom`] scrapes server metrics.

pub mod cli;
pub mod client;
pub mod error;
pub mod fixture;
pub mod images;
pub mod prom;
pub mod record;
pub mod report;
pub mod response;
pub mod run;
pub mod schedule;
pub mod sse;
pub mod stats;
pub mod text;
pub mod workload;
