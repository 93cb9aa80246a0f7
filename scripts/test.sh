#!/usr/bin/env bash
# Sets up (first run only), builds and runs the CPU test suite.
# GPU tests are a separate program (libreyolo_gpu_tests); scripts/gpu.sh runs them on a GPU machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/scripts/build.sh"
. "$ROOT/scripts/env.sh"
BUILD=${LIBREYOLO_BUILD_DIR:-$ROOT/build}
if [ -z "${LIBREYOLO_FIXTURES:-}" ] && [ -d "$ROOT/../shared/fixtures" ]; then
  export LIBREYOLO_FIXTURES=$(cd "$ROOT/../shared/fixtures" && pwd)
fi
export LIBREYOLO_PY
cd "$BUILD"
ctest -L cpu --output-on-failure -j"${LIBREYOLO_TEST_JOBS:-2}" "$@"
