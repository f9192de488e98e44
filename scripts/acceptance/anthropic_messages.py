#!/usr/bin/env python3
"""Acceptance: the official `anthropic` Python client runs a tool loop
against a running smg gateway's `/v1/messages` (issue 16).

Why a Python script: acceptance is "the client people actually use works",
so requests are made and replies read by the SDK's own types, and the
streamed reply is put together by the SDK's own stream helper
(`messages.stream(...).get_final_message()`), not a re-implementation. For
each transport (whole, streamed) the model is asked a question with a tool
invented here; the reply must stop with `tool_use` and hold `tool_use`
blocks (`toolu_`-free ids are fine, but ids must be unique, the name known
and the input an object satisfying the tool's schema); the script sends a
`tool_result` back and the reply must be text that uses the result
(`end_turn`). With --expect-reasoning the tool turn must carry a `thinking`
block.

Usage:
    python3 scripts/acceptance/anthropic_messages.py [--base-url URL] [--model ID]
        [--expect-reasoning]
The URL is the gateway's root (the SDK adds /v1/messages). Exit status 0
when every check held, 1 otherwise (each failure is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from typing import Any

import anthropic

TOOLS: list[dict[str, Any]] = [
    {
        "name": "search_flights",
        "description": "Finds flights between two cities",
        "input_schema": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "departure city"},
                "destination": {"type": "string", "description": "arrival city"},
                "passengers": {"type": "integer", "minimum": 1},
            },
            "required": ["origin", "destination", "passengers"],
        },
    }
]
QUESTION = "Find me a flight from Lisbon to Oslo for two people, please."
RESULT_MARKER = "TP1234"


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def ask(client: anthropic.Anthropic, model: str, messages: list, stream: bool) -> Any:
    kwargs = dict(model=model, max_tokens=400, messages=messages, tools=TOOLS)
    if not stream:
        return client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as events:
        for _ in events:
            pass
        return events.get_final_message()


def tool_loop(client: anthropic.Anthropic, model: str, stream: bool, expect_reasoning: bool) -> str:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = ask(client, model, messages, stream)
    check(first.stop_reason == "tool_use", f"turn 1 stop_reason {first.stop_reason!r}")
    uses = [block for block in first.content if block.type == "tool_use"]
    check(len(uses) >= 1, f"turn 1 has no tool_use block: {[b.type for b in first.content]}")
    ids = [use.id for use in uses]
    check(len(set(ids)) == len(ids) and all(ids), f"tool_use ids {ids}")
    for use in uses:
        check(use.name == "search_flights", f"tool_use of {use.name!r}")
        check(isinstance(use.input, dict), f"input {use.input!r} is not an object")
        for key in ("origin", "destination", "passengers"):
            check(key in use.input, f"input lacks {key!r}: {use.input}")
        check(isinstance(use.input["passengers"], int), f"passengers {use.input['passengers']!r}")
    if expect_reasoning:
        thinking = [block for block in first.content if block.type == "thinking"]
        check(bool(thinking) and bool(thinking[0].thinking), "turn 1 has no thinking block")
    check(first.usage.input_tokens > 0, f"usage {first.usage}")

    messages.append({"role": "assistant", "content": first.content})
    messages.append(
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": json.dumps({"flight": RESULT_MARKER, "price_eur": 129}),
                }
                for use in uses
            ],
        }
    )
    second = ask(client, model, messages, stream)
    check(second.stop_reason == "end_turn", f"turn 2 stop_reason {second.stop_reason!r}")
    text = "".join(block.text for block in second.content if block.type == "text")
    check(not any(block.type == "tool_use" for block in second.content), "turn 2 calls again")
    check(RESULT_MARKER in text, f"turn 2 ignores the result: {text!r}")
    return f"  {len(uses)} tool_use block(s), then {text.strip()[:60]!r}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url",
        default=os.environ.get("SMG_ROOT_URL", "http://127.0.0.1:30000"),
        help="the gateway's root URL (default: $SMG_ROOT_URL or smg demo's)",
    )
    parser.add_argument("--model", help="the model id (default: the first /v1/models lists)")
    parser.add_argument(
        "--expect-reasoning", action="store_true", help="require thinking blocks (a thinking model)"
    )
    args = parser.parse_args()

    if args.model is None:
        with urllib.request.urlopen(f"{args.base_url}/v1/models", timeout=10) as answer:
            args.model = json.load(answer)["data"][0]["id"]
    client = anthropic.Anthropic(base_url=args.base_url, api_key="unused", timeout=60, max_retries=0)
    print(f"anthropic {anthropic.__version__} -> {args.base_url} model={args.model} (Messages API)")
    failures = 0
    for stream in (False, True):
        title = f"tool loop {'streamed' if stream else 'whole'}"
        try:
            line = tool_loop(client, args.model, stream, args.expect_reasoning)
        except (CheckFailed, anthropic.AnthropicError) as err:
            failures += 1
            print(f"FAIL {title}: {type(err).__name__}: {err}")
            continue
        print(f"ok   {title}")
        print(line)
    print(f"anthropic_messages: {2 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
