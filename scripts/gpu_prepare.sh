#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device run. Builds the GPU test program, the CLI and
# the benchmarks with the small C/C++ dependencies linked statically (so they run on the GPU
# machine's distribution against its own torch 2.11 libraries), and copies into .carry/
# (git-ignored) what the GPU machine lacks: those binaries, GoogleTest sources (for a build
# there) and the parity fixtures. The device command is then `bash scripts/gpu.sh` with
# carry [".carry"].
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/.carry
mkdir -p "$CARRY/bin"
LIBREYOLO_BUILD_DIR=$ROOT/build-carry LIBREYOLO_CMAKE_ARGS="-DLIBREYOLO_STATIC_DEPS=ON" \
  "$ROOT/scripts/build.sh"
B=$ROOT/build-carry
for f in "$B/libreyolo" "$B/tests/libreyolo_gpu_tests" "$B"/bench/bench_*; do
  [ -x "$f" ] && [ -f "$f" ] && strip -o "$CARRY/bin/$(basename "$f")" "$f"
done
if [ ! -f "$CARRY/googletest/CMakeLists.txt" ]; then
  rm -rf "$CARRY/googletest"
  cp -r /usr/src/googletest "$CARRY/googletest"
fi
if [ -d "$ROOT/../shared/fixtures" ]; then
  mkdir -p "$CARRY/fixtures"
  cp -u "$ROOT"/../shared/fixtures/*.pt "$ROOT"/../shared/fixtures/README.md "$CARRY/fixtures/"
fi
du -sh "$CARRY"/* 
