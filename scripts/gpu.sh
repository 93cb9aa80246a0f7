#!/usr/bin/env bash
# Runs ON THE GPU MACHINE (device tool): builds against the machine's own torch 2.11, runs the
# GPU tests and the benchmarks, writes logs and JSON under $OUT (default ./out), prints a summary.
#   LIBREYOLO_GPU_STEPS: which parts to run (default "build test bench")
#   LIBREYOLO_BENCH_ARGS: extra arguments for every benchmark
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# The device tool brings back at most 8 files: everything goes to $LOGS, packed into one
# results.tar.gz at the end, plus summary.txt.
FINAL=${OUT:-$ROOT/out}
OUT=$(mktemp -d /tmp/libreyolo-gpu.XXXXXX)
mkdir -p "$FINAL"
pack() { cp "$OUT/summary.txt" "$FINAL/" 2>/dev/null; tar czf "$FINAL/results.tar.gz" -C "$OUT" . ; }
trap pack EXIT
STEPS=${LIBREYOLO_GPU_STEPS:-build test bench}
export LIBREYOLO_SYSTEM_TORCH=1 LIBREYOLO_PY=${LIBREYOLO_PY:-python3}
export LIBREYOLO_BUILD_DIR=${LIBREYOLO_BUILD_DIR:-$ROOT/build-gpu}
export LIBREYOLO_JOBS=${LIBREYOLO_JOBS:-$(nproc)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d "$ROOT/.carry/fixtures" ] && export LIBREYOLO_FIXTURES="$ROOT/.carry/fixtures"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
summary "gpu: $(tail -n +2 "$OUT/gpu.txt" | head -1)"

if [[ " $STEPS " == *" build "* ]]; then
  t0=$(date +%s)
  if ! "$ROOT/scripts/build.sh" > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; summary "build: FAILED"; exit 1
  fi
  summary "build: ok in $(( $(date +%s) - t0 )) s"
fi
B=$LIBREYOLO_BUILD_DIR
if [[ " $STEPS " == *" test "* ]]; then
  "$B/tests/libreyolo_gpu_tests" --gtest_output=json:"$OUT/gpu_tests.json" > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  summary "gpu tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]|tests? ran' "$OUT/gpu_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/gpu_tests.log" | head -20
  if [[ " $STEPS " == *" cputest "* ]]; then
    (cd "$B" && ctest -L cpu -j8 --output-on-failure > "$OUT/cpu_tests.log" 2>&1); summary "cpu tests: rc=$? $(tail -3 "$OUT/cpu_tests.log" | head -1)"
  fi
fi
if [[ " $STEPS " == *" bench "* ]]; then
  for b in "$B"/bench/bench_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    timeout 300 "$b" --device cuda ${LIBREYOLO_BENCH_ARGS:-} > "$OUT/$name.json" 2> "$OUT/$name.log"
    summary "$name: rc=$? $(head -c 300 "$OUT/$name.json")"
  done
fi
