#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU) from the sources in the llama-cpp-python sdist homeai depends on,
# for the side-by-side in docs/benchmarks.md ("Drafted tokens"). About 15 minutes on 2 cores.
# usage: build_llama_server.sh OUTDIR [VERSION]      then OUTDIR/llama-server
set -euo pipefail
out=$(realpath -m "$1"); version=${2:-0.3.36}
w=$(mktemp -d); trap 'rm -rf "$w"' EXIT; cd "$w"
pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d sdist
tar xzf sdist/*.tar.gz
src=$(echo "$w"/llama_cpp_python-*/vendor/llama.cpp)
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build build -j"$(nproc)" --target llama-server
mkdir -p "$out" && cp build/bin/llama-server "$out/"
echo "built: $out/llama-server (llama-cpp-python $version's llama.cpp)"
