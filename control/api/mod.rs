//! smg's public HTTP API: the wire types clients send and receive (and, later,
//! the handlers that serve them).

pub mod types;
