//! [`EngineClient`]: one client for TokenSpeed and SGLang workers.
//! (Interface placeholder; the implementation lands with the engine-client work.)

use std::pin::Pin;

use futures::Stream;

use super::{
    Embedding, GenerateEvent, GenerateRequest, Load, MediaItem, ModelInfo, Runtime, ServerInfo,
};
use crate::error::{Error, Result};

/// The events of one Generate call.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<GenerateEvent>> + Send + 'static>>;

/// A gRPC client of one engine worker.
#[derive(Debug, Clone)]
pub struct EngineClient {
    url: String,
    runtime: Runtime,
}

fn pending() -> Error {
    Error::internal("engine client not built yet")
}

impl EngineClient {
    pub fn new(url: &str, runtime: Runtime) -> Result<Self> {
        Ok(Self {
            url: url.to_owned(),
            runtime,
        })
    }
    pub async fn detect(url: &str) -> Result<Self> {
        Self::new(url, Runtime::TokenSpeed)
    }
    pub fn runtime(&self) -> Runtime {
        self.runtime
    }
    pub fn url(&self) -> &str {
        &self.url
    }
    pub async fn generate(&self, _request: GenerateRequest) -> Result<EventStream> {
        Err(pending())
    }
    pub async fn encode(&self, _request_id: &str, _item: &MediaItem, _room: i64) -> Result<bool> {
        Err(pending())
    }
    pub async fn abort(&self, _request_id: &str, _reason: &str) -> Result<bool> {
        Err(pending())
    }
    pub async fn health_check(&self) -> Result<bool> {
        Err(pending())
    }
    pub async fn model_info(&self) -> Result<ModelInfo> {
        Err(pending())
    }
    pub async fn server_info(&self) -> Result<ServerInfo> {
        Err(pending())
    }
    pub async fn loads(&self) -> Result<Load> {
        Err(pending())
    }
    pub async fn tokenizer_archive(&self) -> Result<Vec<u8>> {
        Err(pending())
    }
    pub async fn embed(&self, _request_id: &str, _input_ids: Vec<u32>) -> Result<Embedding> {
        Err(pending())
    }
}
