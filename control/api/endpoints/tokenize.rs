//! `/v1/tokenize` and `/v1/detokenize`: the served model's tokenizer,
//! answered by the gateway alone (no worker is involved).
//!
//! Encoding a large batch is CPU work of its own, so beyond a small size it
//! runs off the threads that drive other requests, through the same bounded
//! gate as generation requests' prompts (`crate::offload`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::super::http::{SharedState, error_response};
use super::super::types::forms::TextOrList;
use super::super::types::parse::parse_json;
use super::super::types::tokenize::{
    DetokenizeRequest, DetokenizeResponse, OneOrBatch, TokenizeRequest, TokenizeResponse,
};
use crate::error::{Error, ErrorCode, Result, excerpt};
use crate::router::Router;

/// The router serving `model` (the sole model when `None`), checked by name.
fn router_for(state: &SharedState, model: Option<&str>) -> Result<Arc<Router>> {
    let (router, served) = state.router_for(model)?;
    if let Some(asked) = served.as_deref().or(model)
        && asked != router.model().name
    {
        return Err(Error::new(
            ErrorCode::ModelNotFound,
            format!(
                "model {:?} is not served here (serving {:?})",
                excerpt(asked),
                router.model().name
            ),
        )
        .with_param("model"));
    }
    Ok(router)
}

fn answer<T: serde::Serialize>(outcome: Result<T>) -> Response {
    match outcome {
        Ok(body) => axum::Json(body).into_response(),
        Err(err) => error_response(&err),
    }
}

pub(crate) async fn tokenize(State(state): State<SharedState>, body: Bytes) -> Response {
    let outcome = async {
        let request = parse_json::<TokenizeRequest>(&body)?;
        let router = router_for(&state, request.model.as_deref())?;
        let tokenizer = router.tokenizer().clone();
        let add_special_tokens = request.add_special_tokens.unwrap_or(false);
        let max_model_len = router.model().max_context_length;
        let bytes = match &request.prompt {
            TextOrList::Text(text) => text.len(),
            TextOrList::List(texts) => texts.iter().map(String::len).sum(),
        };
        router
            .offload()
            .run_sized(bytes, move || {
                let encode = |text: &String| tokenizer.encode(text, add_special_tokens);
                Ok(match &request.prompt {
                    TextOrList::Text(text) => {
                        let ids = encode(text)?;
                        TokenizeResponse {
                            count: OneOrBatch::One(ids.len()),
                            char_count: OneOrBatch::One(text.chars().count()),
                            tokens: OneOrBatch::One(ids),
                            max_model_len,
                        }
                    }
                    TextOrList::List(texts) => {
                        let ids = texts.iter().map(encode).collect::<Result<Vec<_>>>()?;
                        TokenizeResponse {
                            count: OneOrBatch::Batch(ids.iter().map(Vec::len).collect()),
                            char_count: OneOrBatch::Batch(
                                texts.iter().map(|text| text.chars().count()).collect(),
                            ),
                            tokens: OneOrBatch::Batch(ids),
                            max_model_len,
                        }
                    }
                })
            })
            .await
    }
    .await;
    answer(outcome)
}

pub(crate) async fn detokenize(State(state): State<SharedState>, body: Bytes) -> Response {
    let outcome = async {
        let request = parse_json::<DetokenizeRequest>(&body)?;
        let router = router_for(&state, request.model.as_deref())?;
        let tokenizer = router.tokenizer().clone();
        let vocab = router.model().vocab_size;
        let skip_special_tokens = request.skip_special_tokens.unwrap_or(true);
        let lists: &[Vec<u32>] = match &request.tokens {
            OneOrBatch::One(ids) => std::slice::from_ref(ids),
            OneOrBatch::Batch(lists) => lists,
        };
        for (item, ids) in lists.iter().enumerate() {
            if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                let param = match &request.tokens {
                    OneOrBatch::One(_) => "tokens".to_owned(),
                    OneOrBatch::Batch(_) => format!("tokens[{item}]"),
                };
                return Err(Error::invalid_parameter(
                    &param,
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
        }
        // About four bytes of text per id.
        let bytes = lists.iter().map(|ids| ids.len() * 4).sum();
        router
            .offload()
            .run_sized(bytes, move || {
                let decode = |ids: &Vec<u32>| tokenizer.decode(ids, skip_special_tokens);
                Ok(DetokenizeResponse {
                    text: match &request.tokens {
                        OneOrBatch::One(ids) => OneOrBatch::One(decode(ids)?),
                        OneOrBatch::Batch(lists) => {
                            OneOrBatch::Batch(lists.iter().map(decode).collect::<Result<_>>()?)
                        }
                    },
                })
            })
            .await
    }
    .await;
    answer(outcome)
}
