//! The `memory` backend: everything in process, lost on restart.
//!
//! Why it exists: a gateway run without a database (tests, demos, a single
//! replica that may forget) still gets the whole Responses and conversations
//! API, with the same behaviour as the SQL backends: it passes the same
//! contract tests. One mutex guards all maps, so every method is atomic, as
//! the trait promises; every method checks before it writes, so a failure
//! leaves the maps as they were.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;

use crate::{
    CancelNotices, Conversation, ConversationItem, HistoryError, HistoryResult, HistoryStore,
    ItemPage, Order, PageRequest, StoredResponse,
};

/// The in-process store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    responses: HashMap<String, StoredResponse>,
    conversations: HashMap<String, Conversation>,
    /// Each conversation's items in the order they were added.
    items: HashMap<String, Vec<ConversationItem>>,
    /// Item id → its conversation: item ids are unique in the whole store.
    item_owner: HashMap<String, String>,
    /// Gateway instance → its last heartbeat.
    heartbeats: HashMap<String, Instant>,
    /// Responses whose cancel was requested (kept across their upserts,
    /// as the SQL backends keep the column).
    cancel_requested: HashSet<String>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Inner {
    /// Checks that `items` can be appended (each conversation exists, no id
    /// is taken, no id repeats), before anything is written.
    fn check_append<'a>(
        &self,
        items: impl Iterator<Item = (&'a str, &'a ConversationItem)>,
    ) -> HistoryResult<()> {
        let mut seen = std::collections::HashSet::new();
        for (conversation_id, item) in items {
            if !self.conversations.contains_key(conversation_id) {
                return Err(HistoryError::NotFound(format!(
                    "conversation {conversation_id}"
                )));
            }
            if self.item_owner.contains_key(&item.id) || !seen.insert(item.id.as_str()) {
                return Err(HistoryError::Conflict(format!("item {}", item.id)));
            }
        }
        Ok(())
    }

    fn append(&mut self, conversation_id: &str, item: &ConversationItem) {
        let item = ConversationItem {
            conversation_id: conversation_id.to_owned(),
            ..item.clone()
        };
        self.item_owner
            .insert(item.id.clone(), conversation_id.to_owned());
        self.items
            .entry(conversation_id.to_owned())
            .or_default()
            .push(item);
    }
}

#[async_trait]
impl HistoryStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn save_response(
        &self,
        response: &StoredResponse,
        items: &[ConversationItem],
    ) -> HistoryResult<()> {
        let mut inner = self.inner.lock();
        inner.check_append(items.iter().map(|i| (i.conversation_id.as_str(), i)))?;
        for item in items {
            inner.append(&item.conversation_id, item);
        }
        inner
            .responses
            .insert(response.id.clone(), response.clone());
        Ok(())
    }

    async fn get_response(&self, id: &str) -> HistoryResult<Option<StoredResponse>> {
        Ok(self.inner.lock().responses.get(id).cloned())
    }

    async fn delete_response(&self, id: &str) -> HistoryResult<bool> {
        let mut inner = self.inner.lock();
        inner.cancel_requested.remove(id);
        Ok(inner.responses.remove(id).is_some())
    }

    async fn response_chain(
        &self,
        id: &str,
        max_steps: usize,
    ) -> HistoryResult<Vec<StoredResponse>> {
        let inner = self.inner.lock();
        let mut chain = Vec::new();
        let mut next = Some(id);
        while chain.len() < max_steps {
            let Some(response) = next.and_then(|id| inner.responses.get(id)) else {
                break;
            };
            chain.push(response.clone());
            next = response.previous_response_id.as_deref();
        }
        chain.reverse();
        Ok(chain)
    }

    async fn create_conversation(
        &self,
        conversation: &Conversation,
        items: &[ConversationItem],
    ) -> HistoryResult<()> {
        let mut inner = self.inner.lock();
        if inner.conversations.contains_key(&conversation.id) {
            return Err(HistoryError::Conflict(format!(
                "conversation {}",
                conversation.id
            )));
        }
        // Checked as if the conversation existed already.
        let mut seen = std::collections::HashSet::new();
        for item in items {
            if inner.item_owner.contains_key(&item.id) || !seen.insert(item.id.as_str()) {
                return Err(HistoryError::Conflict(format!("item {}", item.id)));
            }
        }
        inner
            .conversations
            .insert(conversation.id.clone(), conversation.clone());
        for item in items {
            inner.append(&conversation.id, item);
        }
        Ok(())
    }

    async fn get_conversation(&self, id: &str) -> HistoryResult<Option<Conversation>> {
        Ok(self.inner.lock().conversations.get(id).cloned())
    }

    async fn update_conversation(
        &self,
        id: &str,
        metadata: &Value,
    ) -> HistoryResult<Option<Conversation>> {
        let mut inner = self.inner.lock();
        Ok(inner.conversations.get_mut(id).map(|conversation| {
            conversation.metadata = metadata.clone();
            conversation.clone()
        }))
    }

    async fn delete_conversation(&self, id: &str) -> HistoryResult<bool> {
        let mut inner = self.inner.lock();
        if inner.conversations.remove(id).is_none() {
            return Ok(false);
        }
        for item in inner.items.remove(id).unwrap_or_default() {
            inner.item_owner.remove(&item.id);
        }
        Ok(true)
    }

    async fn add_items(
        &self,
        conversation_id: &str,
        items: &[ConversationItem],
    ) -> HistoryResult<()> {
        let mut inner = self.inner.lock();
        if !inner.conversations.contains_key(conversation_id) {
            return Err(HistoryError::NotFound(format!(
                "conversation {conversation_id}"
            )));
        }
        inner.check_append(items.iter().map(|i| (conversation_id, i)))?;
        for item in items {
            inner.append(conversation_id, item);
        }
        Ok(())
    }

    async fn list_items(
        &self,
        conversation_id: &str,
        page: &PageRequest,
    ) -> HistoryResult<ItemPage> {
        let inner = self.inner.lock();
        let all = inner
            .items
            .get(conversation_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let ordered: Box<dyn Iterator<Item = &ConversationItem>> = match page.order {
            Order::Asc => Box::new(all.iter()),
            Order::Desc => Box::new(all.iter().rev()),
        };
        let mut rest = ordered.peekable();
        if let Some(after) = &page.after {
            if !all.iter().any(|item| &item.id == after) {
                return Err(HistoryError::NotFound(format!(
                    "item {after} in conversation {conversation_id}"
                )));
            }
            for item in rest.by_ref() {
                if &item.id == after {
                    break;
                }
            }
        }
        let items: Vec<ConversationItem> = rest.by_ref().take(page.limit).cloned().collect();
        let has_more = rest.peek().is_some();
        Ok(ItemPage { items, has_more })
    }

    async fn get_item(
        &self,
        conversation_id: &str,
        item_id: &str,
    ) -> HistoryResult<Option<ConversationItem>> {
        let inner = self.inner.lock();
        Ok(inner
            .items
            .get(conversation_id)
            .and_then(|items| items.iter().find(|item| item.id == item_id))
            .cloned())
    }

    async fn delete_item(&self, conversation_id: &str, item_id: &str) -> HistoryResult<bool> {
        let mut inner = self.inner.lock();
        let Some(items) = inner.items.get_mut(conversation_id) else {
            return Ok(false);
        };
        let Some(at) = items.iter().position(|item| item.id == item_id) else {
            return Ok(false);
        };
        items.remove(at);
        inner.item_owner.remove(item_id);
        Ok(true)
    }

    async fn heartbeat(&self, instance: &str) -> HistoryResult<()> {
        self.inner
            .lock()
            .heartbeats
            .insert(instance.to_owned(), Instant::now());
        Ok(())
    }

    async fn orphaned_responses(
        &self,
        instance: &str,
        mine: bool,
        lease: Duration,
        limit: usize,
    ) -> HistoryResult<Vec<StoredResponse>> {
        let inner = self.inner.lock();
        let live = |owner: &str| {
            inner
                .heartbeats
                .get(owner)
                .is_some_and(|beat| beat.elapsed() < lease)
        };
        let mut orphans: Vec<StoredResponse> = inner
            .responses
            .values()
            .filter(|response| crate::in_flight(&response.status))
            .filter(|response| match response.owner.as_deref() {
                None => true,
                Some(owner) if owner == instance => mine,
                Some(owner) => !live(owner),
            })
            .cloned()
            .collect();
        orphans.sort_by(|a, b| a.id.cmp(&b.id));
        orphans.truncate(limit);
        Ok(orphans)
    }

    async fn end_orphan(&self, ended: &StoredResponse, owner: Option<&str>) -> HistoryResult<bool> {
        let mut inner = self.inner.lock();
        let Some(stored) = inner.responses.get_mut(&ended.id) else {
            return Ok(false);
        };
        if !crate::in_flight(&stored.status) || stored.owner.as_deref() != owner {
            return Ok(false);
        }
        *stored = ended.clone();
        Ok(true)
    }

    async fn request_cancel(&self, id: &str) -> HistoryResult<bool> {
        let mut inner = self.inner.lock();
        let running = inner
            .responses
            .get(id)
            .is_some_and(|response| crate::in_flight(&response.status));
        if running {
            inner.cancel_requested.insert(id.to_owned());
        }
        Ok(running)
    }

    async fn cancel_requests(&self, instance: &str) -> HistoryResult<Vec<String>> {
        let inner = self.inner.lock();
        let mut ids: Vec<String> = inner
            .cancel_requested
            .iter()
            .filter(|id| {
                inner.responses.get(*id).is_some_and(|response| {
                    crate::in_flight(&response.status)
                        && response.owner.as_deref() == Some(instance)
                })
            })
            .cloned()
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// One process: the gateway that gets a cancel runs the response
    /// itself (its own registry finds it), so there is nothing to push.
    async fn cancel_notices(&self) -> HistoryResult<Option<Box<dyn CancelNotices>>> {
        Ok(None)
    }
}
