//! The gateway's side of the history store (`smg-history`): every call
//! timed into the metrics, and every failure turned into the gateway's
//! error.
//!
//! Why it exists: handlers should not each time calls, label metrics or
//! decide what a database error tells a client. A store's own message may
//! carry a host name or a query; it goes to the log, and the client gets
//! `history_unavailable` (503, retryable) with the operation that failed.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use smg_history::{
    Conversation, ConversationItem, HistoryError, HistoryStore, ItemPage, PageRequest,
    StoredResponse,
};

use crate::error::{Error, ErrorCode, Result};
use crate::metrics;

/// The store, as handlers use it.
#[derive(Debug, Clone)]
pub struct History {
    store: Arc<dyn HistoryStore>,
}

/// What a `NotFound` from the store means at a call site.
fn not_found(code: ErrorCode, what: &str) -> Error {
    Error::new(code, format!("{what} does not exist"))
}

impl History {
    pub fn new(store: Arc<dyn HistoryStore>) -> Self {
        Self { store }
    }

    /// An in-memory store (tests, and gateways built without one).
    pub fn memory() -> Self {
        Self::new(Arc::new(smg_history::memory::MemoryStore::new()))
    }

    pub fn backend(&self) -> &'static str {
        self.store.backend()
    }

    /// Whether anything is kept (`--history-backend none` keeps nothing).
    pub fn keeps_anything(&self) -> bool {
        self.backend() != "none"
    }

    /// Refuses what needs stored history when none is kept.
    pub fn require(&self, what: &str) -> Result<()> {
        if self.keeps_anything() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorCode::HistoryDisabled,
                format!(
                    "{what} needs stored history, and this gateway keeps none (--history-backend none)"
                ),
            ))
        }
    }

    async fn timed<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = smg_history::HistoryResult<T>>,
        not_found_code: ErrorCode,
        what: &str,
    ) -> Result<T> {
        let started = Instant::now();
        let outcome = call.await;
        metrics::record_history(
            self.backend(),
            operation,
            started.elapsed(),
            outcome.is_ok() || matches!(outcome, Err(HistoryError::NotFound(_))),
        );
        outcome.map_err(|err| match err {
            HistoryError::NotFound(_) => not_found(not_found_code, what),
            HistoryError::Conflict(detail) => {
                Error::invalid_request(format!("{what} exists already ({detail})"))
            }
            HistoryError::Unavailable(detail) | HistoryError::Corrupt(detail) => {
                tracing::warn!(
                    backend = self.backend(),
                    operation,
                    error = %detail,
                    "history store failed"
                );
                Error::new(
                    ErrorCode::HistoryUnavailable,
                    format!(
                        "the history store ({}) failed to {}; nothing was changed",
                        self.backend(),
                        step(operation)
                    ),
                )
            }
        })
    }

    pub async fn save_response(
        &self,
        response: &StoredResponse,
        items: &[ConversationItem],
    ) -> Result<()> {
        let what = match &response.conversation_id {
            Some(id) => format!("conversation {id}"),
            None => format!("response {}", response.id),
        };
        self.timed(
            "save_response",
            self.store.save_response(response, items),
            ErrorCode::ConversationNotFound,
            &what,
        )
        .await?;
        metrics::record_response_stored(self.backend(), status_label(&response.status));
        Ok(())
    }

    pub async fn get_response(&self, id: &str) -> Result<Option<StoredResponse>> {
        self.timed(
            "get_response",
            self.store.get_response(id),
            ErrorCode::ResponseNotFound,
            id,
        )
        .await
    }

    pub async fn delete_response(&self, id: &str) -> Result<bool> {
        self.timed(
            "delete_response",
            self.store.delete_response(id),
            ErrorCode::ResponseNotFound,
            id,
        )
        .await
    }

    pub async fn response_chain(&self, id: &str, max_steps: usize) -> Result<Vec<StoredResponse>> {
        self.timed(
            "response_chain",
            self.store.response_chain(id, max_steps),
            ErrorCode::PreviousResponseNotFound,
            id,
        )
        .await
    }

    pub async fn create_conversation(
        &self,
        conversation: &Conversation,
        items: &[ConversationItem],
    ) -> Result<()> {
        self.timed(
            "create_conversation",
            self.store.create_conversation(conversation, items),
            ErrorCode::ConversationNotFound,
            &conversation.id,
        )
        .await
    }

    pub async fn get_conversation(&self, id: &str) -> Result<Option<Conversation>> {
        self.timed(
            "get_conversation",
            self.store.get_conversation(id),
            ErrorCode::ConversationNotFound,
            id,
        )
        .await
    }

    pub async fn update_conversation(
        &self,
        id: &str,
        metadata: &Value,
    ) -> Result<Option<Conversation>> {
        self.timed(
            "update_conversation",
            self.store.update_conversation(id, metadata),
            ErrorCode::ConversationNotFound,
            id,
        )
        .await
    }

    pub async fn delete_conversation(&self, id: &str) -> Result<bool> {
        self.timed(
            "delete_conversation",
            self.store.delete_conversation(id),
            ErrorCode::ConversationNotFound,
            id,
        )
        .await
    }

    pub async fn add_items(&self, conversation_id: &str, items: &[ConversationItem]) -> Result<()> {
        self.timed(
            "add_items",
            self.store.add_items(conversation_id, items),
            ErrorCode::ConversationNotFound,
            &format!("conversation {conversation_id}"),
        )
        .await
    }

    pub async fn list_items(&self, conversation_id: &str, page: &PageRequest) -> Result<ItemPage> {
        let after = page.after.as_deref().unwrap_or_default();
        self.timed(
            "list_items",
            self.store.list_items(conversation_id, page),
            ErrorCode::ItemNotFound,
            &format!("item {after} (after) of conversation {conversation_id}"),
        )
        .await
    }

    pub async fn get_item(
        &self,
        conversation_id: &str,
        item_id: &str,
    ) -> Result<Option<ConversationItem>> {
        self.timed(
            "get_item",
            self.store.get_item(conversation_id, item_id),
            ErrorCode::ItemNotFound,
            item_id,
        )
        .await
    }

    pub async fn delete_item(&self, conversation_id: &str, item_id: &str) -> Result<bool> {
        self.timed(
            "delete_item",
            self.store.delete_item(conversation_id, item_id),
            ErrorCode::ItemNotFound,
            item_id,
        )
        .await
    }
}

/// What the store was asked to do, as a client's error message tells it
/// ("failed to ..."); `operation` is the metrics label.
fn step(operation: &str) -> &'static str {
    match operation {
        "save_response" => "save the response",
        "get_response" => "read the response",
        "delete_response" => "delete the response",
        "response_chain" => "read the previous_response_id chain",
        "create_conversation" => "create the conversation",
        "get_conversation" => "read the conversation",
        "update_conversation" => "update the conversation",
        "delete_conversation" => "delete the conversation",
        "add_items" => "add the conversation items",
        "list_items" => "list the conversation items",
        "get_item" => "read the conversation item",
        "delete_item" => "delete the conversation item",
        _ => "answer",
    }
}

/// A stored status as a metrics label (a fixed set).
fn status_label(status: &str) -> &'static str {
    match status {
        "queued" => "queued",
        "in_progress" => "in_progress",
        "completed" => "completed",
        "incomplete" => "incomplete",
        "failed" => "failed",
        "cancelled" => "cancelled",
        _ => "other",
    }
}
