#!/usr/bin/env bash
# Step and predict speed beside LibreYOLO 1.6.0 in one device call, run from the repository root
# with carry [".carry", ".refwheels"] (binaries from scripts/gpu_prepare.sh; .carry/*.tar.xz are
# unpacked into .carry first, for a carry packed to fit the 64 MiB limit):
#
#   MODELS="rtdetr-r18 yolo7-b" bash bench/convergence/gpu_speed.sh
#
# Per model: our training step (bench_train_step, bf16, EMA, cuDNN autotuning, eager then graphed:
# the whole step, or the training head and the update where the family captures only that), the
# reference's step from its own profiler (reference_step.py, cuda_graph off and on), our whole
# predict() of one 640x480 JPEG (bench_predict, eager and graphed) and the reference's on the same
# file (reference_predict.py). Logs and JSON in $OUT/speed.tar.gz, a summary on stdout.
#   MODELS="rtdetr-r18"  BATCHES="4,8"  IMGSZ=640  STEPS=20  WARMUP=8
#   classifiers (resnet-18, mobilenetv4-s, efficientnetv2-b0): both steps at CLS_IMGSZ (default 224)
#   on the generated class-folder set (make_data.py --set shapes); predict at the model's input size
#   WHICH="ours ref"   the sides to run;   PARTS="step predict" what to measure;   TIMEOUT_S=240 per command
#   GRAPH_SCOPE=auto   our graphed step's scope (bench_train_step --graph-scope): auto is what the
#                      family declares; step or head measure a capture the family has not turned on
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
MODELS=${MODELS:-rtdetr-r18}
BATCHES=${BATCHES:-4,8}
IMGSZ=${IMGSZ:-640}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-8}
WHICH=${WHICH:-ours ref}
PARTS=${PARTS:-step predict}
TIMEOUT_S=${TIMEOUT_S:-240}
FINAL=${OUT:-$ROOT/out/speed}
R=$(mktemp -d /tmp/speed.XXXXXX)
mkdir -p "$FINAL"
trap 'tar czf "$FINAL/speed.tar.gz" -C "$R" .; cat "$R/summary.txt" 2>/dev/null' EXIT
for t in .carry/*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C .carry; done
B=${BIN:-$ROOT/.carry/bin}  # BIN: another folder of prebuilt binaries
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
echo "gpu: $(tail -n +2 "$R/gpu.txt" | head -1); cores $(nproc)" | tee -a "$R/summary.txt"
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB:${LD_LIBRARY_PATH:-}"
if [[ " $WHICH " == *" ref "* ]]; then
  mkdir -p /tmp/refpkgs
  python3 -m pip install --quiet --no-index --no-deps --target /tmp/refpkgs .refwheels/*.whl > "$R/pip.log" 2>&1
  export PYTHONPATH=/tmp/refpkgs${PYTHONPATH:+:$PYTHONPATH}
  python3 bench/convergence/make_data.py --set colour --out /tmp/speed_data --seed 0 --train 96 --val 16 \
    > /dev/null 2> "$R/data.log"
fi
run() {  # name, command...: stdout to name.json, stderr to name.log
  local n=$1 s
  shift
  s=$(date +%s)
  timeout "$TIMEOUT_S" "$@" > "$R/$n.json" 2> "$R/$n.log"
  echo "$n: rc=$? $(( $(date +%s) - s )) s" | tee -a "$R/summary.txt"
}
# The same image for both predict figures: bench_predict writes it.
IMAGE=/tmp/libreyolo_bench_640x480.jpg
for m in $MODELS; do
  family=${m%%-*}
  size=${m#*-}
  data=/tmp/speed_data/data.yaml
  imgsz=$IMGSZ
  case $family in resnet | mobilenetv4 | efficientnetv2) data=/tmp/speed_shapes imgsz=${CLS_IMGSZ:-224} ;; esac
  if [[ " $WHICH " == *" ours "* && " $PARTS " == *" step "* ]]; then
    run "ours_step_$m" "$B/bench_train_step" --device cuda --cudnn-benchmark --ema --family "$family" --sizes "$size" \
      --batches "$BATCHES" --dtypes bf16 --imgsz "$imgsz" --cuda-graph off,on --graph-scope "${GRAPH_SCOPE:-auto}" --steps "$STEPS" --warmup "$WARMUP"
  fi
  if [[ " $WHICH " == *" ours "* && " $PARTS " == *" predict "* ]]; then
    run "ours_predict_$m" "$B/bench_predict" --device cuda --model "$m" --iters 100 --warmup 10
    run "ours_predict_graph_$m" "$B/bench_predict" --device cuda --model "$m" --iters 100 --warmup 10 --cuda-graph on
  fi
  if [[ " $WHICH " == *" ref "* && " $PARTS " == *" predict "* ]]; then
    [ -f "$IMAGE" ] || "$B/bench_predict" --device cpu --model "$m" --iters 1 --warmup 0 > /dev/null 2>&1
    run "ref_predict_$m" python3 bench/convergence/reference_predict.py --image "$IMAGE" --models "$m" \
      --graphs off,on --iters 50 --warmup 10
  fi
  if [[ " $WHICH " == *" ref "* && " $PARTS " == *" step "* ]]; then
    run "ref_step_$m" python3 bench/convergence/reference_step.py --data "$data" --models "$m" \
      --batches "$BATCHES" --graphs off,on --imgsz "$imgsz" --epochs 3 --project /tmp/refstep
  fi
done
# One line per measured configuration.
for f in "$R"/*.json; do
  python3 - "$f" >> "$R/summary.txt" 2>&1 <<'EOF'
import json, os, sys
name = os.path.basename(sys.argv[1])[:-5]
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{name}: no JSON ({e})"); sys.exit()
rows = d.get("results", d.get("configs", [d]))
for r in rows if isinstance(rows, list) else [rows]:
    keep = {k: r[k] for k in r if any(s in k for s in ("ms", "batch", "graph", "size", "ok", "error", "img_per_s"))
            and not isinstance(r[k], (dict, list))}
    if isinstance(r.get("real"), dict):
        keep.update({"ref_" + k: v for k, v in r["real"].items() if not isinstance(v, (dict, list))})
    for part in ("total", "preprocess", "inference", "postprocess"):  # bench_predict's {min_ms, median_ms}
        if isinstance(r.get(part), dict):
            keep.update({f"{part}_{k}": v for k, v in r[part].items() if not isinstance(v, (dict, list))})
    print(f"{name}: {json.dumps(keep)}")
EOF
done
