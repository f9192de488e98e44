#!/usr/bin/env bash
# Builds every fuzz target in fuzz/ once, then runs each for SECONDS
# (default 20) over its committed corpus in fuzz/corpus/<target>/. New inputs
# go to a scratch corpus, so the committed one never changes; a crash leaves
# its input in fuzz/artifacts/<target>/ and makes this script fail.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Needs cargo-fuzz (cargo install cargo-fuzz --locked). Works on stable via
# RUSTC_BOOTSTRAP=1. The build goes to $CARGO_TARGET_DIR/fuzz (default
# target/fuzz), apart from the main workspace's.
#
# FUZZ_SANITIZER (default none) is cargo-fuzz's --sanitizer. None by
# default: the fuzzed code is safe Rust (the one unsafe call there is an
# AVX2 dispatch) and the C decoders are not instrumented by rustc anyway,
# while ASan makes the sancov build of ~440 crates markedly slower and the
# runs slower, in a CI step with a fixed time budget. Set address for a
# local run that should also catch memory errors.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-20}"
shift || true
export RUSTC_BOOTSTRAP=1
sanitizer="${FUZZ_SANITIZER:-none}"
target_dir="${CARGO_TARGET_DIR:-$PWD/../target}/fuzz"
mkdir -p "$target_dir"
target_dir="$(cd "$target_dir" && pwd)"
if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets < <(cargo fuzz list); fi

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
if [ ${#targets[@]} -eq 1 ]; then
  cargo fuzz build --sanitizer "$sanitizer" --target-dir "$target_dir" "${targets[0]}"
else
  cargo fuzz build --sanitizer "$sanitizer" --target-dir "$target_dir"
fi
echo "fuzz build: $(( $(date +%s) - start )) s"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target" "artifacts/$target"
  # shellcheck disable=SC2046 # options are words
  if ! cargo fuzz run --sanitizer "$sanitizer" --target-dir "$target_dir" "$target" "$scratch/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 $(options "$target") \
    >"$scratch/$target.log" 2>&1; then
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
