#!/usr/bin/env bash
# Before/after on the GPU machine in one lease: builds this tree and a reference tree there, runs
# this tree's GPU tests, then the step and predict benchmarks of both binaries interleaved
# (A B A B), so that both are measured on the same machine instance.
#
# Here:            scripts/gpu_ab.sh prepare <git-ref>    # puts `git archive <ref>` and GoogleTest
#                                                         # into .carry/ (git-ignored)
# GPU machine:     bash scripts/gpu_ab.sh build            # (device tool, carry [".carry"])
#                  bash scripts/gpu_ab.sh bench            # a second call: the builds are kept
# Logs and JSON go to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${OUT:-$ROOT/out}
mkdir -p "$OUTDIR"
NEW=$ROOT/build-ab-new
REF=$ROOT/build-ab-ref

case "${1:-}" in
prepare)
  ref=${2:?usage: gpu_ab.sh prepare <git-ref>}
  rm -rf "$ROOT/.carry/ref-src"
  mkdir -p "$ROOT/.carry/ref-src"
  git -C "$ROOT" archive "$ref" | tar -x -C "$ROOT/.carry/ref-src"
  git -C "$ROOT" rev-parse "$ref" > "$ROOT/.carry/ref-src/REF"
  [ -f "$ROOT/.carry/googletest/CMakeLists.txt" ] || cp -r /usr/src/googletest "$ROOT/.carry/googletest"
  if [ -d "$ROOT/../shared/fixtures" ]; then
    mkdir -p "$ROOT/.carry/fixtures"
    cp -u "$ROOT"/../shared/fixtures/*.pt "$ROOT"/../shared/fixtures/README.md "$ROOT/.carry/fixtures/"
  fi
  du -sh "$ROOT/.carry"
  ;;
build)
  export LIBREYOLO_SYSTEM_TORCH=1 LIBREYOLO_PY=python3 LIBREYOLO_JOBS=$(nproc)
  t0=$(date +%s)
  LIBREYOLO_BUILD_DIR=$NEW LIBREYOLO_TARGETS="libreyolo_gpu_tests libreyolo_cli bench_train_step bench_predict" \
    "$ROOT/scripts/build.sh" > "$OUTDIR/build_new.log" 2>&1 || { tail -30 "$OUTDIR/build_new.log"; exit 1; }
  echo "new build: $(( $(date +%s) - t0 )) s"
  t0=$(date +%s)
  LIBREYOLO_BUILD_DIR=$REF LIBREYOLO_CMAKE_ARGS="-DLIBREYOLO_BUILD_TESTS=OFF" \
    LIBREYOLO_TARGETS="bench_train_step bench_predict" \
    "$ROOT/.carry/ref-src/scripts/build.sh" > "$OUTDIR/build_ref.log" 2>&1 || { tail -30 "$OUTDIR/build_ref.log"; exit 1; }
  echo "reference build ($(cat "$ROOT/.carry/ref-src/REF")): $(( $(date +%s) - t0 )) s"
  export NCCL_NVLS_ENABLE=0 LIBREYOLO_FIXTURES=$ROOT/.carry/fixtures
  TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
  export LD_LIBRARY_PATH="$TORCH_LIB:${LD_LIBRARY_PATH:-}"
  timeout 300 "$NEW/tests/libreyolo_gpu_tests" > "$OUTDIR/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|FAILED  \]' "$OUTDIR/gpu_tests.log" | tail -40
  ;;
bench)
  TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
  export LD_LIBRARY_PATH="$TORCH_LIB:${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > "$OUTDIR/gpu.txt" 2>&1
  STEP_ARGS=${AB_STEP_ARGS:---sizes t --batches 8,16 --dtypes bf16 --steps 24 --warmup 15}
  for round in 1 2; do
    for side in ref new; do
      B=$([ $side = new ] && echo "$NEW" || echo "$REF")
      timeout 200 "$B/bench/bench_train_step" --device cuda --cudnn-benchmark $STEP_ARGS \
        > "$OUTDIR/step_${side}_$round.json" 2> "$OUTDIR/step_${side}_$round.log"
      timeout 120 "$B/bench/bench_predict" --device cuda --iters 100 --warmup 10 \
        > "$OUTDIR/predict_${side}_$round.json" 2> "$OUTDIR/predict_${side}_$round.log"
    done
  done
  python3 - "$OUTDIR" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(path)[:-5]
    try: d = json.load(open(path))
    except Exception as e: print(name, "unreadable:", e); continue
    for r in d.get("results", []) if isinstance(d.get("results"), list) else []:
        print(name, r.get("model"), "b%s" % r.get("batch"), r.get("dtype"),
              "min %.1f ms median %.1f ms" % (r["min_ms"], r["median_ms"]), "peak %.2f GB" % r.get("peak_allocated_gb", 0))
    if "total" in d: print(name, json.dumps({k: d[k] for k in ("total", "preprocess", "inference", "postprocess") if k in d}))
PY
  ;;
*)
  echo "usage: gpu_ab.sh prepare <git-ref> | build | bench" >&2
  exit 2
  ;;
esac
