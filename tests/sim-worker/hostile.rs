//! Hostile mode: the sim worker misbehaving the way a buggy or compromised
//! engine could, so the gateway's distrust of worker output is tested end
//! to end (`tests/hostile_worker.rs`).
//!
//! Each misbehaviour is one `--hostile NAME[=VALUE]` flag (repeatable). They
//! break the protocol's promises, not its encoding: every message is still
//! valid protobuf, only its counts and sizes are wrong, which is what a
//! gateway must check itself.

use std::path::PathBuf;

/// One way to misbehave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misbehaviour {
    /// `overrun-tokens=N`: every sequence generates N tokens, whatever
    /// `max_new_tokens`, EOS or stop ids say.
    OverrunTokens(u32),
    /// `logprobs=N`: N top-logprob alternatives per token whenever logprobs
    /// are asked for, whatever `top_logprobs_num` says.
    LogprobAlternatives(u32),
    /// `short-logprobs`: per-token logprob values one shorter than the
    /// tokens they describe.
    ShortLogprobs,
    /// `sequence-index=N`: sequence `i` is reported as `N + i`.
    SequenceIndex(u32),
    /// `dp-ranks=N`: GetLoads reports N data-parallel ranks.
    DpRanks(i32),
    /// `archive-bytes=N`: GetTokenizer streams an archive of N zero bytes
    /// (with a correct sha256), and GetModelInfo advertises no tokenizer
    /// path, so a gateway must download it.
    ArchiveBytes(u64),
    /// `tokenizer-path=DIR`: GetModelInfo advertises DIR as the tokenizer
    /// path (a directory holding a FIFO, a device, a link out).
    TokenizerPath(PathBuf),
    /// `embedding-dim=N`: Embed answers N dimensions.
    EmbeddingDim(u32),
    /// `control-bytes=N`: the GetModelInfo, GetServerInfo, GetLoads and
    /// HealthCheck answers each carry N more bytes (in a version or
    /// message string the gateway only logs).
    ControlBytes(u64),
    /// `archive-chunk-bytes=N`: GetTokenizer sends chunks of N bytes (not
    /// 64 KiB).
    ArchiveChunkBytes(u64),
    /// `reject=TEXT`: every Generate call is refused as INVALID_ARGUMENT
    /// with TEXT as the message (whatever `only-for` says): a worker's
    /// own words, which may name its files and its peers' addresses.
    Reject(String),
    /// `only-for=TEXT`: generation misbehaves only for prompts containing
    /// TEXT, so one worker serves an attacker and well-behaved clients
    /// side by side (`benches/attacks.rs`).
    OnlyFor(String),
}

impl Misbehaviour {
    /// Parses one `--hostile` value.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (text, None),
        };
        let number = |what: &str| -> Result<u64, String> {
            value
                .ok_or_else(|| format!("{name} needs ={what}"))?
                .parse()
                .map_err(|err| format!("{name}: {err}"))
        };
        let narrow = |wide: u64| u32::try_from(wide).map_err(|_| format!("{name}: too large"));
        Ok(match name {
            "overrun-tokens" => Misbehaviour::OverrunTokens(narrow(number("N")?)?),
            "logprobs" => Misbehaviour::LogprobAlternatives(narrow(number("N")?)?),
            "short-logprobs" => Misbehaviour::ShortLogprobs,
            "sequence-index" => Misbehaviour::SequenceIndex(narrow(number("N")?)?),
            "dp-ranks" => Misbehaviour::DpRanks(
                i32::try_from(number("N")?).map_err(|_| format!("{name}: too large"))?,
            ),
            "archive-bytes" => Misbehaviour::ArchiveBytes(number("N")?),
            "tokenizer-path" => Misbehaviour::TokenizerPath(PathBuf::from(
                value.ok_or_else(|| format!("{name} needs =DIR"))?,
            )),
            "embedding-dim" => Misbehaviour::EmbeddingDim(narrow(number("N")?)?),
            "control-bytes" => Misbehaviour::ControlBytes(number("N")?),
            "archive-chunk-bytes" => Misbehaviour::ArchiveChunkBytes(number("N")?),
            "reject" => Misbehaviour::Reject(
                value
                    .ok_or_else(|| format!("{name} needs =TEXT"))?
                    .to_owned(),
            ),
            "only-for" => Misbehaviour::OnlyFor(
                value
                    .ok_or_else(|| format!("{name} needs =TEXT"))?
                    .to_owned(),
            ),
            _ => {
                return Err(format!(
                    "unknown misbehaviour {name:?}: overrun-tokens=N, logprobs=N, \
                     short-logprobs, sequence-index=N, dp-ranks=N, archive-bytes=N, \
                     tokenizer-path=DIR, embedding-dim=N, control-bytes=N, \
                     archive-chunk-bytes=N, reject=TEXT, only-for=TEXT"
                ));
            }
        })
    }
}

/// Every misbehaviour asked for, folded for the services to read.
#[derive(Debug, Clone, Default)]
pub struct Hostility {
    pub overrun_tokens: Option<u32>,
    pub logprob_alternatives: Option<u32>,
    pub short_logprobs: bool,
    pub sequence_index: u32,
    pub dp_ranks: Option<i32>,
    pub archive_bytes: Option<u64>,
    pub tokenizer_path: Option<PathBuf>,
    pub embedding_dim: Option<u32>,
    pub control_bytes: Option<u64>,
    pub archive_chunk_bytes: Option<u64>,
    pub reject: Option<String>,
    pub only_for: Option<String>,
}

impl Hostility {
    pub fn new(misbehaviours: &[Misbehaviour]) -> Self {
        let mut hostility = Self::default();
        for misbehaviour in misbehaviours {
            match misbehaviour.clone() {
                Misbehaviour::OverrunTokens(n) => hostility.overrun_tokens = Some(n),
                Misbehaviour::LogprobAlternatives(n) => hostility.logprob_alternatives = Some(n),
                Misbehaviour::ShortLogprobs => hostility.short_logprobs = true,
                Misbehaviour::SequenceIndex(n) => hostility.sequence_index = n,
                Misbehaviour::DpRanks(n) => hostility.dp_ranks = Some(n),
                Misbehaviour::ArchiveBytes(n) => hostility.archive_bytes = Some(n),
                Misbehaviour::TokenizerPath(dir) => hostility.tokenizer_path = Some(dir),
                Misbehaviour::EmbeddingDim(n) => hostility.embedding_dim = Some(n),
                Misbehaviour::ControlBytes(n) => hostility.control_bytes = Some(n),
                Misbehaviour::ArchiveChunkBytes(n) => hostility.archive_chunk_bytes = Some(n),
                Misbehaviour::Reject(text) => hostility.reject = Some(text),
                Misbehaviour::OnlyFor(text) => hostility.only_for = Some(text),
            }
        }
        hostility
    }

    /// `text` as a control answer carries it: padded by `control-bytes`.
    pub fn padded(&self, text: String) -> String {
        match self.control_bytes {
            Some(n) => text + &"x".repeat(usize::try_from(n).unwrap_or(usize::MAX)),
            None => text,
        }
    }

    /// The tokenizer path GetModelInfo advertises, given the real one.
    pub fn advertised_tokenizer_path(&self, real: String) -> String {
        match (&self.tokenizer_path, self.archive_bytes) {
            (Some(dir), _) => dir.display().to_string(),
            (None, Some(_)) => String::new(),
            (None, None) => real,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misbehaviours_parse_from_their_flag_values() {
        let cases = [
            ("overrun-tokens=7", Misbehaviour::OverrunTokens(7)),
            (
                "logprobs=100000",
                Misbehaviour::LogprobAlternatives(100_000),
            ),
            ("short-logprobs", Misbehaviour::ShortLogprobs),
            ("sequence-index=3", Misbehaviour::SequenceIndex(3)),
            ("dp-ranks=50000", Misbehaviour::DpRanks(50_000)),
            ("archive-bytes=1024", Misbehaviour::ArchiveBytes(1024)),
            (
                "tokenizer-path=/tmp/x",
                Misbehaviour::TokenizerPath(PathBuf::from("/tmp/x")),
            ),
            ("embedding-dim=9", Misbehaviour::EmbeddingDim(9)),
            ("control-bytes=16", Misbehaviour::ControlBytes(16)),
            (
                "archive-chunk-bytes=1048576",
                Misbehaviour::ArchiveChunkBytes(1 << 20),
            ),
            (
                "reject=no model at /srv/m",
                Misbehaviour::Reject("no model at /srv/m".to_owned()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(Misbehaviour::parse(text), Ok(expected), "{text}");
        }
        for bad in [
            "overrun-tokens",
            "logprobs=x",
            "nice",
            "dp-ranks=99999999999",
            "reject",
        ] {
            assert!(Misbehaviour::parse(bad).is_err(), "{bad}");
        }
    }
}
