//! What the integration tests share: the contract suite every backend must
//! pass.

pub mod postgres;
pub mod suite;
