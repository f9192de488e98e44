//! The gateway's side of the history store (`smg-history`): every call
//! timed into the metrics, and every failure turned into the gateway's
//! error.
//!
//! Why it exists: handlers should not each time calls, label metrics or
//! decide what a database error tells a client. A store's own message may
//! carry a host name or a query; it goes to the log, and the client gets
//! `history_unavailable` (503, retryable) with the operation that failed
//! (and, when the store is out of reach, the cause in words that name no
//! host: "connection refused").
//!
//! It also keeps this gateway's lease in the store, so that responses a
//! dead gateway left in flight do not read `in_progress` forever. A
//! background response is stored `queued`, then `in_progress`, and only
//! its final write ends it; a gateway killed in between never writes it.
//! Each such row names its owner, this gateway's instance name
//! (`--history-instance`, by default `HOSTNAME:PORT`), and the gateway
//! renews a heartbeat row every [`HEARTBEAT_EVERY`], stamped by the
//! database's clock. Two rules end orphans as `failed` with
//! `response_orphaned`:
//! - at start, before serving, the rows in flight under the gateway's own
//!   name: a gateway of that name is starting, so the one that wrote them
//!   is gone (its previous life);
//! - on every heartbeat, rows whose owner's heartbeat is [`LEASE`] old: a
//!   replica that died and never came back (scaled down, renamed).
//!
//! A live replica's rows are never touched, as long as live replicas have
//! distinct names (two processes cannot listen on one `HOSTNAME:PORT`)
//! and a replica does not fail to reach the store for longer than the
//! lease; if it does, its final write still replaces the failed row with
//! the real outcome. A per-process random id alone would be safer against
//! duplicate names but could not tell a restarted gateway its previous
//! life's rows: they would wait for the lease. An orphan is ended only if
//! it is still in flight under the owner it was found with, so a replica
//! racing another (or the owner's own last write) never undoes an end.
//!
//! A cancel may reach a replica that does not run the response (replicas
//! share one store behind one load balancer). That replica records the
//! request in the store ([`History::request_cancel`]); the owner learns of
//! it from the store's notices at once where the store pushes them
//! (postgres LISTEN/NOTIFY) and, in any case, by asking for the requests
//! of its own responses on every heartbeat, and after a lost listening
//! connection comes back. It then cancels the response as a local cancel
//! does (the engine legs are aborted, it is stored `cancelled`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use smg_history::{
    Conversation, ConversationItem, HistoryError, HistoryStore, ItemPage, PageRequest,
    StoredResponse,
};

use crate::error::{Error, ErrorCode, Result};
use crate::metrics;

/// How often a gateway renews its lease in the store.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// How old a gateway's last heartbeat must be before another replica
/// ends the responses it left in flight (six missed heartbeats).
pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// Orphans read (and ended) per query.
const ORPHANS_PER_QUERY: usize = 256;
/// How long the cancel listener waits before listening again after its
/// connection failed (the heartbeat's sweep finds requests meanwhile).
const LISTEN_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// Cancels the response of this id if this gateway runs it; `true` if so.
pub(crate) type CancelLocal = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The store, as handlers use it.
#[derive(Debug, Clone)]
pub struct History {
    store: Arc<dyn HistoryStore>,
    /// This gateway's name in the store: the owner of the responses it
    /// runs in flight.
    instance: Arc<str>,
}

/// What a `NotFound` from the store means at a call site.
fn not_found(code: ErrorCode, what: &str) -> Error {
    Error::new(code, format!("{what} does not exist"))
}

impl History {
    pub fn new(store: Arc<dyn HistoryStore>) -> Self {
        Self {
            store,
            instance: Arc::from(""),
        }
    }

    /// This history, owned in the store by the instance `name`.
    pub fn with_instance(mut self, name: &str) -> Self {
        self.instance = Arc::from(name);
        self
    }

    /// This gateway's name in the store.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Takes this gateway's lease and ends the responses its previous life
    /// left in flight (and any orphan of a gone replica): call once at
    /// start, before serving. Returns how many were ended.
    pub async fn start_lease(&self) -> Result<usize> {
        self.timed(
            "heartbeat",
            self.store.heartbeat(&self.instance),
            ErrorCode::HistoryUnavailable,
            "heartbeat",
        )
        .await?;
        // Both series from start-up, at zero unless something is ended.
        for by in ["restart", "lease"] {
            metrics::record_orphans_ended(self.backend(), by, 0);
        }
        self.end_orphans(true).await
    }

    /// Renews the lease every [`HEARTBEAT_EVERY`] and ends the orphans of
    /// gateways whose lease ran out, until the process ends; and cancels,
    /// through `cancel_local`, the responses this gateway runs whose cancel
    /// another replica requested in the store: as the store's notices
    /// come, and on every beat. A failure is logged and tried again on the
    /// next beat.
    pub(crate) fn keep_lease(&self, cancel_local: CancelLocal) {
        if !self.keeps_anything() {
            return;
        }
        let history = self.clone();
        let sweep = Arc::clone(&cancel_local);
        tokio::spawn(async move {
            let mut beats = tokio::time::interval(HEARTBEAT_EVERY);
            beats.tick().await;
            loop {
                beats.tick().await;
                // One process owns the memory store: no lease to keep.
                if history.backend() != "memory" {
                    let beat = history.timed(
                        "heartbeat",
                        history.store.heartbeat(&history.instance),
                        ErrorCode::HistoryUnavailable,
                        "heartbeat",
                    );
                    if beat.await.is_err() {
                        // Logged where it happened (`timed`).
                        continue;
                    }
                    let _ = history.end_orphans(false).await;
                }
                history.cancel_requested(&sweep).await;
            }
        });
        let history = self.clone();
        tokio::spawn(async move { history.listen_for_cancels(&cancel_local).await });
    }

    /// Cancels what the store's notices name, listening again (after
    /// [`LISTEN_AGAIN_AFTER`]) when the listener fails; returns at once if
    /// the store cannot push.
    async fn listen_for_cancels(&self, cancel_local: &CancelLocal) {
        loop {
            let mut notices = match self.store.cancel_notices().await {
                Ok(Some(notices)) => notices,
                Ok(None) => return,
                Err(err) => {
                    tracing::warn!(
                        backend = self.backend(),
                        error = %err,
                        "cannot listen for cancel requests; trying again"
                    );
                    tokio::time::sleep(LISTEN_AGAIN_AFTER).await;
                    continue;
                }
            };
            // Requests made before this listener listened.
            self.cancel_requested(cancel_local).await;
            loop {
                match notices.next().await {
                    Ok(Some(id)) => {
                        if cancel_local(&id) {
                            tracing::info!(
                                response = %id,
                                "cancelled at the request of another gateway"
                            );
                        }
                    }
                    // Notices may have been lost meanwhile: ask.
                    Ok(None) => self.cancel_requested(cancel_local).await,
                    Err(err) => {
                        tracing::warn!(
                            backend = self.backend(),
                            error = %err,
                            "lost the cancel requests' listener; listening again"
                        );
                        break;
                    }
                }
            }
            drop(notices);
            tokio::time::sleep(LISTEN_AGAIN_AFTER).await;
        }
    }

    /// Cancels the responses this gateway runs whose cancel was requested
    /// in the store (a failure is logged by `timed`, and the next beat
    /// asks again).
    async fn cancel_requested(&self, cancel_local: &CancelLocal) {
        let requested = self
            .timed(
                "cancel_requests",
                self.store.cancel_requests(&self.instance),
                ErrorCode::HistoryUnavailable,
                "cancel requests",
            )
            .await;
        for id in requested.unwrap_or_default() {
            if cancel_local(&id) {
                tracing::info!(
                    response = %id,
                    "cancelled at the request of another gateway (found by asking the store)"
                );
            }
        }
    }

    /// Asks the gateway running `id` (another replica) to cancel it;
    /// `false` if it is not in flight.
    pub async fn request_cancel(&self, id: &str) -> Result<bool> {
        self.timed(
            "request_cancel",
            self.store.request_cancel(id),
            ErrorCode::ResponseNotFound,
            id,
        )
        .await
    }

    /// Ends, as failed with `response_orphaned`, the responses in flight
    /// whose gateway is gone; with `mine`, this instance's own too.
    async fn end_orphans(&self, mine: bool) -> Result<usize> {
        let mut ended = 0;
        loop {
            let orphans = self
                .timed(
                    "orphaned_responses",
                    self.store
                        .orphaned_responses(&self.instance, mine, LEASE, ORPHANS_PER_QUERY),
                    ErrorCode::HistoryUnavailable,
                    "orphaned responses",
                )
                .await?;
            let full = orphans.len() == ORPHANS_PER_QUERY;
            let mut progress = false;
            for orphan in orphans {
                let owner = orphan.owner.clone();
                let restarted = owner.as_deref() == Some(&*self.instance);
                let by = if restarted { "restart" } else { "lease" };
                let replaced = self
                    .timed(
                        "end_orphan",
                        self.store
                            .end_orphan(&orphaned(orphan, restarted), owner.as_deref()),
                        ErrorCode::HistoryUnavailable,
                        "orphaned response",
                    )
                    .await?;
                if replaced {
                    tracing::warn!(
                        owner = owner.as_deref().unwrap_or("(none)"),
                        by = %self.instance,
                        "a response left in flight by a gateway that stopped was ended as failed"
                    );
                    metrics::record_orphans_ended(self.backend(), by, 1);
                    ended += 1;
                    progress = true;
                }
            }
            if !full || !progress {
                return Ok(ended);
            }
        }
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
            HistoryError::Unreachable { cause, detail } => {
                tracing::warn!(
                    backend = self.backend(),
                    operation,
                    error = %detail,
                    "history store out of reach"
                );
                Error::new(
                    ErrorCode::HistoryUnavailable,
                    format!(
                        "the history store ({}) failed to {}: it is out of reach ({cause}); \
                         nothing was changed",
                        self.backend(),
                        step(operation)
                    ),
                )
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

/// `orphan` ended as failed with `response_orphaned`: its stored object
/// says so (`restarted`: found by its own gateway starting again, else by
/// a replica that saw its lease run out).
fn orphaned(mut orphan: StoredResponse, restarted: bool) -> StoredResponse {
    let why = if restarted {
        "it was found unfinished when that gateway started again"
    } else {
        "its gateway stopped renewing its lease in the history store"
    };
    let message = format!(
        "the gateway running this response stopped before it finished ({why}); \
         it was ended as failed, and nothing more was generated"
    );
    orphan.status = "failed".to_owned();
    orphan.owner = None;
    if let Value::Object(raw) = &mut orphan.raw {
        raw.insert("status".to_owned(), Value::from("failed"));
        raw.insert(
            "error".to_owned(),
            serde_json::json!({
                "code": ErrorCode::ResponseOrphaned.as_str(),
                "message": message,
            }),
        );
    }
    orphan
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
        "heartbeat" => "renew this gateway's lease",
        "orphaned_responses" => "find responses left in flight by a stopped gateway",
        "end_orphan" => "end a response left in flight by a stopped gateway",
        "request_cancel" => "record the cancel for the gateway running the response",
        "cancel_requests" => "find the cancels requested of this gateway",
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
