//! Arbitrary request bodies through each dialect's body parser, as the
//! endpoints run them: `parse_json` into the dialect's request type (with
//! its error path, the depth walk that names the offending field), then the
//! dialect's own checks (`to_spec`, `to_inputs`, `parse_input`). The first
//! byte picks the dialect; the rest is the body. Errors are expected; a
//! panic or a stack overflow (deep nesting) is a bug.

use smg::api::types::parse::parse_json;
use smg::api::types::validate::Limits;
use smg::api::types::{anthropic, embeddings, openai, responses, sglang, tokenize};
use smg::error::Result;
use smg::workers::WorkerSpec;

const LIMITS: Limits = Limits {
    max_output_tokens: Some(4096),
};

/// Runs one body through one dialect; the outcome only has to be reached.
fn run_dialect(dialect: u8, body: &[u8]) -> Result<()> {
    match dialect % 10 {
        0 => parse_json::<openai::ChatCompletionRequest>(body)?
            .to_spec(&LIMITS)
            .map(drop),
        1 => parse_json::<openai::CompletionRequest>(body)?
            .to_spec(&LIMITS)
            .map(drop),
        2 => parse_json::<embeddings::EmbeddingRequest>(body)?
            .to_inputs()
            .map(drop),
        3 => parse_json::<embeddings::ClassifyRequest>(body)?
            .to_inputs()
            .map(drop),
        4 => {
            let request = parse_json::<responses::ResponsesRequest>(body)?;
            responses::parse_input(request.input.as_ref()).map(drop)
        }
        5 => parse_json::<anthropic::MessagesRequest>(body)?
            .to_spec(&LIMITS)
            .map(drop),
        6 => parse_json::<sglang::GenerateRequest>(body)?
            .to_spec(&LIMITS)
            .map(drop),
        7 => {
            let spec = parse_json::<WorkerSpec>(body)?;
            smg::engine::check_worker_url(&spec.url)
        }
        8 => parse_json::<tokenize::TokenizeRequest>(body).map(drop),
        _ => parse_json::<tokenize::DetokenizeRequest>(body).map(drop),
    }
}

/// One input, as the fuzz target runs it.
pub fn run(data: &[u8]) {
    let Some((&dialect, body)) = data.split_first() else {
        return;
    };
    if let Err(error) = run_dialect(dialect, body) {
        // Every refusal must render as the client would see it.
        let _ = error.to_string();
    }
}
