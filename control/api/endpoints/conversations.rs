//! OpenAI's Conversations API: `/v1/conversations` and their items.
//!
//! Why it exists: a conversation is the other way (besides
//! `previous_response_id`) to give a response its history: the client
//! creates one, adds items to it directly or by naming it in
//! `/v1/responses` (whose input and output are then appended), and reads
//! or trims it here. Everything is storage: no generation runs, so these
//! routes are not admitted like inference.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use smg_history::{Conversation, ConversationItem};

use super::super::auth::Tenant;
use super::super::dialect::{ErrorDialect, render};
use super::super::http::SharedState;
use super::super::types::parse::parse_json;
use super::super::types::responses::{Item, ids};
use super::responses::{ListQuery, list_page, now_unix, owner};
use crate::error::{Error, ErrorCode, Result, excerpt};

/// The most items one create or add request may carry (as OpenAI).
const MAX_ITEMS_PER_REQUEST: usize = 20;
/// The most metadata keys (as OpenAI).
const MAX_METADATA_KEYS: usize = 16;

#[derive(Debug, Deserialize)]
struct CreateRequest {
    #[serde(default)]
    items: Option<Vec<Value>>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    metadata: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct AddItemsRequest {
    items: Vec<Value>,
}

fn answer(result: Result<Value>) -> Response {
    match result {
        Ok(body) => (StatusCode::OK, Json(body)).into_response(),
        Err(err) => render(&err, ErrorDialect::OpenAi),
    }
}

fn conversation_json(conversation: &Conversation) -> Value {
    json!({
        "id": conversation.id,
        "object": "conversation",
        "created_at": conversation.created_at,
        "metadata": conversation.metadata,
    })
}

/// Refuses a conversation id the caller's tenant did not create (as if it
/// did not exist).
fn owns(id: &str, tenant: Option<&Extension<Tenant>>) -> Result<()> {
    if ids::owned_by(id, &owner(tenant)) {
        Ok(())
    } else {
        Err(not_found(id))
    }
}

/// The caller's conversation `id`, or `conversation_not_found`.
async fn owned_conversation(
    state: &SharedState,
    id: &str,
    tenant: Option<&Extension<Tenant>>,
) -> Result<Conversation> {
    owns(id, tenant)?;
    state
        .history
        .get_conversation(id)
        .await?
        .ok_or_else(|| not_found(id))
}

fn not_found(id: &str) -> Error {
    Error::new(
        ErrorCode::ConversationNotFound,
        format!("conversation {} does not exist", excerpt(id)),
    )
}

fn check_metadata(metadata: &Map<String, Value>) -> Result<()> {
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(Error::invalid_parameter(
            "metadata",
            format!("at most {MAX_METADATA_KEYS} keys"),
        ));
    }
    for (key, value) in metadata {
        if !value.is_string() {
            return Err(Error::invalid_parameter(
                &format!("metadata.{}", excerpt(key)),
                "metadata values are strings",
            ));
        }
    }
    Ok(())
}

/// Client items, checked as Responses input items, ready to store.
fn new_items(conversation_id: &str, items: &[Value]) -> Result<Vec<ConversationItem>> {
    if items.len() > MAX_ITEMS_PER_REQUEST {
        return Err(Error::invalid_parameter(
            "items",
            format!("at most {MAX_ITEMS_PER_REQUEST} items per request"),
        ));
    }
    let created_at = now_unix();
    items
        .iter()
        .enumerate()
        .map(|(index, value)| {
            let item = Item::from_input(value, &format!("items[{index}]"))?;
            Ok(ConversationItem {
                id: item.id().to_owned(),
                conversation_id: conversation_id.to_owned(),
                created_at,
                item: item.to_value(),
            })
        })
        .collect()
}

/// `POST /v1/conversations`.
pub(crate) async fn create_conversation(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    body: Bytes,
) -> Response {
    answer(
        async {
            state.history.require("the conversations API")?;
            // An empty body creates an empty conversation.
            let request: CreateRequest = if body.iter().all(u8::is_ascii_whitespace) {
                CreateRequest {
                    items: None,
                    metadata: None,
                }
            } else {
                parse_json(&body)?
            };
            let metadata = request.metadata.unwrap_or_default();
            check_metadata(&metadata)?;
            let conversation = Conversation {
                id: ids::mint_owned(ids::CONVERSATION, &owner(tenant.as_ref())),
                created_at: now_unix(),
                metadata: Value::Object(metadata),
            };
            let items = new_items(
                &conversation.id,
                request.items.as_deref().unwrap_or_default(),
            )?;
            state
                .history
                .create_conversation(&conversation, &items)
                .await?;
            Ok(conversation_json(&conversation))
        }
        .await,
    )
}

/// `GET /v1/conversations/{id}`.
pub(crate) async fn get_conversation(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Response {
    answer(
        async {
            let conversation = owned_conversation(&state, &id, tenant.as_ref()).await?;
            Ok(conversation_json(&conversation))
        }
        .await,
    )
}

/// `POST /v1/conversations/{id}`: replaces its metadata.
pub(crate) async fn update_conversation(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    answer(
        async {
            owns(&id, tenant.as_ref())?;
            let request: UpdateRequest = parse_json(&body)?;
            check_metadata(&request.metadata)?;
            let conversation = state
                .history
                .update_conversation(&id, &Value::Object(request.metadata))
                .await?
                .ok_or_else(|| not_found(&id))?;
            Ok(conversation_json(&conversation))
        }
        .await,
    )
}

/// `DELETE /v1/conversations/{id}`: the conversation and its items.
pub(crate) async fn delete_conversation(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Response {
    answer(
        async {
            owns(&id, tenant.as_ref())?;
            if !state.history.delete_conversation(&id).await? {
                return Err(not_found(&id));
            }
            Ok(json!({"id": id, "object": "conversation.deleted", "deleted": true}))
        }
        .await,
    )
}

/// `GET /v1/conversations/{id}/items?limit&order&after`.
pub(crate) async fn list_conversation_items(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
    Query(query): Query<ListQuery>,
) -> Response {
    answer(
        async {
            let page = query.page()?;
            owned_conversation(&state, &id, tenant.as_ref()).await?;
            let listed =
                state
                    .history
                    .list_items(&id, &page)
                    .await
                    .map_err(|err| match err.code {
                        ErrorCode::ItemNotFound => err.with_param("after"),
                        _ => err,
                    })?;
            let data = listed.items.into_iter().map(|item| item.item).collect();
            Ok(list_page(data, listed.has_more))
        }
        .await,
    )
}

/// `POST /v1/conversations/{id}/items`: appends items, in order.
pub(crate) async fn add_conversation_items(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    answer(
        async {
            owns(&id, tenant.as_ref())?;
            let request: AddItemsRequest = parse_json(&body)?;
            let items = new_items(&id, &request.items)?;
            state.history.add_items(&id, &items).await?;
            let data = items.into_iter().map(|item| item.item).collect();
            Ok(list_page(data, false))
        }
        .await,
    )
}

/// `GET /v1/conversations/{id}/items/{item_id}`.
pub(crate) async fn get_conversation_item(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path((id, item_id)): Path<(String, String)>,
) -> Response {
    answer(
        async {
            owns(&id, tenant.as_ref())?;
            let item = state
                .history
                .get_item(&id, &item_id)
                .await?
                .ok_or_else(|| {
                    Error::new(
                        ErrorCode::ItemNotFound,
                        format!(
                            "conversation {} has no item {}",
                            excerpt(&id),
                            excerpt(&item_id)
                        ),
                    )
                })?;
            Ok(item.item)
        }
        .await,
    )
}

/// `DELETE /v1/conversations/{id}/items/{item_id}`: answers with the
/// conversation, as OpenAI does.
pub(crate) async fn delete_conversation_item(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path((id, item_id)): Path<(String, String)>,
) -> Response {
    answer(
        async {
            let conversation = owned_conversation(&state, &id, tenant.as_ref()).await?;
            if !state.history.delete_item(&id, &item_id).await? {
                return Err(Error::new(
                    ErrorCode::ItemNotFound,
                    format!(
                        "conversation {} has no item {}",
                        excerpt(&id),
                        excerpt(&item_id)
                    ),
                ));
            }
            Ok(conversation_json(&conversation))
        }
        .await,
    )
}
