//! smg's public HTTP API: the wire types clients send and receive (`types`),
//! the handlers that run them through the router (`endpoints`, `admin`),
//! the front door every request passes first (`front_door`, ordering the
//! steps of `auth`, `admit`, `limits`, `request_id`), errors in each route's dialect (`dialect`), and the
//! server plumbing (`http`: routes, SSE framing; `listener`: connections,
//! their limits and timers; `head`: each HTTP/1 request head scanned on its
//! way to hyper, so heads hyper would refuse without a body are answered
//! in their route's dialect).

mod admin;
mod admit;
mod auth;
mod dialect;
mod endpoints;
mod front_door;
mod head;
mod http;
mod limits;
mod listener;
mod logprobs;
mod parsers;
mod request_id;
mod state;
pub mod types;

pub use auth::{ANONYMOUS, AUDIT_TARGET, Operator, Tenant};
pub use http::{AppState, SharedState, admin_app, admin_on_public, app, serve_metrics};
pub use listener::{ListenerSettings, bind, serve};
pub use request_id::{MAX_REQUEST_ID_LEN, RequestId};
pub use state::Fleet;
