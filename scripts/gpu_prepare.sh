#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device run: copies what the GPU machine lacks into
# .carry/ (git-ignored), which the device call carries: GoogleTest sources and the parity
# fixtures. Then run the device command `bash scripts/gpu.sh` with carry [".carry"].
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$ROOT/.carry"
if [ ! -f "$ROOT/.carry/googletest/CMakeLists.txt" ]; then
  rm -rf "$ROOT/.carry/googletest"
  cp -r /usr/src/googletest "$ROOT/.carry/googletest"
fi
if [ -d "$ROOT/../shared/fixtures" ]; then
  mkdir -p "$ROOT/.carry/fixtures"
  cp -u "$ROOT"/../shared/fixtures/*.pt "$ROOT"/../shared/fixtures/README.md "$ROOT/.carry/fixtures/"
fi
du -sh "$ROOT/.carry"
