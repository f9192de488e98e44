//! The `sqlite` backend: an embedded database file, the gateway's default.
//!
//! Why it exists: one gateway keeps its history across restarts with no
//! server to run. The file is opened in WAL mode (readers never wait for
//! the writer) with `synchronous=NORMAL` (a commit survives a gateway crash;
//! an OS crash may lose the last ones, never corrupt the file), a busy
//! timeout (writers queue instead of failing), and foreign keys on (items
//! die with their conversation). Write transactions start with `BEGIN
//! IMMEDIATE`, so they take the write lock first and wait in the busy
//! timeout instead of failing when they upgrade from reading.

use std::{path::Path, time::Duration};

use sqlx::{
    Sqlite, SqlitePool,
    pool::PoolConnection,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};

use crate::{
    HistoryError, HistoryResult,
    sql::{Queries, db_err, sql_store},
};

/// How long a write waits for another writer before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Readers in parallel (WAL); writers take turns anyway.
const MAX_CONNECTIONS: u32 = 4;

/// The history in a sqlite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (or creates, with its parent directories) the database file
    /// and brings its schema up to date.
    pub async fn open(path: &Path) -> HistoryResult<Self> {
        let unavailable = |what: &str, err: &dyn std::fmt::Display| -> HistoryError {
            HistoryError::Unavailable(format!("{what} {}: {err}", path.display()))
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|err| unavailable("cannot create the directory of", &err))?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .connect_with(options)
            .await
            .map_err(|err| unavailable("cannot open", &err))?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&pool)
            .await
            .map_err(|err| unavailable("cannot migrate", &err))?;
        Ok(Self { pool })
    }

    /// A connection of the pool (a file is never out of reach; waiting
    /// for a writer is the busy timeout's business).
    async fn connection(&self) -> HistoryResult<PoolConnection<Sqlite>> {
        self.pool.acquire().await.map_err(db_err)
    }

    /// sqlite cannot push a notice to another process: a gateway finds the
    /// cancels of its responses by asking (`cancel_requests`).
    async fn listen_for_cancels(&self) -> HistoryResult<Option<Box<dyn crate::CancelNotices>>> {
        Ok(None)
    }
}

/// Now, in unix milliseconds, by the database's clock (heartbeats and
/// leases are compared on one clock, whatever the replicas' clocks say).
macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}

const QUERIES: Queries = Queries {
    begin_write: "BEGIN IMMEDIATE",
    upsert_response: "INSERT INTO responses
            (id, previous_response_id, conversation_id, model, status, created_at, input, output, raw,
            owner)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        ON CONFLICT (id) DO UPDATE SET
            previous_response_id = excluded.previous_response_id,
            conversation_id = excluded.conversation_id,
            model = excluded.model,
            status = excluded.status,
            created_at = excluded.created_at,
            input = excluded.input,
            output = excluded.output,
            raw = excluded.raw,
            owner = excluded.owner",
    get_response: "SELECT id, previous_response_id, conversation_id, model, status, created_at,
            input, output, raw, owner
        FROM responses WHERE id = $1",
    delete_response: "DELETE FROM responses WHERE id = $1",
    // Walks previous_response_id by primary key, one row per step, newest
    // at depth 1; returned oldest first.
    response_chain: "WITH RECURSIVE chain (id, previous_response_id, depth) AS (
            SELECT id, previous_response_id, 1 FROM responses WHERE id = $1
            UNION ALL
            SELECT r.id, r.previous_response_id, chain.depth + 1
            FROM chain JOIN responses r ON r.id = chain.previous_response_id
            WHERE chain.depth < $2
        )
        SELECT r.id, r.previous_response_id, r.conversation_id, r.model, r.status, r.created_at,
            r.input, r.output, r.raw, r.owner
        FROM chain JOIN responses r ON r.id = chain.id
        ORDER BY chain.depth DESC",
    insert_conversation: "INSERT INTO conversations (id, created_at, metadata) VALUES ($1, $2, $3)",
    get_conversation: "SELECT id, created_at, metadata FROM conversations WHERE id = $1",
    update_conversation: "UPDATE conversations SET metadata = $2 WHERE id = $1
        RETURNING id, created_at, metadata",
    delete_conversation: "DELETE FROM conversations WHERE id = $1",
    insert_item: "INSERT INTO conversation_items (id, conversation_id, created_at, item)
        VALUES ($1, $2, $3, $4)",
    list_asc: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 ORDER BY seq ASC LIMIT $2",
    list_desc: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 ORDER BY seq DESC LIMIT $2",
    list_asc_after: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 AND seq > (
            SELECT seq FROM conversation_items WHERE conversation_id = $1 AND id = $3)
        ORDER BY seq ASC LIMIT $2",
    list_desc_after: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 AND seq < (
            SELECT seq FROM conversation_items WHERE conversation_id = $1 AND id = $3)
        ORDER BY seq DESC LIMIT $2",
    get_item: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 AND id = $2",
    delete_item: "DELETE FROM conversation_items WHERE conversation_id = $1 AND id = $2",
    heartbeat: concat!(
        "INSERT INTO history_instances (instance, heartbeat_at) VALUES ($1, ",
        now_ms!(),
        ")
        ON CONFLICT (instance) DO UPDATE SET heartbeat_at = excluded.heartbeat_at"
    ),
    // In flight, and: no owner; or this instance's own (when $2); or an
    // owner whose heartbeat is $3 ms old or older, or never came.
    orphans: concat!(
        "SELECT id, previous_response_id, conversation_id, model, status, created_at,
            input, output, raw, owner
        FROM responses r
        WHERE status IN ('queued', 'in_progress') AND (
            owner IS NULL
            OR (owner = $1 AND $2)
            OR (owner <> $1 AND NOT EXISTS (
                SELECT 1 FROM history_instances i
                WHERE i.instance = r.owner AND i.heartbeat_at > ",
        now_ms!(),
        " - $3)))
        ORDER BY id LIMIT $4"
    ),
    end_orphan: "UPDATE responses SET status = $2, output = $3, raw = $4, owner = NULL
        WHERE id = $1 AND status IN ('queued', 'in_progress') AND owner IS $5",
    request_cancel: "UPDATE responses SET cancel_requested = 1
        WHERE id = $1 AND status IN ('queued', 'in_progress')",
    cancel_requests: "SELECT id FROM responses
        WHERE owner = $1 AND status IN ('queued', 'in_progress') AND cancel_requested = 1
        ORDER BY id",
};

sql_store!(SqliteStore, sqlx::Sqlite, "sqlite", QUERIES);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The chain and the paging queries find rows through indexes: sqlite
    /// never scans a whole table for them (a chain costs O(steps) lookups).
    #[tokio::test]
    async fn the_chain_and_the_cursor_use_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("plan.db"))
            .await
            .unwrap();
        for sql in [
            QUERIES.response_chain,
            QUERIES.list_asc_after,
            QUERIES.list_desc_after,
            QUERIES.get_item,
        ] {
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .bind("a")
                    .bind("b")
                    .bind("c")
                    .fetch_all(&store.pool)
                    .await
                    .unwrap();
            let steps: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
            assert!(
                steps.iter().all(|step| !step.starts_with("SCAN responses")
                    && !step.starts_with("SCAN r")
                    && !step.starts_with("SCAN conversation_items")),
                "{sql}\n{steps:#?}"
            );
            assert!(
                steps.iter().any(|step| step.contains("USING INDEX")),
                "{steps:#?}"
            );
        }
    }
}
