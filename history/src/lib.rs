//! Where the gateway keeps what the Responses API and the conversations API
//! promise to remember: stored responses (so `previous_response_id` can
//! replay a chain and `GET /v1/responses/{id}` can answer), conversations
//! and their items.
//!
//! Why a crate of its own: the gateway sees one trait, [`HistoryStore`], and
//! never a database type. `--history-backend` picks the implementation:
//! `sqlite` (an embedded file, the default), `postgres` (shared by several
//! gateway replicas), `memory` (lost on restart) or `none` (nothing kept).
//! Every backend passes the same contract tests, so the gateway's behaviour
//! does not depend on which one runs.
//!
//! The store keeps JSON as the gateway hands it over: it knows which fields
//! it indexes (ids, the chain link, a conversation's order) and nothing of
//! the API's item shapes.

#![deny(unsafe_code)]

mod config;
pub mod memory;
pub mod none;
pub mod postgres;
mod sql;
pub mod sqlite;

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

pub use config::{HistoryConfig, open};

/// One stored response: the step of a chain.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// `resp_…`, made by the gateway.
    pub id: String,
    /// The response this one continues (`previous_response_id`), if any.
    pub previous_response_id: Option<String>,
    /// The conversation this response was made in, if any.
    pub conversation_id: Option<String>,
    pub model: String,
    /// The API status: `queued`, `in_progress`, `completed`, `incomplete`,
    /// `failed` or `cancelled`.
    pub status: String,
    /// Unix seconds.
    pub created_at: i64,
    /// This step's own input items (a JSON array), each with its id: not
    /// the history it was given.
    pub input: Value,
    /// The output items (a JSON array).
    pub output: Value,
    /// The whole response object as the API served it.
    pub raw: Value,
    /// The gateway instance running it while it is in flight (`queued` or
    /// `in_progress`); `None` once it has ended. Orphans are found by it
    /// (see [`HistoryStore::orphaned_responses`]).
    pub owner: Option<String>,
}

/// A conversation (`conv_…`).
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub id: String,
    /// Unix seconds.
    pub created_at: i64,
    /// The client's metadata (a JSON object).
    pub metadata: Value,
}

/// One item of a conversation, in the order it was added.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationItem {
    /// The item's own id (`msg_…`, `fc_…`, …), unique within the store.
    pub id: String,
    pub conversation_id: String,
    /// Unix seconds.
    pub created_at: i64,
    /// The item as the API shows it (a JSON object with `id` and `type`).
    pub item: Value,
}

/// Which way a listing walks a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Oldest first.
    #[default]
    Asc,
    /// Newest first.
    Desc,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// At most this many items (the gateway bounds it, 1..=100).
    pub limit: usize,
    pub order: Order,
    /// Start after this item id (exclusive), in `order`.
    pub after: Option<String>,
}

/// A page of conversation items.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemPage {
    pub items: Vec<ConversationItem>,
    /// Whether more items follow the last one in this order.
    pub has_more: bool,
}

/// What went wrong in the store, as the gateway needs to answer it.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The database could not be reached or failed the operation (retryable
    /// from the client's point of view: 503).
    #[error("history store unavailable: {0}")]
    Unavailable(String),
    /// The database is out of reach: no connection can be made. `cause`
    /// says why in words a client may be shown ("connection refused"; no
    /// address, no name), `detail` tells the log the rest (the server's
    /// address, the driver's error). Once a store knows this it fails
    /// its calls at once, without waiting for a connection, until the
    /// server answers again.
    #[error("history store unreachable: {detail}")]
    Unreachable { cause: String, detail: String },
    /// The operation names something that does not exist (a conversation
    /// items are added to, an `after` cursor outside the conversation).
    #[error("not found: {0}")]
    NotFound(String),
    /// The id is taken already.
    #[error("already exists: {0}")]
    Conflict(String),
    /// What the store holds cannot be read back (a corrupt row).
    #[error("history store corrupt: {0}")]
    Corrupt(String),
}

pub type HistoryResult<T> = Result<T, HistoryError>;

/// The one interface the gateway stores history through.
///
/// Every method is one transaction: a failure leaves the store as it was
/// (a chain is never half-written).
#[async_trait]
pub trait HistoryStore: Send + Sync + Debug {
    /// The backend's name, as `--history-backend` spells it (metrics label).
    fn backend(&self) -> &'static str;

    /// Stores `response` (or replaces the one with its id: a background
    /// response is stored `in_progress`, then finished) and appends `items`
    /// to their conversation, in one transaction. Appending to a
    /// conversation that does not exist is `NotFound`.
    async fn save_response(
        &self,
        response: &StoredResponse,
        items: &[ConversationItem],
    ) -> HistoryResult<()>;

    async fn get_response(&self, id: &str) -> HistoryResult<Option<StoredResponse>>;

    /// Deletes one response; `false` if there was none. The responses that
    /// continue it keep their link (loading their chain then finds it
    /// broken).
    async fn delete_response(&self, id: &str) -> HistoryResult<bool>;

    /// The chain that ends at `id`, oldest first: `id`'s response, the one
    /// it continues, and so on, at most `max_steps` of them, in one query.
    /// Empty if `id` is unknown; a chain whose oldest member names a
    /// previous response that is gone is returned as found (the caller
    /// sees the dangling `previous_response_id`).
    async fn response_chain(
        &self,
        id: &str,
        max_steps: usize,
    ) -> HistoryResult<Vec<StoredResponse>>;

    /// Creates a conversation with its first items.
    async fn create_conversation(
        &self,
        conversation: &Conversation,
        items: &[ConversationItem],
    ) -> HistoryResult<()>;

    async fn get_conversation(&self, id: &str) -> HistoryResult<Option<Conversation>>;

    /// Replaces a conversation's metadata; `None` if there is none.
    async fn update_conversation(
        &self,
        id: &str,
        metadata: &Value,
    ) -> HistoryResult<Option<Conversation>>;

    /// Deletes a conversation and its items; `false` if there was none.
    async fn delete_conversation(&self, id: &str) -> HistoryResult<bool>;

    /// Appends items to a conversation, in order (`NotFound` if there is
    /// no such conversation).
    async fn add_items(
        &self,
        conversation_id: &str,
        items: &[ConversationItem],
    ) -> HistoryResult<()>;

    /// A page of a conversation's items (`NotFound` if `page.after` is not
    /// one of them).
    async fn list_items(
        &self,
        conversation_id: &str,
        page: &PageRequest,
    ) -> HistoryResult<ItemPage>;

    async fn get_item(
        &self,
        conversation_id: &str,
        item_id: &str,
    ) -> HistoryResult<Option<ConversationItem>>;

    /// Deletes one item; `false` if the conversation has no such item.
    async fn delete_item(&self, conversation_id: &str, item_id: &str) -> HistoryResult<bool>;

    /// Renews `instance`'s lease: records that the gateway of that name is
    /// alive now (by the store's clock, so replicas' clocks need not
    /// agree).
    async fn heartbeat(&self, instance: &str) -> HistoryResult<()>;

    /// Responses left in flight (`queued` or `in_progress`) by a gateway
    /// that is gone, at most `limit` of them: those with no owner, those
    /// whose owner's last heartbeat is `lease` old or older (or never
    /// came), and, when `mine`, those owned by `instance` itself (a
    /// gateway's previous life: ask only before running anything). Rows
    /// of `instance` are never returned otherwise, nor rows of an owner
    /// whose lease is fresh.
    async fn orphaned_responses(
        &self,
        instance: &str,
        mine: bool,
        lease: Duration,
        limit: usize,
    ) -> HistoryResult<Vec<StoredResponse>>;

    /// Replaces the orphan `ended.id` by `ended` if it is still in flight
    /// and still owned by `owner` (its gateway did not finish it after
    /// all, and no other replica ended it first); `true` if replaced.
    async fn end_orphan(&self, ended: &StoredResponse, owner: Option<&str>) -> HistoryResult<bool>;

    /// Asks the gateway running `id` to cancel it: records the request on
    /// the row if it is still in flight (`queued` or `in_progress`), and
    /// where the store can push, tells the listeners of
    /// [`cancel_notices`](Self::cancel_notices). `false` if `id` is not
    /// in flight (unknown, or ended).
    async fn request_cancel(&self, id: &str) -> HistoryResult<bool>;

    /// The responses in flight under `instance` whose cancel was
    /// requested ([`request_cancel`](Self::request_cancel)), by id.
    async fn cancel_requests(&self, instance: &str) -> HistoryResult<Vec<String>>;

    /// A listener told of every [`request_cancel`](Self::request_cancel)
    /// as it is made, by any gateway sharing the store; `None` where the
    /// store cannot push (then [`cancel_requests`](Self::cancel_requests),
    /// asked now and then, is how an owner learns of them).
    async fn cancel_notices(&self) -> HistoryResult<Option<Box<dyn CancelNotices>>>;
}

/// What [`HistoryStore::cancel_notices`] gives: the ids of responses whose
/// cancel was requested, as the requests are made.
#[async_trait]
pub trait CancelNotices: Send {
    /// The next id whose cancel was requested (any gateway's: the caller
    /// keeps those it runs). `None` when notices may have been missed (the
    /// connection that listens was lost and is back): ask
    /// [`HistoryStore::cancel_requests`] now. An error means this listener
    /// cannot listen now; open a new one later.
    async fn next(&mut self) -> HistoryResult<Option<String>>;
}

/// Whether a stored status is one of a response still running.
pub fn in_flight(status: &str) -> bool {
    matches!(status, "queued" | "in_progress")
}
