//! smg's public HTTP API: the wire types clients send and receive (`types`),
//! the handlers that run them through the router (`endpoints`), and the
//! server plumbing (`http`: routes, SSE framing, errors, listeners).

mod admin;
mod admit;
mod endpoints;
mod http;
mod logprobs;
mod state;
pub mod types;

pub use http::{AppState, SharedState, app, serve, serve_metrics};
pub use state::Fleet;
