//! The `none` backend: nothing is kept.
//!
//! Why it exists: `--history-backend none` is for deployments that must not
//! store prompts or outputs at all. The gateway keeps calling the same trait;
//! writes succeed and are forgotten, reads find nothing. The API then
//! answers "not found" for anything it would have had to remember (a
//! `previous_response_id`, a conversation), which is the honest answer.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::{
    CancelNotices, Conversation, ConversationItem, HistoryResult, HistoryStore, ItemPage,
    PageRequest, StoredResponse,
};

/// The store that keeps nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoneStore;

#[async_trait]
impl HistoryStore for NoneStore {
    fn backend(&self) -> &'static str {
        "none"
    }

    async fn save_response(
        &self,
        _response: &StoredResponse,
        _items: &[ConversationItem],
    ) -> HistoryResult<()> {
        Ok(())
    }

    async fn get_response(&self, _id: &str) -> HistoryResult<Option<StoredResponse>> {
        Ok(None)
    }

    async fn delete_response(&self, _id: &str) -> HistoryResult<bool> {
        Ok(false)
    }

    async fn response_chain(
        &self,
        _id: &str,
        _max_steps: usize,
    ) -> HistoryResult<Vec<StoredResponse>> {
        Ok(Vec::new())
    }

    async fn create_conversation(
        &self,
        _conversation: &Conversation,
        _items: &[ConversationItem],
    ) -> HistoryResult<()> {
        Ok(())
    }

    async fn get_conversation(&self, _id: &str) -> HistoryResult<Option<Conversation>> {
        Ok(None)
    }

    async fn update_conversation(
        &self,
        _id: &str,
        _metadata: &Value,
    ) -> HistoryResult<Option<Conversation>> {
        Ok(None)
    }

    async fn delete_conversation(&self, _id: &str) -> HistoryResult<bool> {
        Ok(false)
    }

    async fn add_items(
        &self,
        _conversation_id: &str,
        _items: &[ConversationItem],
    ) -> HistoryResult<()> {
        Ok(())
    }

    async fn list_items(
        &self,
        _conversation_id: &str,
        _page: &PageRequest,
    ) -> HistoryResult<ItemPage> {
        Ok(ItemPage {
            items: Vec::new(),
            has_more: false,
        })
    }

    async fn get_item(
        &self,
        _conversation_id: &str,
        _item_id: &str,
    ) -> HistoryResult<Option<ConversationItem>> {
        Ok(None)
    }

    async fn delete_item(&self, _conversation_id: &str, _item_id: &str) -> HistoryResult<bool> {
        Ok(false)
    }

    async fn heartbeat(&self, _instance: &str) -> HistoryResult<()> {
        Ok(())
    }

    async fn orphaned_responses(
        &self,
        _instance: &str,
        _mine: bool,
        _lease: Duration,
        _limit: usize,
    ) -> HistoryResult<Vec<StoredResponse>> {
        Ok(Vec::new())
    }

    async fn end_orphan(
        &self,
        _ended: &StoredResponse,
        _owner: Option<&str>,
    ) -> HistoryResult<bool> {
        Ok(false)
    }

    async fn request_cancel(&self, _id: &str) -> HistoryResult<bool> {
        Ok(false)
    }

    async fn cancel_requests(&self, _instance: &str) -> HistoryResult<Vec<String>> {
        Ok(Vec::new())
    }

    async fn cancel_notices(&self) -> HistoryResult<Option<Box<dyn CancelNotices>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn writes_are_forgotten_and_reads_find_nothing() -> HistoryResult<()> {
        let store = NoneStore;
        let response = StoredResponse {
            id: "resp_1".into(),
            previous_response_id: None,
            conversation_id: Some("conv_1".into()),
            model: "m".into(),
            status: "completed".into(),
            created_at: 1,
            input: json!([]),
            output: json!([]),
            raw: json!({}),
            owner: None,
        };
        let conversation = Conversation {
            id: "conv_1".into(),
            created_at: 1,
            metadata: json!({}),
        };
        let item = ConversationItem {
            id: "msg_1".into(),
            conversation_id: "conv_1".into(),
            created_at: 1,
            item: json!({"id": "msg_1", "type": "message"}),
        };
        store
            .create_conversation(&conversation, std::slice::from_ref(&item))
            .await?;
        store
            .save_response(&response, std::slice::from_ref(&item))
            .await?;
        store
            .add_items("conv_missing", std::slice::from_ref(&item))
            .await?;
        assert_eq!(store.get_response("resp_1").await?, None);
        assert!(store.response_chain("resp_1", 10).await?.is_empty());
        assert_eq!(store.get_conversation("conv_1").await?, None);
        assert_eq!(
            store
                .update_conversation("conv_1", &json!({"a": "b"}))
                .await?,
            None
        );
        let page = PageRequest {
            limit: 10,
            order: crate::Order::Asc,
            after: Some("msg_1".into()),
        };
        let listed = store.list_items("conv_1", &page).await?;
        assert!(listed.items.is_empty() && !listed.has_more);
        assert_eq!(store.get_item("conv_1", "msg_1").await?, None);
        assert!(!store.delete_item("conv_1", "msg_1").await?);
        assert!(!store.delete_response("resp_1").await?);
        assert!(!store.delete_conversation("conv_1").await?);
        assert_eq!(store.backend(), "none");
        Ok(())
    }
}
