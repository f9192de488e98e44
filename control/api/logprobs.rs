//! Rendering engine logprobs in OpenAI's two shapes: chat's per-token
//! objects (token, logprob, bytes, alternatives) and completions' legacy
//! columns (tokens, token_logprobs, top_logprobs, text_offset).
//!
//! Engines report token ids; the text of each comes from the token's exact
//! bytes ([`Tokenizer::token_bytes`]), so a token that is half a character
//! shows as U+FFFD in `token` while `bytes` stays exact, as OpenAI does.

use super::types::openai;
use crate::engine::LogProbs;
use crate::tokenizer::Tokenizer;

fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat logprobs for the tokens of one or more engine reports, in order.
pub(super) fn chat<'a>(
    tokenizer: &Tokenizer,
    reports: impl IntoIterator<Item = &'a LogProbs>,
) -> openai::ChatLogprobs {
    let mut content = Vec::new();
    for report in reports {
        for (position, (&id, &logprob)) in report
            .token_ids
            .iter()
            .zip(&report.token_logprobs)
            .enumerate()
        {
            let (token, bytes) = token_text(tokenizer, id);
            let top_logprobs = report
                .top
                .get(position)
                .map(|alternatives| {
                    alternatives
                        .iter()
                        .map(|&(logprob, id)| {
                            let (token, bytes) = token_text(tokenizer, id);
                            openai::TopLogprob {
                                token,
                                logprob,
                                bytes: Some(bytes),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            content.push(openai::ChatTokenLogprob {
                token,
                logprob,
                bytes: Some(bytes),
                top_logprobs,
            });
        }
    }
    openai::ChatLogprobs { content }
}

/// Completion logprobs for the tokens of one or more engine reports;
/// `text_offset` counts characters from `offset`, which is advanced past
/// the tokens (so a stream's chunks continue where the last one ended).
pub(super) fn completion<'a>(
    tokenizer: &Tokenizer,
    reports: impl IntoIterator<Item = &'a LogProbs>,
    offset: &mut u32,
) -> openai::CompletionLogprobs {
    let mut columns = openai::CompletionLogprobs {
        tokens: Vec::new(),
        token_logprobs: Vec::new(),
        top_logprobs: Vec::new(),
        text_offset: Vec::new(),
    };
    for report in reports {
        for (position, (&id, &logprob)) in report
            .token_ids
            .iter()
            .zip(&report.token_logprobs)
            .enumerate()
        {
            let (token, _) = token_text(tokenizer, id);
            columns.text_offset.push(*offset);
            *offset += token.chars().count() as u32;
            columns.tokens.push(token);
            columns.token_logprobs.push(Some(logprob));
            let ranked = report
                .top
                .get(position)
                .filter(|top| !top.is_empty())
                .map(|top| {
                    openai::RankedLogprobs(
                        top.iter()
                            .map(|&(logprob, id)| (token_text(tokenizer, id).0, logprob))
                            .collect(),
                    )
                });
            columns.top_logprobs.push(ranked);
        }
    }
    columns
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        Tokenizer::from_model_dir(&dir).unwrap()
    }

    fn report() -> LogProbs {
        // "Hello world" is [39, 415, 78, 1009] in the fixture.
        LogProbs {
            token_logprobs: vec![-0.25, -1.5],
            token_ids: vec![39, 415],
            top: vec![vec![(-0.25, 39), (-2.0, 415)], vec![(-1.5, 415)]],
        }
    }

    #[test]
    fn chat_lists_each_token_with_bytes_and_alternatives() {
        let tokenizer = tokenizer();
        let text = tokenizer.decode(&[39, 415], false).unwrap();
        let rendered = chat(&tokenizer, [&report()]);
        assert_eq!(rendered.content.len(), 2);
        let joined: String = rendered.content.iter().map(|t| t.token.as_str()).collect();
        assert_eq!(joined, text);
        assert_eq!(rendered.content[0].logprob, -0.25);
        assert_eq!(rendered.content[1].logprob, -1.5);
        assert_eq!(
            rendered.content[0].bytes.as_deref(),
            Some(rendered.content[0].token.as_bytes())
        );
        let alternatives: Vec<f32> = rendered.content[0]
            .top_logprobs
            .iter()
            .map(|t| t.logprob)
            .collect();
        assert_eq!(alternatives, [-0.25, -2.0]);
        assert_eq!(
            rendered.content[0].top_logprobs[1].token,
            rendered.content[1].token
        );
    }

    #[test]
    fn completion_columns_continue_offsets_across_chunks() {
        let tokenizer = tokenizer();
        let first = tokenizer.decode(&[39], false).unwrap();
        let mut offset = 0;
        let rendered = completion(&tokenizer, [&report()], &mut offset);
        assert_eq!(rendered.tokens.len(), 2);
        assert_eq!(rendered.text_offset, [0, first.chars().count() as u32]);
        assert_eq!(rendered.token_logprobs, [Some(-0.25), Some(-1.5)]);
        let json = serde_json::to_value(&rendered.top_logprobs).unwrap();
        // Ranked objects keep the engine's order.
        let keys: Vec<&String> = json[0].as_object().unwrap().keys().collect();
        assert_eq!(keys, [&rendered.tokens[0], &rendered.tokens[1]]);
        let before = offset;
        let again = completion(&tokenizer, [&report()], &mut offset);
        assert_eq!(again.text_offset[0], before);
    }
}
