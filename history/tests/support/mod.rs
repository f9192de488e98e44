//! What the integration tests share: the contract suite every backend must
//! pass.

pub mod suite;
