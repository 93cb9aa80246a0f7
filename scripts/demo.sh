#!/usr/bin/env bash
# The main job on the built-in default, from a fresh machine: set up (once), build, train a
# YOLOv9-t briefly on the generated shapes dataset, validate it, predict the bundled sample
# image with the trained weights, and print a short report.
#   DEMO_EPOCHS (default 40), DEMO_IMGSZ (default 160), DEMO_BATCH (default 16), DEMO_DEVICE (auto)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/scripts/build.sh"
BIN=${LIBREYOLO_BUILD_DIR:-$ROOT/build}/libreyolo
RUNS=${DEMO_RUNS:-$ROOT/runs/demo}
EPOCHS=${DEMO_EPOCHS:-40}
IMGSZ=${DEMO_IMGSZ:-160}
BATCH=${DEMO_BATCH:-16}
DEVICE=${DEMO_DEVICE:-auto}
WORKERS=${DEMO_WORKERS:-2}

mkdir -p "$RUNS"
echo "== train: yolo9t on the built-in shapes dataset, $EPOCHS epochs at ${IMGSZ}px"
"$BIN" train model=yolo9t data=builtin epochs="$EPOCHS" imgsz="$IMGSZ" batch="$BATCH" device="$DEVICE" \
  workers="$WORKERS" eval_interval=10 no_aug_epochs=5 project="$RUNS" name=train exist_ok=true --json \
  > "$RUNS/train.json" || { echo "training failed"; exit 1; }
SAVE_DIR=$(sed -n 's/.*"save_dir":"\([^"]*\)".*/\1/p' "$RUNS/train.json")
WEIGHTS=$(sed -n 's/.*"best_weights":"\([^"]*\)".*/\1/p' "$RUNS/train.json")
[ -n "$WEIGHTS" ] || WEIGHTS=$(sed -n 's/.*"last_weights":"\([^"]*\)".*/\1/p' "$RUNS/train.json")

echo "== val: $WEIGHTS"
"$BIN" val model="$WEIGHTS" data=builtin imgsz="$IMGSZ" batch="$BATCH" device="$DEVICE" project="$RUNS" name=val \
  exist_ok=true --json > "$RUNS/val.json"

VAL_IMAGE=$(ls "${LIBREYOLO_CACHE:-$HOME/.cache/libreyolo-cpp}"/datasets/libreyolo-builtin-v1/images/val/* | head -1)
echo "== predict: a validation image of the built-in dataset, and SAMPLE_IMAGE"
mkdir -p "$RUNS/predict_src"; cp "$VAL_IMAGE" "$RUNS/predict_src/"
"$BIN" predict model="$WEIGHTS" source="$RUNS/predict_src" imgsz="$IMGSZ" device="$DEVICE" save=true \
  project="$RUNS" name=predict exist_ok=true --json > "$RUNS/predict.json"
"$BIN" predict model="$WEIGHTS" source=SAMPLE_IMAGE imgsz="$IMGSZ" device="$DEVICE" save=true \
  project="$RUNS" name=predict exist_ok=true --json > "$RUNS/predict_sample.json"

echo
echo "== report"
"$ROOT/scripts/report.py" "$RUNS" 2>/dev/null || python3 "$ROOT/scripts/report.py" "$RUNS"
