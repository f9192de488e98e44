//! Every committed fuzz input, replayed on every `cargo test`.
//!
//! Why it exists: the cargo-fuzz targets build only in `fuzz/`'s own
//! workspace, with libFuzzer and nightly flags, so an input that once broke
//! a target and was committed to `fuzz/corpus/<target>/` would otherwise be
//! checked only by the fuzz step. Here each input goes through the same
//! `run` its target calls (`fuzz/src/`, included by path: `smg-fuzz` is not
//! a member of this workspace), with the target's own assertions. The
//! corpora are small (tens of files), so this costs well under a second of
//! the test run.

#[path = "../fuzz/src/lib.rs"]
mod fuzz_bodies;

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The names of the entries of `dir` (file stems with `strip`), sorted.
fn names(dir: &Path, strip: Option<&str>) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| {
            let name = entry.expect("a directory entry").file_name();
            let name = name.to_string_lossy().into_owned();
            match strip {
                Some(suffix) => name.strip_suffix(suffix).unwrap_or(&name).to_owned(),
                None => name,
            }
        })
        .collect()
}

/// Runs every file of `corpus` through `run`: the files that panicked,
/// each with its panic message.
fn replay(corpus: &Path, run: fn(&[u8])) -> Vec<String> {
    let mut failed = Vec::new();
    for name in names(corpus, None) {
        let path = corpus.join(&name);
        let data = std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(&data))) {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            failed.push(format!("{}: {why}", path.display()));
        }
    }
    failed
}

#[test]
fn every_target_has_a_body_and_a_committed_corpus() {
    let targets: BTreeSet<String> = fuzz_bodies::TARGETS
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    let fuzz = fuzz_dir();
    assert_eq!(
        names(&fuzz.join("fuzz_targets"), Some(".rs")),
        targets,
        "fuzz_targets/*.rs against fuzz/src/lib.rs's TARGETS"
    );
    assert_eq!(
        names(&fuzz.join("corpus"), None),
        targets,
        "corpus/<target>/ against TARGETS"
    );
    for target in &targets {
        assert!(
            !names(&fuzz.join("corpus").join(target), None).is_empty(),
            "corpus/{target} is empty"
        );
    }
}

#[test]
fn every_committed_input_passes_its_targets_checks() {
    let corpora = fuzz_dir().join("corpus");
    let failed: Vec<String> = fuzz_bodies::TARGETS
        .iter()
        .flat_map(|(target, run)| replay(&corpora.join(target), *run))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The replay reports an input whose body panics, by file, and goes on
/// with the rest: what a regression committed to a corpus looks like.
#[test]
fn an_input_that_breaks_a_target_fails_the_replay() {
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("fine"), b"ok").expect("write");
    std::fs::write(dir.path().join("crash-1"), b"boom").expect("write");
    fn body(data: &[u8]) {
        assert_ne!(data, b"boom", "the body's own check");
    }
    let failed = replay(dir.path(), body);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].contains("crash-1") && failed[0].contains("the body's own check"),
        "{failed:?}"
    );
}

/// The seeds of `worker_response`'s other answers are valid answers, read
/// past the first parse: each converts to what it encodes (so the fuzzer
/// starts from the conversions, not from a decode error).
#[test]
fn the_worker_answer_seeds_convert() {
    use smg::engine::{AnswerKind, Runtime, WorkerAnswer, read_worker_answer};
    let corpus = fuzz_dir().join("corpus").join("worker_response");
    let read = |name: &str, runtime: Runtime, kind: AnswerKind| {
        let data = std::fs::read(corpus.join(name)).expect("a seed");
        read_worker_answer(runtime, kind, &data[1..]).unwrap_or_else(|err| panic!("{name}: {err}"))
    };
    for (prefix, runtime) in [
        ("tokenspeed", Runtime::TokenSpeed),
        ("sglang", Runtime::Sglang),
    ] {
        let WorkerAnswer::ModelInfo(info) = read(
            &format!("{prefix}_model_info"),
            runtime,
            AnswerKind::ModelInfo,
        ) else {
            panic!("{prefix}: not model info");
        };
        assert_eq!(
            (
                info.served_model_name.as_str(),
                info.eos_token_ids.as_slice()
            ),
            ("m", [2, 4002].as_slice()),
            "{prefix}: {info:?}"
        );
        let WorkerAnswer::ServerInfo(server) = read(
            &format!("{prefix}_server_info"),
            runtime,
            AnswerKind::ServerInfo,
        ) else {
            panic!("{prefix}: not server info");
        };
        assert_eq!(
            server.shm_namespace_id.as_deref(),
            Some("0123abcd:64768"),
            "{prefix}: {server:?}"
        );
        assert_eq!(server.server_args["tp_size"], 1.0, "{prefix}: {server:?}");
        let WorkerAnswer::Load(load) = read(&format!("{prefix}_loads"), runtime, AnswerKind::Loads)
        else {
            panic!("{prefix}: not a load");
        };
        assert_eq!(
            (load.running_requests, load.dp_rank_count),
            (7, 2),
            "{prefix}: {load:?}"
        );
    }
    let WorkerAnswer::Embedding(embedding) =
        read("sglang_embed", Runtime::Sglang, AnswerKind::Embed)
    else {
        panic!("not an embedding");
    };
    assert_eq!(embedding.values, [0.6, 0.0, 0.8]);
}
