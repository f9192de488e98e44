//! Runs the one contract suite (`support/suite.rs`) on every backend: each
//! case becomes one test per backend, `memory::<case>` and so on.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use smg_history::{HistoryConfig, HistoryError, HistoryStore, open};

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
    _dir: Option<tempfile::TempDir>,
}

impl Fixture {
    fn store(&self) -> &dyn HistoryStore {
        self.store.as_ref()
    }
}

async fn memory() -> Fixture {
    Fixture {
        store: open(&HistoryConfig::Memory).await.unwrap(),
        _dir: None,
    }
}

/// A fresh database file in a directory of its own (created by open).
async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dirs/history.db");
    Fixture {
        store: open(&HistoryConfig::Sqlite { path }).await.unwrap(),
        _dir: Some(dir),
    }
}

mod memory {
    use super::*;
    for_each_case!(run_cases!(memory()));
}

mod sqlite {
    use super::*;
    for_each_case!(run_cases!(sqlite()));

    /// What one store wrote, a store opened later on the same file reads:
    /// the gateway keeps its history across restarts.
    #[tokio::test]
    async fn a_reopened_file_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        let config = HistoryConfig::Sqlite {
            path: dir.path().join("history.db"),
        };
        let store = open(&config).await.unwrap();
        support::suite::write_a_sample(store.as_ref()).await;
        drop(store);
        let reopened = open(&config).await.unwrap();
        support::suite::read_the_sample(reopened.as_ref()).await;
    }

    /// The file is in WAL mode (a property of the file, seen by any
    /// connection), and a row whose JSON does not parse reads as Corrupt.
    #[tokio::test]
    async fn the_file_is_wal_and_a_broken_row_is_corrupt() {
        use sqlx::Connection;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.db");
        let store = open(&HistoryConfig::Sqlite { path: path.clone() })
            .await
            .unwrap();
        store
            .save_response(&support::suite::response("resp_broken", None), &[])
            .await
            .unwrap();

        let mut raw = sqlx::SqliteConnection::connect_with(
            &sqlx::sqlite::SqliteConnectOptions::new().filename(&path),
        )
        .await
        .unwrap();
        let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
            .fetch_one(&mut raw)
            .await
            .unwrap();
        assert_eq!(mode, "wal");
        sqlx::query("UPDATE responses SET raw = '{not json' WHERE id = 'resp_broken'")
            .execute(&mut raw)
            .await
            .unwrap();

        let err = store.get_response("resp_broken").await.unwrap_err();
        assert!(matches!(err, HistoryError::Corrupt(_)), "{err:?}");
        let err = store.response_chain("resp_broken", 10).await.unwrap_err();
        assert!(matches!(err, HistoryError::Corrupt(_)), "{err:?}");
    }
}
