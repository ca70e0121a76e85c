#!/usr/bin/env bash
# Build the probe's isolated venv for one vLLM release: CPU torch first (a bare
# `torch` requirement would fetch a multi-GB CUDA build), then the vLLM wheel
# WITHOUT its dependencies (its GPU stack cannot install here), then only the
# packages vLLM's config path imports (../shared/vllm/FACTS.md lists them).
# Usage: setup_venv.sh VERSION VENV_DIR
set -euo pipefail
version="$1"
venv="$2"
python="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
if [ -f "$venv/.installed-$version" ]; then exit 0; fi
rm -rf "$venv"
"$python" -m venv "$venv"
# every install is tried again on a broken download (../retry.sh)
pip="$(dirname "$0")/../retry.sh $venv/bin/python -m pip"
$pip install --quiet --upgrade pip
$pip install --quiet "$torch_spec"
$pip install --quiet --no-deps "vllm==$version"
# Each package within the range the wheel declares, where it declares one.
specs=$("$venv/bin/python" - "$@" <<'PY'
import re
from importlib.metadata import requires

NEEDED = """transformers packaging pydantic regex numpy cbor2 psutil pyzmq urllib3 aiohttp
requests openai oss-harmony msgspec pillow pybase64 cachetools uvloop py-cpuinfo
prometheus_client xgrammar fastapi partial-json-parser llguidance einops cloudpickle
compressed-tensors pyyaml""".split()
declared = {}
for req in requires("vllm") or []:
    if "extra ==" in req:
        continue
    spec = req.split(";")[0].strip()
    name = re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-")
    declared[name] = re.sub(r"\[[^]]*\]", "", spec).replace(" ", "")
print(" ".join(declared.get(n.lower().replace("_", "-"), n) for n in NEEDED))
PY
)
# shellcheck disable=SC2086
$pip install --quiet $specs
touch "$venv/.installed-$version"
