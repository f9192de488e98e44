#!/usr/bin/env python3
"""The family fixtures' chat templates, rendered by Hugging Face itself.

Run through scripts/hf_chat_templates.sh, which installs the pinned
``transformers`` (and ``jinja2``) into a venv; nothing here goes online
(every model is a local directory: ``local_files_only``).

Why: smg renders chat templates itself (minijinja, control/tokenizer/
chat_template.rs) and must produce the bytes ``transformers``'
``apply_chat_template`` produces, from the same inputs: the messages as the
client sent them, ``tools``, ``add_generation_prompt`` and the request's
``chat_template_kwargs``. tests/fixtures/models/<family>/example.json holds
those renderings (the prompt, and what the probe template
tests/fixtures/probe_chat_template.jinja shows the template was given);
tests/family_models.rs checks that smg renders the same. This script is the
other half: it checks that the committed renderings are what Hugging Face
renders, so that both ends are pinned to the reference.

    check   (default) render every example with AutoTokenizer.from_pretrained(
            <family dir>).apply_chat_template(messages, tools=...,
            add_generation_prompt=True, tokenize=False, **chat_template_kwargs)
            and compare with example.json byte for byte; a difference is
            printed as a unified diff and the exit status is 1.
    render  read {"jobs": [{"dir", "messages", "tools", "chat_template_kwargs",
            "chat_template"?}]} on stdin and write the prompts as a JSON list
            (make_family_models.py renders the goldens this way).
"""

from __future__ import annotations

import copy
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "fixtures" / "models"
PROBE = ROOT / "tests" / "fixtures" / "probe_chat_template.jinja"

_tokenizers: dict[str, object] = {}


def tokenizer(directory: str):
    from transformers import AutoTokenizer

    if directory not in _tokenizers:
        _tokenizers[directory] = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return _tokenizers[directory]


def render(directory: str, messages, tools, kwargs: dict, chat_template: str | None = None) -> str:
    # Copies: apply_chat_template must not be able to change the inputs the
    # next rendering (or the comparison) reads.
    return tokenizer(directory).apply_chat_template(
        copy.deepcopy(messages),
        tools=copy.deepcopy(tools),
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=False,
        **copy.deepcopy(kwargs),
    )


def diff(expected: str, actual: str, label: str) -> str:
    lines = difflib.unified_diff(
        expected.splitlines(keepends=True),
        actual.splitlines(keepends=True),
        fromfile=f"{label} (example.json)",
        tofile=f"{label} (transformers)",
    )
    # repr() shows whitespace and control characters a plain diff hides.
    return "".join(
        f"{line.rstrip(chr(10))!r}\n" if line[:1] in "+-" and line[:3] not in ("+++", "---") else line
        for line in lines
    )


def check() -> int:
    import transformers

    probe = PROBE.read_text(encoding="utf-8")
    passed = failed = 0
    for example_path in sorted(MODELS.glob("*/example.json")):
        directory = str(example_path.parent)
        family = example_path.parent.name
        example = json.loads(example_path.read_text(encoding="utf-8"))
        for conversation in example["conversations"]:
            tools = example["tools"] if conversation["with_tools"] else None
            for rendering in conversation["renderings"]:
                kwargs = rendering["chat_template_kwargs"]
                for what, template in (("prompt", None), ("probe", probe)):
                    label = f"{family} {conversation['name']} {json.dumps(kwargs)} {what}"
                    try:
                        actual = render(directory, conversation["messages"], tools, kwargs, template)
                    except Exception as err:  # the template raised: a failure to report
                        failed += 1
                        print(f"FAIL {label}: transformers raised {type(err).__name__}: {err}")
                        continue
                    if actual == rendering[what]:
                        passed += 1
                    else:
                        failed += 1
                        print(f"FAIL {label}: transformers renders differently")
                        print(diff(rendering[what], actual, label))
    if passed + failed == 0:
        print("no example.json found under tests/fixtures/models", file=sys.stderr)
        return 1
    print(f"transformers {transformers.__version__}: the family fixtures' example.json against apply_chat_template")
    print(f"hf-templates: {passed} passed, {failed} failed")
    return 1 if failed else 0


def render_jobs() -> int:
    jobs = json.load(sys.stdin)["jobs"]
    prompts = [
        render(
            job["dir"],
            job["messages"],
            job["tools"],
            job["chat_template_kwargs"],
            job.get("chat_template"),
        )
        for job in jobs
    ]
    json.dump(prompts, sys.stdout, ensure_ascii=False)
    return 0


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    if mode == "check":
        return check()
    if mode == "render":
        return render_jobs()
    print(f"usage: {sys.argv[0]} [check|render]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
