#!/usr/bin/env python3
"""Acceptance: the official `openai` Python client runs a two-turn tool loop
against a running smg gateway (issue 16).

Why a Python script: acceptance is "the client people actually use works",
so the requests and the reading of the replies are the SDK's own, not a
re-implementation. For each tool_choice (auto, required, a named function)
and each transport (whole, streamed), the model is asked a question with a
tool set invented here; the reply must be a tool call (id, known name, JSON
arguments that satisfy the tool's schema, finish_reason "tool_calls"); the
script runs the tool, sends the call and the result back, and the reply
must be a plain answer that uses the result (finish_reason "stop", no
calls). Streamed calls are put together from their deltas by `index`, as
the SDK's users do. `reasoning_content` is read on every reply and, with
--expect-reasoning, must be present where the model thinks (auto turns).

Usage:
    python3 scripts/acceptance/openai_tool_loop.py [--base-url URL] [--model ID]
        [--expect-reasoning]
The URL defaults to $SMG_BASE_URL, else http://127.0.0.1:30000/v1 (smg
demo's port); the model to the first one /v1/models lists. Exit status 0
when every check held, 1 otherwise (the first failure is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import openai

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Finds flights between two cities",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "description": "departure city"},
                    "destination": {"type": "string", "description": "arrival city"},
                    "passengers": {"type": "integer", "minimum": 1},
                    "nonstop": {"type": "boolean"},
                    "cabin": {"type": "string", "enum": ["economy", "business"]},
                },
                "required": ["origin", "destination", "passengers"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Converts an amount between currencies",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "source": {"type": "string", "enum": ["EUR", "USD", "NOK"]},
                    "target": {"type": "string", "enum": ["EUR", "USD", "NOK"]},
                },
                "required": ["amount", "source", "target"],
            },
        },
    },
]

QUESTION = "Find me a flight from Lisbon to Oslo for two people, please."
# A marker the answer must carry: proof that the tool result was used.
RESULT_MARKER = "TP1234"


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """The client side of the loop: what the invented tools return."""
    if name == "search_flights":
        return json.dumps({"flight": RESULT_MARKER, "price_eur": 129, "stops": 0})
    return json.dumps({"converted": RESULT_MARKER, "rate": 1.0})


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}


def check_against_schema(value: Any, schema: dict[str, Any], where: str) -> None:
    """The schema checks a tool loop relies on: types, enums, required."""
    if "enum" in schema:
        check(value in schema["enum"], f"{where}: {value!r} is not one of {schema['enum']}")
    expected = schema.get("type")
    if expected in _JSON_TYPES:
        ok = isinstance(value, _JSON_TYPES[expected])
        if expected in ("integer", "number") and isinstance(value, bool):
            ok = False
        check(ok, f"{where}: {value!r} is not of type {expected}")
    if expected == "integer" and "minimum" in schema:
        check(value >= schema["minimum"], f"{where}: {value!r} is below {schema['minimum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            check(key in value, f"{where}: the required property {key!r} is missing")
        for key, item in value.items():
            if key in schema.get("properties", {}):
                check_against_schema(item, schema["properties"][key], f"{where}.{key}")


def tool_schema(name: str) -> dict[str, Any]:
    for tool in TOOLS:
        if tool["function"]["name"] == name:
            return tool["function"]["parameters"]
    raise CheckFailed(f"the call names {name!r}, which is not one of the tools")


def whole(client: openai.OpenAI, model: str, messages: list, tool_choice: Any) -> dict:
    """One non-streamed completion, read through the SDK's types."""
    response = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice
    )
    check(len(response.choices) == 1, f"one choice, got {len(response.choices)}")
    choice = response.choices[0]
    message = choice.message
    calls = [
        {"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
        for call in message.tool_calls or []
    ]
    for call in message.tool_calls or []:
        check(call.type == "function", f"call type {call.type!r}")
    return {
        "content": message.content,
        "reasoning": getattr(message, "reasoning_content", None),
        "calls": calls,
        "finish_reason": choice.finish_reason,
        # The SDK's own message object goes back in the next turn, as
        # the SDK's examples do.
        "echo": message,
    }


def streamed(client: openai.OpenAI, model: str, messages: list, tool_choice: Any) -> dict:
    """One streamed completion, put together from its deltas."""
    stream = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice, stream=True
    )
    content, reasoning = [], []
    calls: dict[int, dict[str, Any]] = {}
    finish_reasons = []
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content:
            content.append(delta.content)
        thought = getattr(delta, "reasoning_content", None)
        if thought:
            reasoning.append(thought)
        for fragment in delta.tool_calls or []:
            if fragment.index not in calls:
                check(fragment.id is not None, f"call {fragment.index}'s first delta has no id")
                check(
                    fragment.function is not None and fragment.function.name,
                    f"call {fragment.index}'s first delta has no name",
                )
                check(fragment.type == "function", f"call type {fragment.type!r}")
                calls[fragment.index] = {"id": fragment.id, "name": "", "arguments": ""}
            else:
                check(fragment.id is None, f"call {fragment.index} repeats its id")
            call = calls[fragment.index]
            if fragment.function is not None:
                if fragment.function.name:
                    check(call["name"] == "", f"call {fragment.index} repeats its name")
                    call["name"] = fragment.function.name
                call["arguments"] += fragment.function.arguments or ""
        if choice.finish_reason is not None:
            finish_reasons.append(choice.finish_reason)
    check(len(finish_reasons) == 1, f"one finish_reason in the stream, got {finish_reasons}")
    check(sorted(calls) == list(range(len(calls))), f"call indexes 0..n-1, got {sorted(calls)}")
    ordered = [calls[index] for index in sorted(calls)]
    text = "".join(content)
    return {
        "content": text or None,
        "reasoning": "".join(reasoning) or None,
        "calls": ordered,
        "finish_reason": finish_reasons[0],
        "echo": {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in ordered
            ],
        },
    }


def tool_loop(
    client: openai.OpenAI,
    model: str,
    tool_choice: Any,
    stream: bool,
    expect_reasoning: bool,
) -> list[str]:
    """One two-turn loop; returns its report lines."""
    complete = streamed if stream else whole
    messages: list[Any] = [{"role": "user", "content": QUESTION}]

    first = complete(client, model, messages, tool_choice)
    check(
        first["finish_reason"] == "tool_calls",
        f"turn 1 finish_reason {first['finish_reason']!r}, content {first['content']!r}",
    )
    check(len(first["calls"]) >= 1, "turn 1 has no tool_calls")
    ids = [call["id"] for call in first["calls"]]
    check(all(isinstance(i, str) and i for i in ids), f"call ids {ids}")
    check(len(set(ids)) == len(ids), f"call ids repeat: {ids}")
    check(all(i.startswith("call_") for i in ids), f"OpenAI-style call ids: {ids}")
    forced_name = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
    results = []
    for call in first["calls"]:
        schema = tool_schema(call["name"])
        if forced_name is not None:
            check(call["name"] == forced_name, f"the named function was {forced_name!r}, got {call['name']!r}")
        try:
            arguments = json.loads(call["arguments"])
        except json.JSONDecodeError as err:
            raise CheckFailed(f"arguments {call['arguments']!r} are not JSON: {err}") from err
        check(isinstance(arguments, dict), f"arguments {arguments!r} are not an object")
        check_against_schema(arguments, schema, call["name"])
        results.append((call, run_tool(call["name"], arguments)))
    if expect_reasoning and tool_choice == "auto":
        check(bool(first["reasoning"]), "turn 1 has no reasoning_content")

    messages.append(first["echo"])
    for call, result in results:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    second = complete(client, model, messages, "auto")
    check(
        second["finish_reason"] == "stop",
        f"turn 2 finish_reason {second['finish_reason']!r}",
    )
    check(not second["calls"], f"turn 2 calls tools again: {second['calls']}")
    check(bool(second["content"]), "turn 2 has no content")
    check(RESULT_MARKER in second["content"], f"turn 2 does not use the tool result: {second['content']!r}")
    if expect_reasoning:
        check(bool(second["reasoning"]), "turn 2 has no reasoning_content")

    calls_text = ", ".join(f"{c['name']}({c['arguments']}) id={c['id']}" for c in first["calls"])
    lines = [f"  turn 1: {calls_text} finish_reason={first['finish_reason']}"]
    if first["reasoning"]:
        lines.append(f"          reasoning_content={first['reasoning'].strip()!r}")
    lines.append(f"  turn 2: content={second['content'].strip()!r} finish_reason={second['finish_reason']}")
    if second["reasoning"]:
        lines.append(f"          reasoning_content={second['reasoning'].strip()!r}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url",
        default=os.environ.get("SMG_BASE_URL", "http://127.0.0.1:30000/v1"),
        help="the gateway's OpenAI base URL (default: $SMG_BASE_URL or smg demo's)",
    )
    parser.add_argument("--model", help="the model id (default: the first /v1/models lists)")
    parser.add_argument(
        "--expect-reasoning",
        action="store_true",
        help="require reasoning_content (a thinking model)",
    )
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=60, max_retries=0)
    model = args.model or client.models.list().data[0].id
    print(f"openai {openai.__version__} -> {args.base_url} model={model}")
    choices: list[tuple[str, Any]] = [
        ("auto", "auto"),
        ("required", "required"),
        ("named", {"type": "function", "function": {"name": "convert_currency"}}),
    ]
    failures = 0
    passed = 0
    for label, tool_choice in choices:
        for stream in (False, True):
            title = f"tool_choice={label} {'streamed' if stream else 'whole'}"
            try:
                lines = tool_loop(client, model, tool_choice, stream, args.expect_reasoning)
            except (CheckFailed, openai.OpenAIError) as err:
                failures += 1
                print(f"FAIL {title}: {type(err).__name__}: {err}")
                continue
            passed += 1
            print(f"ok   {title}")
            print("\n".join(lines))
    print(f"openai_tool_loop: {passed} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
