//! Runs the one contract suite (`support/suite.rs`) on every backend: each
//! case becomes one test per backend, `memory::<case>` and so on.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use smg_history::{HistoryConfig, HistoryStore, open};

/// One test per case for a backend: `$fixture` is an async expression
/// giving something with `store()`.
macro_rules! run_cases {
    ($fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = $fixture.await;
                support::suite::$case(fixture.store()).await;
            }
        )*
    };
}

/// A store and whatever must outlive it (a temp dir, a database).
struct Fixture {
    store: Arc<dyn HistoryStore>,
}

impl Fixture {
    fn store(&self) -> &dyn HistoryStore {
        self.store.as_ref()
    }
}

async fn memory() -> Fixture {
    Fixture {
        store: open(&HistoryConfig::Memory).await.unwrap(),
    }
}

mod memory {
    use super::*;
    for_each_case!(run_cases!(memory()));
}
