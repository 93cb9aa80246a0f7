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
# Tests run two at a time: OpenMP threads that spin while they wait would slow the other process
# 10-20x on a 2-core machine (a dry run of the DEIM recipes: 226 s beside itself, 17.8 s with
# passive waiting). Results do not depend on it.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$BUILD"
ctest -L cpu --output-on-failure -j"${LIBREYOLO_TEST_JOBS:-2}" "$@"
