//! `/v1/embeddings` (OpenAI) and `/v1/classify` (SGLang).
//!
//! Why it exists: both endpoints take a batch of inputs and answer with one
//! result per input, with no sampling and no stream, so they skip the
//! generation driver: each handler runs its batch through the model's router
//! and shapes the outputs into its dialect's response.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::super::http::SharedState;
use super::super::types::embeddings;
use super::super::types::forms::ListObject;
use super::super::types::parse::parse_json;
use crate::engine::Embedding;
use crate::error::{Error, Result};
use crate::metrics;
use crate::pipeline::Endpoint;
use crate::router::Router;

/// The router serving `model`, and the name it serves it under.
fn router_for(state: &SharedState, model: &str) -> Result<(Arc<Router>, String)> {
    let (router, served) = state.router_for(Some(model))?;
    Ok((router, served.unwrap_or_else(|| model.to_owned())))
}

/// The prompt tokens of a whole batch.
fn prompt_tokens(outputs: &[Embedding]) -> u32 {
    outputs.iter().map(|output| output.prompt_tokens).sum()
}

pub(crate) async fn embeddings(
    State(state): State<SharedState>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    let endpoint = Endpoint::Embeddings;
    let started = Instant::now();
    let mut router_label = state.default_label();
    let outcome = async {
        let request = parse_json::<embeddings::EmbeddingRequest>(&body)?;
        let inputs = request.to_inputs()?;
        let format = request.encoding_format.unwrap_or_default();
        let (router, model) = router_for(&state, &request.model)?;
        router_label = router.mode().metrics_label();
        let (_, vectors) = router.embed(endpoint, &model, inputs).await?;
        let data = vectors
            .iter()
            .enumerate()
            .map(|(index, vector)| {
                let values = match request.dimensions {
                    Some(dims) => &vector.values[..vector.values.len().min(dims as usize)],
                    None => &vector.values[..],
                };
                embeddings::EmbeddingData {
                    object: embeddings::EmbeddingObject,
                    index: index as u32,
                    embedding: embeddings::EmbeddingVector::encode(values, format),
                }
            })
            .collect();
        Ok::<_, Error>(embeddings::EmbeddingResponse {
            object: ListObject,
            data,
            model: request.model,
            usage: embeddings::InputUsage::new(prompt_tokens(&vectors)),
        })
    }
    .await;
    match outcome {
        Ok(response) => {
            metrics::record_request(
                router_label,
                endpoint.label(),
                &response.model,
                started.elapsed(),
            );
            axum::Json(response).into_response()
        }
        Err(err) => {
            metrics::record_error(router_label, endpoint.label(), err.code.as_str());
            err.into_response()
        }
    }
}

/// Class probabilities from the worker's output logits (softmax); labels are
/// `LABEL_<id>`, Hugging Face's names when a model has no `id2label`.
fn classify_logits(index: u32, logits: &[f32]) -> embeddings::Classification {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|v| (v - max).exp()).collect();
    let total: f32 = exps.iter().sum::<f32>().max(f32::MIN_POSITIVE);
    let probs: Vec<f32> = exps.iter().map(|v| v / total).collect();
    let best = probs
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(id, _)| id);
    embeddings::Classification {
        index,
        label: format!("LABEL_{best}"),
        probs,
    }
}

/// Unlike `/v1/embeddings`, classification records no request or error
/// metrics.
pub(crate) async fn classify(
    State(state): State<SharedState>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    let outcome = async {
        let request = parse_json::<embeddings::ClassifyRequest>(&body)?;
        let inputs = request.to_inputs()?;
        let (router, model) = router_for(&state, &request.model)?;
        let (id, outputs) = router.embed(Endpoint::Classify, &model, inputs).await?;
        Ok::<_, Error>(embeddings::ClassifyResponse {
            id,
            object: ListObject,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: request.model,
            data: outputs
                .iter()
                .enumerate()
                .map(|(index, output)| classify_logits(index as u32, &output.values))
                .collect(),
            usage: embeddings::InputUsage::new(prompt_tokens(&outputs)),
        })
    }
    .await;
    match outcome {
        Ok(response) => axum::Json(response).into_response(),
        Err(err) => err.into_response(),
    }
}
