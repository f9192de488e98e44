#!/usr/bin/env bash
# Checks the family fixtures' example.json (the prompts smg must render,
# tests/family_models.rs) against Hugging Face's own apply_chat_template:
# scripts/hf_chat_templates.py, run with the pinned transformers and jinja2
# from a venv under the cargo target directory (kept between runs;
# reinstalled when a pin changes). Offline: the models are local
# directories. `render` (used by tests/fixtures/make_family_models.py) renders
# jobs from stdin instead of checking.
set -euo pipefail
cd "$(dirname "$0")/.."

TRANSFORMERS_VERSION=5.23.0
JINJA2_VERSION=3.1.6
target="${CARGO_TARGET_DIR:-target}"
venv="$target/hf-venv"
python="$venv/bin/python"

if ! "$python" -c "import jinja2, transformers, sys; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION' \
  or jinja2.__version__ != '$JINJA2_VERSION')" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$python" -m pip install -q --disable-pip-version-check "transformers==$TRANSFORMERS_VERSION" \
    "jinja2==$JINJA2_VERSION" >&2
fi

# No hub, no telemetry, no warnings about the missing PyTorch.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_VERBOSITY=error
exec "$python" scripts/hf_chat_templates.py "$@"
