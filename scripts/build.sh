#!/usr/bin/env bash
# Configure and build the project (library, CLI, tests, benchmarks).
# Env: LIBREYOLO_BUILD_DIR (default build), LIBREYOLO_BUILD_TYPE (default Release),
#      LIBREYOLO_JOBS (default nproc), LIBREYOLO_CMAKE_ARGS (extra cmake args).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=env.sh
. "$ROOT/scripts/env.sh"
BUILD=${LIBREYOLO_BUILD_DIR:-$ROOT/build}
GEN=""
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" $GEN \
    -DCMAKE_BUILD_TYPE="${LIBREYOLO_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$LIBREYOLO_TORCH_CMAKE" \
    -DLIBREYOLO_NV_ROOT="$LIBREYOLO_NV_ROOT" \
    -DLIBREYOLO_PYTHON="$LIBREYOLO_PY" \
    -DLIBREYOLO_GLOO_INCLUDE_DIR="${LIBREYOLO_GLOO_INCLUDE:-}" \
    ${LIBREYOLO_CMAKE_ARGS:-} >&2
fi
cmake --build "$BUILD" -j"${LIBREYOLO_JOBS:-$(nproc)}" ${LIBREYOLO_TARGETS:+--target $LIBREYOLO_TARGETS} >&2
