#!/usr/bin/env python3
"""Acceptance: the official `openai` Python client drives the Responses API
of a running smg gateway (issue 17).

Why a Python script: acceptance is "the client people actually use works",
so requests are made and replies read by the SDK's own types and stream
helpers, not a re-implementation. Against the gateway it checks:

1. a function-tool loop with `responses.create`, whole and streamed: the
   first response holds `function_call` items (call ids, JSON arguments
   that satisfy the tool's schema); the script runs the tool and continues
   with `previous_response_id` and `function_call_output` items; the answer
   uses the tool's result (the SDK's `output_text`);
2. the SDK's `responses.stream` helper, which rebuilds the response from the
   events itself: its final response must equal what `responses.retrieve`
   returns, and the event `sequence_number`s must increase by one;
3. `responses.retrieve`, `responses.input_items.list`, `responses.delete`;
4. a conversation: `conversations.create`, a response made in it, and
   `conversations.items.list` showing the turn.

Usage:
    python3 scripts/acceptance/openai_responses.py [--base-url URL] [--model ID]
        [--expect-reasoning]
--expect-reasoning requires reasoning items in the tool turns (a thinking
model thinks before it calls). Exit status 0 when every check held, 1 otherwise (each failure is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

import openai

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "search_flights",
        "description": "Finds flights between two cities",
        "parameters": {
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


def function_calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def check_calls(calls: list[Any]) -> None:
    check(len(calls) >= 1, "no function_call item")
    for call in calls:
        check(call.name == "search_flights", f"call of {call.name!r}")
        check(call.call_id.startswith("call_"), f"call_id {call.call_id!r}")
        arguments = json.loads(call.arguments)
        check(isinstance(arguments, dict), f"arguments {call.arguments!r}")
        for key in ("origin", "destination", "passengers"):
            check(key in arguments, f"arguments lack {key!r}: {call.arguments}")
        check(isinstance(arguments["passengers"], int), f"passengers {arguments['passengers']!r}")


def follow_up(client: openai.OpenAI, model: str, first: Any, stream: bool) -> Any:
    """Runs the calls and continues the chain with their outputs."""
    outputs = [
        {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": json.dumps({"flight": RESULT_MARKER, "price_eur": 129}),
        }
        for call in function_calls(first)
    ]
    kwargs = dict(model=model, previous_response_id=first.id, input=outputs, tools=TOOLS)
    if not stream:
        return client.responses.create(**kwargs)
    final = None
    for event in client.responses.create(stream=True, **kwargs):
        if event.type == "response.completed":
            final = event.response
    check(final is not None, "no response.completed event")
    return final


def tool_loop(client: openai.OpenAI, model: str, stream: bool, expect_reasoning: bool) -> str:
    kwargs = dict(model=model, input=QUESTION, tools=TOOLS)
    if stream:
        first = None
        argument_deltas = 0
        sequence = []
        for event in client.responses.create(stream=True, **kwargs):
            sequence.append(event.sequence_number)
            if event.type == "response.function_call_arguments.delta":
                argument_deltas += 1
            if event.type == "response.completed":
                first = event.response
        check(first is not None, "no response.completed event")
        check(sequence == list(range(len(sequence))), f"sequence numbers {sequence[:8]}...")
        check(argument_deltas >= 1, "no response.function_call_arguments.delta event")
    else:
        first = client.responses.create(**kwargs)
    check(first.status == "completed", f"status {first.status!r}")
    check_calls(function_calls(first))
    if expect_reasoning:
        check(any(item.type == "reasoning" for item in first.output), "no reasoning item")
    second = follow_up(client, model, first, stream)
    check(second.status == "completed", f"turn 2 status {second.status!r}")
    check(second.previous_response_id == first.id, "turn 2 does not name turn 1")
    check(not function_calls(second), "turn 2 calls tools again")
    check(RESULT_MARKER in second.output_text, f"turn 2 ignores the result: {second.output_text!r}")
    return f"  {len(function_calls(first))} call(s), then {second.output_text.strip()[:60]!r}"


def stream_helper(client: openai.OpenAI, model: str) -> str:
    numbers = []
    text = []
    with client.responses.stream(model=model, input="Say hello to the team.") as stream:
        for event in stream:
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
        final = stream.get_final_response()
    check(numbers == list(range(len(numbers))), f"sequence numbers {numbers[:8]}...")
    check(final.status == "completed", f"status {final.status!r}")
    check("".join(text).strip() == final.output_text.strip(), "deltas and output_text differ")
    stored = client.responses.retrieve(final.id)
    check(stored.output_text == final.output_text, "retrieve differs from the stream")
    check(stored.id == final.id and stored.status == "completed", f"retrieved {stored.status}")
    return f"  {len(numbers)} events, output_text={final.output_text.strip()[:60]!r}"


def stored_lifecycle(client: openai.OpenAI, model: str, _expect_reasoning: bool) -> str:
    response = client.responses.create(model=model, input="Name a colour.", instructions="Be brief.")
    items = client.responses.input_items.list(response.id)
    check(len(items.data) == 1, f"{len(items.data)} input items")
    check(items.data[0].role == "user", f"input item role {items.data[0].role!r}")
    client.responses.delete(response.id)
    try:
        client.responses.retrieve(response.id)
    except openai.NotFoundError:
        pass
    else:
        raise CheckFailed("a deleted response is still retrieved")
    unstored = client.responses.create(model=model, input="Name a shape.", store=False)
    try:
        client.responses.retrieve(unstored.id)
    except openai.NotFoundError:
        pass
    else:
        raise CheckFailed("a store=false response was kept")
    return f"  created, listed, deleted {response.id[:16]}…; store=false kept nothing"


def conversation(client: openai.OpenAI, model: str, _expect_reasoning: bool) -> str:
    conv = client.conversations.create(
        metadata={"topic": "acceptance"},
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}],
    )
    response = client.responses.create(model=model, input="What is my name?", conversation=conv.id)
    check(response.status == "completed", f"status {response.status!r}")
    listed = client.conversations.items.list(conv.id, order="asc")
    roles = [getattr(item, "role", item.type) for item in listed.data]
    check(len(listed.data) == 3, f"conversation items {roles}")
    check(roles == ["user", "user", "assistant"], f"conversation items {roles}")
    client.conversations.delete(conv.id)
    return f"  {conv.id[:16]}…: {roles}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url",
        default=os.environ.get("SMG_BASE_URL", "http://127.0.0.1:30000/v1"),
        help="the gateway's OpenAI base URL (default: $SMG_BASE_URL or smg demo's)",
    )
    parser.add_argument("--model", help="the model id (default: the first /v1/models lists)")
    parser.add_argument(
        "--expect-reasoning", action="store_true", help="require reasoning items (a thinking model)"
    )
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=60, max_retries=0)
    model = args.model or client.models.list().data[0].id
    print(f"openai {openai.__version__} -> {args.base_url} model={model} (Responses API)")
    checks: list[tuple[str, Callable[[], str]]] = [
        ("function tool loop, whole", lambda: tool_loop(client, model, False, args.expect_reasoning)),
        ("function tool loop, streamed", lambda: tool_loop(client, model, True, args.expect_reasoning)),
        ("responses.stream helper", lambda: stream_helper(client, model)),
        ("retrieve / input_items / delete / store=false", lambda: stored_lifecycle(client, model, False)),
        ("conversation", lambda: conversation(client, model, False)),
    ]
    failures = 0
    for title, run in checks:
        try:
            line = run()
        except (CheckFailed, openai.OpenAIError, json.JSONDecodeError) as err:
            failures += 1
            print(f"FAIL {title}: {type(err).__name__}: {err}")
            continue
        print(f"ok   {title}")
        print(line)
    print(f"openai_responses: {len(checks) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
