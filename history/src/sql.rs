//! What the two SQL backends share: the `HistoryStore` implementation over
//! an sqlx pool, the error mapping and the JSON decoding.
//!
//! Why it exists: sqlite and postgres differ only in their SQL text (the
//! clock, NULL-safe equality, `BEGIN IMMEDIATE`), not in what a method does. Each backend
//! module writes its statements into a [`Queries`] and invokes
//! [`sql_store!`] for its store type; the method bodies (transactions,
//! paging, error mapping) exist once. A macro rather than generic code: sqlx
//! is generic over the database only through a long list of higher-ranked
//! bounds, while each expansion here is ordinary code over one concrete
//! database.

use serde_json::Value;

use crate::{HistoryError, HistoryResult};

/// One backend's SQL. Placeholders are `$n` in both dialects (sqlite reads
/// `$n` as the n-th bound value). Every SELECT of a response returns its
/// columns in the order of [`StoredResponse`](crate::StoredResponse)'s
/// fields, every SELECT of an item returns (id, conversation_id,
/// created_at, item), of a conversation (id, created_at, metadata), JSON
/// columns as text.
#[derive(Debug)]
pub(crate) struct Queries {
    /// Starts a transaction that writes.
    pub begin_write: &'static str,
    /// ($1 id, … $6 created_at, $7 input, $8 output, $9 raw, $10 owner).
    pub upsert_response: &'static str,
    /// ($1 id).
    pub get_response: &'static str,
    /// ($1 id).
    pub delete_response: &'static str,
    /// ($1 newest id, $2 max steps): the chain oldest first, one query.
    pub response_chain: &'static str,
    /// ($1 id, $2 created_at, $3 metadata).
    pub insert_conversation: &'static str,
    /// ($1 id).
    pub get_conversation: &'static str,
    /// ($1 id, $2 metadata), returning the conversation.
    pub update_conversation: &'static str,
    /// ($1 id).
    pub delete_conversation: &'static str,
    /// ($1 id, $2 conversation_id, $3 created_at, $4 item).
    pub insert_item: &'static str,
    /// ($1 conversation_id, $2 limit).
    pub list_asc: &'static str,
    /// ($1 conversation_id, $2 limit).
    pub list_desc: &'static str,
    /// ($1 conversation_id, $2 limit, $3 after id).
    pub list_asc_after: &'static str,
    /// ($1 conversation_id, $2 limit, $3 after id).
    pub list_desc_after: &'static str,
    /// ($1 conversation_id, $2 item id).
    pub get_item: &'static str,
    /// ($1 conversation_id, $2 item id).
    pub delete_item: &'static str,
    /// ($1 instance): its heartbeat is now, by the database's clock.
    pub heartbeat: &'static str,
    /// ($1 instance, $2 mine, $3 lease in ms, $4 limit): responses in
    /// flight whose owner is gone (see `HistoryStore::orphaned_responses`).
    pub orphans: &'static str,
    /// ($1 id, $2 status, $3 output, $4 raw, $5 owner): replaces the row if
    /// it is still in flight and owned by `$5` (NULL-safe).
    pub end_orphan: &'static str,
    /// ($1 id): flags the row's cancel if it is in flight (and, where the
    /// store pushes, notifies the listeners); one row affected if so.
    pub request_cancel: &'static str,
    /// ($1 instance): the ids of its rows in flight whose cancel was
    /// requested.
    pub cancel_requests: &'static str,
}

/// Maps an sqlx error to what the gateway answers. `missing` names what a
/// foreign-key violation means in this call (an item's conversation).
pub(crate) fn map_err(err: sqlx::Error, missing: impl FnOnce() -> String) -> HistoryError {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            HistoryError::Conflict(db.message().to_owned())
        }
        sqlx::Error::Database(db) if db.is_foreign_key_violation() => {
            HistoryError::NotFound(missing())
        }
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => HistoryError::Corrupt(err.to_string()),
        _ => HistoryError::Unavailable(err.to_string()),
    }
}

/// [`map_err`] for calls where no foreign key can fail.
pub(crate) fn db_err(err: sqlx::Error) -> HistoryError {
    map_err(err, || "a referenced row".to_owned())
}

/// Parses a JSON column; what does not parse is a corrupt row.
pub(crate) fn json(text: &str, what: &str) -> HistoryResult<Value> {
    serde_json::from_str(text)
        .map_err(|err| HistoryError::Corrupt(format!("{what} is not valid JSON: {err}")))
}

/// A `usize` count or limit as the `BIGINT` SQL binds (saturating).
pub(crate) fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Implements `HistoryStore` for `$store` with the statements of
/// `$queries: Queries`. The store has two inherent methods: `async fn
/// connection(&self) -> HistoryResult<PoolConnection<$db>>`, where every
/// call gets its connection (so a backend decides what waiting for one
/// means, and what a failure to get one says), and `async fn
/// listen_for_cancels(&self)`, which answers `cancel_notices`.
macro_rules! sql_store {
    ($store:ty, $db:ty, $backend:literal, $queries:expr) => {
        const _: () = {
            use async_trait::async_trait;
            use serde_json::Value;
            use sqlx::{Connection as _, Row};

            use $crate::sql::{Queries, db_err, json, map_err, to_i64};
            use $crate::{
                Conversation, ConversationItem, HistoryError, HistoryResult, HistoryStore,
                ItemPage, Order, PageRequest, StoredResponse,
            };

            const Q: &Queries = &$queries;
            type DbRow = <$db as sqlx::Database>::Row;

            fn response_from(row: &DbRow) -> HistoryResult<StoredResponse> {
                let id: String = row.try_get(0).map_err(db_err)?;
                let input: String = row.try_get(6).map_err(db_err)?;
                let output: String = row.try_get(7).map_err(db_err)?;
                let raw: String = row.try_get(8).map_err(db_err)?;
                Ok(StoredResponse {
                    owner: row.try_get(9).map_err(db_err)?,
                    previous_response_id: row.try_get(1).map_err(db_err)?,
                    conversation_id: row.try_get(2).map_err(db_err)?,
                    model: row.try_get(3).map_err(db_err)?,
                    status: row.try_get(4).map_err(db_err)?,
                    created_at: row.try_get(5).map_err(db_err)?,
                    input: json(&input, &format!("response {id} input"))?,
                    output: json(&output, &format!("response {id} output"))?,
                    raw: json(&raw, &format!("response {id} raw"))?,
                    id,
                })
            }

            fn conversation_from(row: &DbRow) -> HistoryResult<Conversation> {
                let id: String = row.try_get(0).map_err(db_err)?;
                let metadata: String = row.try_get(2).map_err(db_err)?;
                Ok(Conversation {
                    created_at: row.try_get(1).map_err(db_err)?,
                    metadata: json(&metadata, &format!("conversation {id} metadata"))?,
                    id,
                })
            }

            fn item_from(row: &DbRow) -> HistoryResult<ConversationItem> {
                let id: String = row.try_get(0).map_err(db_err)?;
                let item: String = row.try_get(3).map_err(db_err)?;
                Ok(ConversationItem {
                    conversation_id: row.try_get(1).map_err(db_err)?,
                    created_at: row.try_get(2).map_err(db_err)?,
                    item: json(&item, &format!("item {id}"))?,
                    id,
                })
            }

            /// Appends `items` to `conversation_id` inside `tx`.
            async fn insert_items(
                tx: &mut <$db as sqlx::Database>::Connection,
                conversation_id: &str,
                items: &[ConversationItem],
            ) -> HistoryResult<()> {
                for item in items {
                    sqlx::query(Q.insert_item)
                        .bind(&item.id)
                        .bind(conversation_id)
                        .bind(item.created_at)
                        .bind(item.item.to_string())
                        .execute(&mut *tx)
                        .await
                        .map_err(|err| {
                            map_err(err, || format!("conversation {conversation_id}"))
                        })?;
                }
                Ok(())
            }

            #[async_trait]
            impl HistoryStore for $store {
                fn backend(&self) -> &'static str {
                    $backend
                }

                async fn save_response(
                    &self,
                    response: &StoredResponse,
                    items: &[ConversationItem],
                ) -> HistoryResult<()> {
                    let upsert = sqlx::query(Q.upsert_response)
                        .bind(&response.id)
                        .bind(&response.previous_response_id)
                        .bind(&response.conversation_id)
                        .bind(&response.model)
                        .bind(&response.status)
                        .bind(response.created_at)
                        .bind(response.input.to_string())
                        .bind(response.output.to_string())
                        .bind(response.raw.to_string())
                        .bind(&response.owner);
                    let mut conn = self.connection().await?;
                    // One statement is atomic on its own: no transaction's
                    // BEGIN and COMMIT round trips.
                    if items.is_empty() {
                        upsert.execute(&mut *conn).await.map_err(db_err)?;
                        return Ok(());
                    }
                    let mut tx = conn.begin_with(Q.begin_write).await.map_err(db_err)?;
                    upsert.execute(&mut *tx).await.map_err(db_err)?;
                    for item in items {
                        insert_items(&mut tx, &item.conversation_id, std::slice::from_ref(item))
                            .await?;
                    }
                    tx.commit().await.map_err(db_err)
                }

                async fn get_response(&self, id: &str) -> HistoryResult<Option<StoredResponse>> {
                    let mut conn = self.connection().await?;
                    let row = sqlx::query(Q.get_response)
                        .bind(id)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    row.as_ref().map(response_from).transpose()
                }

                async fn delete_response(&self, id: &str) -> HistoryResult<bool> {
                    let mut conn = self.connection().await?;
                    let done = sqlx::query(Q.delete_response)
                        .bind(id)
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    Ok(done.rows_affected() > 0)
                }

                async fn response_chain(
                    &self,
                    id: &str,
                    max_steps: usize,
                ) -> HistoryResult<Vec<StoredResponse>> {
                    if max_steps == 0 {
                        return Ok(Vec::new());
                    }
                    let mut conn = self.connection().await?;
                    let rows = sqlx::query(Q.response_chain)
                        .bind(id)
                        .bind(to_i64(max_steps))
                        .fetch_all(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    rows.iter().map(response_from).collect()
                }

                async fn create_conversation(
                    &self,
                    conversation: &Conversation,
                    items: &[ConversationItem],
                ) -> HistoryResult<()> {
                    let mut conn = self.connection().await?;
                    let mut tx = conn.begin_with(Q.begin_write).await.map_err(db_err)?;
                    sqlx::query(Q.insert_conversation)
                        .bind(&conversation.id)
                        .bind(conversation.created_at)
                        .bind(conversation.metadata.to_string())
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                    insert_items(&mut tx, &conversation.id, items).await?;
                    tx.commit().await.map_err(db_err)
                }

                async fn get_conversation(&self, id: &str) -> HistoryResult<Option<Conversation>> {
                    let mut conn = self.connection().await?;
                    let row = sqlx::query(Q.get_conversation)
                        .bind(id)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    row.as_ref().map(conversation_from).transpose()
                }

                async fn update_conversation(
                    &self,
                    id: &str,
                    metadata: &Value,
                ) -> HistoryResult<Option<Conversation>> {
                    let mut conn = self.connection().await?;
                    let row = sqlx::query(Q.update_conversation)
                        .bind(id)
                        .bind(metadata.to_string())
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    row.as_ref().map(conversation_from).transpose()
                }

                async fn delete_conversation(&self, id: &str) -> HistoryResult<bool> {
                    let mut conn = self.connection().await?;
                    let done = sqlx::query(Q.delete_conversation)
                        .bind(id)
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    Ok(done.rows_affected() > 0)
                }

                async fn add_items(
                    &self,
                    conversation_id: &str,
                    items: &[ConversationItem],
                ) -> HistoryResult<()> {
                    let mut conn = self.connection().await?;
                    let mut tx = conn.begin_with(Q.begin_write).await.map_err(db_err)?;
                    // Also answers NotFound for an empty list; with items the
                    // foreign key would.
                    let exists = sqlx::query(Q.get_conversation)
                        .bind(conversation_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db_err)?;
                    if exists.is_none() {
                        return Err(HistoryError::NotFound(format!(
                            "conversation {conversation_id}"
                        )));
                    }
                    insert_items(&mut tx, conversation_id, items).await?;
                    tx.commit().await.map_err(db_err)
                }

                async fn list_items(
                    &self,
                    conversation_id: &str,
                    page: &PageRequest,
                ) -> HistoryResult<ItemPage> {
                    let sql = match (page.order, page.after.is_some()) {
                        (Order::Asc, false) => Q.list_asc,
                        (Order::Desc, false) => Q.list_desc,
                        (Order::Asc, true) => Q.list_asc_after,
                        (Order::Desc, true) => Q.list_desc_after,
                    };
                    // One more than asked: whether it comes is `has_more`.
                    let mut query = sqlx::query(sql)
                        .bind(conversation_id)
                        .bind(to_i64(page.limit.saturating_add(1)));
                    if let Some(after) = &page.after {
                        query = query.bind(after);
                    }
                    let mut conn = self.connection().await?;
                    let rows = query.fetch_all(&mut *conn).await.map_err(db_err)?;
                    if let (Some(after), true) = (&page.after, rows.is_empty()) {
                        // No row: the end of the list, or a cursor that is
                        // not this conversation's (its seq compared as NULL).
                        let cursor = sqlx::query(Q.get_item)
                            .bind(conversation_id)
                            .bind(after)
                            .fetch_optional(&mut *conn)
                            .await
                            .map_err(db_err)?;
                        if cursor.is_none() {
                            return Err(HistoryError::NotFound(format!(
                                "item {after} in conversation {conversation_id}"
                            )));
                        }
                    }
                    let has_more = rows.len() > page.limit;
                    let items = rows
                        .iter()
                        .take(page.limit)
                        .map(item_from)
                        .collect::<HistoryResult<Vec<_>>>()?;
                    Ok(ItemPage { items, has_more })
                }

                async fn get_item(
                    &self,
                    conversation_id: &str,
                    item_id: &str,
                ) -> HistoryResult<Option<ConversationItem>> {
                    let mut conn = self.connection().await?;
                    let row = sqlx::query(Q.get_item)
                        .bind(conversation_id)
                        .bind(item_id)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    row.as_ref().map(item_from).transpose()
                }

                async fn delete_item(
                    &self,
                    conversation_id: &str,
                    item_id: &str,
                ) -> HistoryResult<bool> {
                    let mut conn = self.connection().await?;
                    let done = sqlx::query(Q.delete_item)
                        .bind(conversation_id)
                        .bind(item_id)
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    Ok(done.rows_affected() > 0)
                }

                async fn heartbeat(&self, instance: &str) -> HistoryResult<()> {
                    let mut conn = self.connection().await?;
                    sqlx::query(Q.heartbeat)
                        .bind(instance)
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    Ok(())
                }

                async fn orphaned_responses(
                    &self,
                    instance: &str,
                    mine: bool,
                    lease: std::time::Duration,
                    limit: usize,
                ) -> HistoryResult<Vec<StoredResponse>> {
                    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
                    let mut conn = self.connection().await?;
                    let rows = sqlx::query(Q.orphans)
                        .bind(instance)
                        .bind(mine)
                        .bind(lease_ms)
                        .bind(to_i64(limit))
                        .fetch_all(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    rows.iter().map(response_from).collect()
                }

                async fn end_orphan(
                    &self,
                    ended: &StoredResponse,
                    owner: Option<&str>,
                ) -> HistoryResult<bool> {
                    let mut conn = self.connection().await?;
                    let done = sqlx::query(Q.end_orphan)
                        .bind(&ended.id)
                        .bind(&ended.status)
                        .bind(ended.output.to_string())
                        .bind(ended.raw.to_string())
                        .bind(owner)
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    Ok(done.rows_affected() > 0)
                }

                async fn request_cancel(&self, id: &str) -> HistoryResult<bool> {
                    let mut conn = self.connection().await?;
                    let done = sqlx::query(Q.request_cancel)
                        .bind(id)
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    Ok(done.rows_affected() > 0)
                }

                async fn cancel_requests(&self, instance: &str) -> HistoryResult<Vec<String>> {
                    let mut conn = self.connection().await?;
                    let rows = sqlx::query(Q.cancel_requests)
                        .bind(instance)
                        .fetch_all(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    rows.iter()
                        .map(|row| row.try_get::<String, _>(0).map_err(db_err))
                        .collect()
                }

                async fn cancel_notices(
                    &self,
                ) -> HistoryResult<Option<Box<dyn $crate::CancelNotices>>> {
                    self.listen_for_cancels().await
                }
            }
        };
    };
}

pub(crate) use sql_store;
