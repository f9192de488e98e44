#!/usr/bin/env bash
# Builds every fuzz target in fuzz/ once, then runs each for SECONDS
# (default 20) over its committed corpus in fuzz/corpus/<target>/. New inputs
# go to a scratch corpus, so the committed one never changes; a crash leaves
# its input in fuzz/artifacts/<target>/ and makes this script fail.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS 0 builds the targets and runs none (CI builds them at the lowest
# priority while its tests run, then runs them after).
#
# Drives cargo directly with the flags cargo-fuzz passes (libFuzzer's
# coverage instrumentation, --cfg fuzzing, debug assertions), so CI needs no
# cargo-fuzz install; `cargo fuzz run` in fuzz/ still works for local runs.
# One difference: cargo-fuzz forces one codegen unit per crate in release
# builds (for ThinLTO), which makes the build of ~440 crates much longer;
# CI's runs are seconds long, where build time matters more. Works on stable
# via RUSTC_BOOTSTRAP=1. The build goes to $CARGO_TARGET_DIR/fuzz (default
# target/fuzz), apart from the main workspace's.
#
# FUZZ_SANITIZER (default none) may be address. None by default: the fuzzed
# code is safe Rust (the one unsafe call there is an AVX2 dispatch) and the C
# decoders are not instrumented by rustc anyway, while ASan makes the build
# and the runs markedly slower, in a CI step with a fixed time budget.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-20}"
shift || true
export RUSTC_BOOTSTRAP=1
sanitizer="${FUZZ_SANITIZER:-none}"
target_dir="${CARGO_TARGET_DIR:-$PWD/../target}/fuzz"
mkdir -p "$target_dir"
target_dir="$(cd "$target_dir" && pwd)"
triple="$(rustc -vV | sed -n 's/^host: //p')"
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^smg-fuzz$')
fi

# cargo-fuzz 0.13's instrumentation flags. --target keeps them off build
# scripts and proc macros.
flags="-Cpasses=sancov-module"
flags+=" -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags+=" -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares"
flags+=" -Cllvm-args=-sanitizer-coverage-stack-depth"
flags+=" -Cllvm-args=-simplifycfg-branch-fold-threshold=0"
flags+=" --cfg fuzzing -Cdebug-assertions"
case "$sanitizer" in
  none) ;;
  address) flags+=" -Zsanitizer=address" ;;
  *) echo "FUZZ_SANITIZER must be none or address, not $sanitizer" >&2; exit 2 ;;
esac

# Per-target libFuzzer options: small inputs where size buys nothing; a
# timeout per input, so a template that loops is reported, not hung.
options() {
  case "$1" in
    decode_preprocess) echo "-max_len=65536 -timeout=10" ;;
    tokenizer_archive) echo "-max_len=16384 -timeout=10" ;;
    chat_template) echo "-max_len=4096 -timeout=5" ;;
    *) echo "-max_len=4096 -timeout=5" ;;
  esac
}

start=$(date +%s)
bins=()
for target in "${targets[@]}"; do bins+=(--bin "$target"); done
# Not --locked: when the gateway's dependencies change, cargo adds what
# fuzz/Cargo.lock lacks and keeps every version it already pins (commit
# the result).
RUSTFLAGS="$flags ${RUSTFLAGS:-}" cargo build --release --target "$triple" \
  --target-dir "$target_dir" "${bins[@]}"
echo "fuzz build: $(( $(date +%s) - start )) s"
if [ "$seconds" = 0 ]; then
  exit 0
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target" "artifacts/$target"
  # shellcheck disable=SC2046 # options are words
  if ! "$target_dir/$triple/release/$target" "$scratch/$target" "corpus/$target" \
    -artifact_prefix="artifacts/$target/" -max_total_time="$seconds" \
    -print_final_stats=1 $(options "$target") >"$scratch/$target.log" 2>&1; then
    failed+=("$target")
    tail -n 60 "$scratch/$target.log"
  fi
  grep -E '^stat::number_of_executed_units|^Done ' "$scratch/$target.log" | sed "s/^/$target: /" || true
done
echo "fuzz build and runs: $(( $(date +%s) - start )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds} s each without a crash"
