#!/usr/bin/env bash
# Issues 16 and 17's acceptance with the official openai Python client:
# runs openai_tool_loop.py (chat tool loops), openai_responses.py (the
# Responses API: tool loops by previous_response_id, the stream helper,
# stored responses, conversations) and, with the official anthropic client,
# anthropic_messages.py (a tool loop on /v1/messages) against `smg demo`
# fleets (regular on the bundled
# model; pd on the Qwen3 family fixture, whose think tokens give
# reasoning_content; epd on the bundled model). Each demo starts in the
# background on ephemeral ports, is used once its gateway answers
# /readiness, and is stopped (with its fleet) afterwards.
#
# The clients are pinned and installed into a venv under the cargo target
# directory (kept between runs; reinstalled when the pin changes).
set -euo pipefail
cd "$(dirname "$0")/../.."

OPENAI_VERSION=3.57.0
ANTHROPIC_VERSION=2.15.0
target="${CARGO_TARGET_DIR:-target}"
venv="$target/acceptance-venv"
python="$venv/bin/python"

if ! "$python" -c "import anthropic, openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION' \
  or anthropic.__version__ != '$ANTHROPIC_VERSION')" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$python" -m pip install -q --disable-pip-version-check "openai==$OPENAI_VERSION" \
    "anthropic==$ANTHROPIC_VERSION"
fi

# The binaries as the test build makes them (a no-op right after
# `cargo test --workspace`). Not `cargo build --bins`: without the test
# targets, tokio resolves without the tests' `test-util` feature, and every
# crate above tokio (hyper, tonic, axum, the gateway) would build again.
cargo test --workspace --locked --no-run --quiet 2>/dev/null ||
  cargo test --workspace --locked --no-run
smg="$target/debug/smg"

work="$(mktemp -d)"
demo_pid=""
stop_demo() {
  if [ -n "$demo_pid" ]; then
    kill "$demo_pid" 2>/dev/null || true
    wait "$demo_pid" 2>/dev/null || true
    demo_pid=""
  fi
}
trap 'stop_demo; rm -rf "$work"' EXIT

# Waits (at most 60 s) for the demo's ready line, then for /readiness;
# prints the gateway's base URL.
wait_for_demo() {
  local out="$1" http="" i
  for i in $(seq 600); do
    http="$(sed -n 's/^smg ready http=\([^ ]*\).*/\1/p' "$out")"
    [ -n "$http" ] && break
    kill -0 "$demo_pid" 2>/dev/null || { echo "smg demo exited" >&2; return 1; }
    sleep 0.1
  done
  [ -n "$http" ] || { echo "smg demo never printed its ready line" >&2; return 1; }
  for i in $(seq 600); do
    if "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      "http://$http/readiness" >/dev/null 2>&1; then
      echo "http://$http"
      return 0
    fi
    sleep 0.1
  done
  echo "smg demo at $http never became ready" >&2
  return 1
}

# run_against MODE [demo flags...] -- [script flags...]
run_against() {
  local mode="$1" demo_flags=() script_flags=() out base
  shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do demo_flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  script_flags=("$@")
  out="$work/demo-$mode.out"
  echo "-- smg demo --mode $mode ${demo_flags[*]}"
  "$smg" demo --mode "$mode" --port 0 --prometheus-port 0 --admin-port 0 \
    ${demo_flags[@]+"${demo_flags[@]}"} >"$out" 2>"$work/demo-$mode.err" &
  demo_pid=$!
  if ! base="$(wait_for_demo "$out")"; then
    cat "$work/demo-$mode.err" >&2
    return 1
  fi
  "$python" scripts/acceptance/openai_tool_loop.py --base-url "$base/v1" \
    ${script_flags[@]+"${script_flags[@]}"}
  "$python" scripts/acceptance/openai_responses.py --base-url "$base/v1" \
    ${script_flags[@]+"${script_flags[@]}"}
  "$python" scripts/acceptance/anthropic_messages.py --base-url "$base" \
    ${script_flags[@]+"${script_flags[@]}"}
  stop_demo
}

run_against regular
run_against pd --model-path tests/fixtures/models/qwen3 -- --expect-reasoning
run_against epd
