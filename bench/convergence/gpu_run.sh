#!/usr/bin/env bash
# The convergence benchmark's one command on the GPU machine, run from the repository root with
# carry [".carry", ".refwheels"] (see bench/convergence/README.md):
#
#   bash bench/convergence/gpu_run.sh
#
# 1. installs the carried reference wheels (.refwheels/*.whl: libreyolo 1.6.0, pycocotools, mss)
#    into a target folder put on PYTHONPATH (the machine's python3 has torch and the rest);
# 2. generates the data sets (make_data.py, dataset seed DATA_SEED);
# 3. trains the matrix SETS x MODELS x SEEDS x WHICH, PARALLEL runs at a time, each from
#    scratch with its implementation's own defaults, validated every epoch;
# 4. merges and checks (compare.py) and plots.
#
# $OUT (default ./out/convergence) receives: convergence.tar.gz (run JSONs, runner logs, each
# run's results.csv / metrics.jsonl / train_config.yaml / summary.json / train.log, the data
# sets' statistics), merged.json, curves.png and summary.txt. The tarball is rewritten after
# every finished run, so a command cut off at the device's time limit still returns the runs
# that finished.
#
# Knobs (environment):
#   SETS="colour hard"  MODELS="yolo9t" (also yolox-s, rtdetr-r18)  SEEDS="0 1"  WHICH="ours ref"
#                  (classifiers: SETS=shapes MODELS="resnet18 mobilenetv4s" IMGSZ=224 NO_AUG_EPOCHS=0)
#   EPOCHS=30  BATCH=16  IMGSZ=320  WORKERS=8  DEVICE=0
#   PARALLEL=1     runs at a time on the one GPU. Device time is scarce, so several runs may share
#                  the GPU; their wall times then measure contention, not speed: compare.py marks
#                  the time ratio "not comparable" whenever PARALLEL > 1. With PARALLEL > 1 the
#                  reference's runs are started first (the queue is ordered ref, then ours).
#   DEADLINE_S=560 seconds after the start when unfinished runs are stopped (SIGTERM: each
#                  runner still writes its JSON with the epochs done), leaving time to merge and
#                  pack inside a 600 s device call. 0 = no deadline.
#   LIBREYOLO_BIN=.carry/bin/libreyolo   our CLI
#   PYTHON=python3   REFWHEELS_DIR=.refwheels (skipped when absent)   REF_PKGS=/tmp/refpkgs
#   WORK=/tmp/convergence   DATA_SEED=0   TRAIN_IMAGES=512   VAL_IMAGES=128
#   OURS_OPTS="key=value ..."  REF_OPTS="key=value ..."   extra options of every ours / ref run
#   NO_AUG_EPOCHS=15   the no-aug length compare.py checks the loss jump at (both defaults: 15)
#   SAME_INIT=1    both implementations start each (set, model, seed) from one set of weights:
#                  the reference's fresh network for that seed (make_init.py, run_*.py --init)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
HERE=$ROOT/bench/convergence
T0=$(date +%s)

SETS=${SETS:-colour hard}
MODELS=${MODELS:-yolo9t}
SEEDS=${SEEDS:-0 1}
WHICH=${WHICH:-ours ref}
EPOCHS=${EPOCHS:-30}
BATCH=${BATCH:-16}
IMGSZ=${IMGSZ:-320}
WORKERS=${WORKERS:-8}
DEVICE=${DEVICE:-0}
PARALLEL=${PARALLEL:-1}
DEADLINE_S=${DEADLINE_S:-560}
PY=${PYTHON:-python3}
LIBREYOLO_BIN=${LIBREYOLO_BIN:-$ROOT/.carry/bin/libreyolo}
REFWHEELS_DIR=${REFWHEELS_DIR:-$ROOT/.refwheels}
REF_PKGS=${REF_PKGS:-/tmp/refpkgs}
WORK=${WORK:-/tmp/convergence}
DATA_SEED=${DATA_SEED:-0}
TRAIN_IMAGES=${TRAIN_IMAGES:-512}
VAL_IMAGES=${VAL_IMAGES:-128}
OURS_OPTS=${OURS_OPTS:-}
REF_OPTS=${REF_OPTS:-}
NO_AUG_EPOCHS=${NO_AUG_EPOCHS:-15}
SAME_INIT=${SAME_INIT:-0}
FINAL=${OUT:-$ROOT/out/convergence}

mkdir -p "$FINAL" "$WORK"/{data,runs,json,logs}
SUMMARY=$WORK/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY" >&2; }
elapsed() { echo $(( $(date +%s) - T0 )); }

pack() {  # the small files of every run (no weights, no pictures) into one tarball
  local list=$WORK/.packlist
  (cd "$WORK" && { ls summary.txt 2>/dev/null; find json logs data -maxdepth 2 -type f \( -name '*.json' -o -name '*.log' -o -name '*.txt' -o -name '*.yaml' \) 2>/dev/null;
    find runs -maxdepth 2 -type f \( -name results.csv -o -name metrics.jsonl -o -name train_config.yaml -o -name summary.json -o -name train.log -o -name status.json \) 2>/dev/null; } > "$list")
  tar czf "$FINAL/convergence.tar.gz.tmp" -C "$WORK" -T "$list" 2>/dev/null && mv "$FINAL/convergence.tar.gz.tmp" "$FINAL/convergence.tar.gz"
  cp "$SUMMARY" "$FINAL/summary.txt" 2>/dev/null
}
trap pack EXIT

say "convergence: SETS='$SETS' MODELS='$MODELS' SEEDS='$SEEDS' WHICH='$WHICH' EPOCHS=$EPOCHS BATCH=$BATCH IMGSZ=$IMGSZ WORKERS=$WORKERS DEVICE=$DEVICE PARALLEL=$PARALLEL DEADLINE_S=$DEADLINE_S"
say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1); cores $(nproc)"

# --- environment: torch's libraries for our binary, the reference's wheels for Python
TORCH_LIB=$("$PY" -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))' 2>/dev/null)
[ -n "$TORCH_LIB" ] && export LD_LIBRARY_PATH="$TORCH_LIB:${LD_LIBRARY_PATH:-}"
if [ -d "$REFWHEELS_DIR" ] && ls "$REFWHEELS_DIR"/*.whl > /dev/null 2>&1; then
  mkdir -p "$REF_PKGS"
  if ! "$PY" -m pip install --quiet --no-index --no-deps --target "$REF_PKGS" "$REFWHEELS_DIR"/*.whl > "$WORK/logs/pip.log" 2>&1; then
    # No pip in this interpreter: a wheel is a zip laid out for site-packages.
    "$PY" - "$REF_PKGS" "$REFWHEELS_DIR"/*.whl >> "$WORK/logs/pip.log" 2>&1 <<'EOF'
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
    print("extracted", w)
EOF
  fi
  export PYTHONPATH="$REF_PKGS${PYTHONPATH:+:$PYTHONPATH}"
fi
say "python: $("$PY" -c 'import sys,torch;print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1)"
if [[ " $WHICH " == *" ref "* ]]; then
  say "reference: $("$PY" -c 'import libreyolo,pycocotools,mss;print("libreyolo", libreyolo.__version__, "from", libreyolo.__file__)' 2>&1 | tail -1)"
fi
if [[ " $WHICH " == *" ours "* ]]; then
  say "ours: $("$LIBREYOLO_BIN" --version 2>&1 | tail -1) ($LIBREYOLO_BIN)"
fi

# --- data (DATA[set]: what a run's data= is, the set's data.yaml, or a classification set's folder)
declare -A DATA
for s in $SETS; do
  t=$(date +%s)
  DATA[$s]=$("$PY" "$HERE/make_data.py" --set "$s" --out "$WORK/data/$s" --seed "$DATA_SEED" \
    --train "$TRAIN_IMAGES" --val "$VAL_IMAGES" 2> "$WORK/logs/data_$s.txt") || { say "data $s: FAILED"; cat "$WORK/logs/data_$s.txt" >&2; exit 1; }
  say "data $s: $(tr '\n' ';' < "$WORK/logs/data_$s.txt") $(( $(date +%s) - t )) s"
done

# --- the matrix (reference runs first: the queue is worked through PARALLEL at a time)
JOBS=()
for impl in ref ours; do
  [[ " $WHICH " == *" $impl "* ]] || continue
  for s in $SETS; do for m in $MODELS; do for seed in $SEEDS; do JOBS+=("$impl $s $m $seed"); done; done; done
done

run_one() {  # impl set model seed
  local impl=$1 s=$2 m=$3 seed=$4 name="$1_$2_$3_s$4" budget=0 rc
  if [ "$DEADLINE_S" -gt 0 ]; then
    budget=$(( DEADLINE_S - $(elapsed) ))
    if [ "$budget" -le 5 ]; then say "$name: not started (deadline)"; return 0; fi
  fi
  local common_args=(--data "${DATA[$s]}" --out "$WORK/json/$name.json" --model "$m"
    --epochs "$EPOCHS" --batch "$BATCH" --imgsz "$IMGSZ" --workers "$WORKERS" --seed "$seed"
    --device "$DEVICE" --project "$WORK/runs" --name "$name" --set "$s" --concurrent "$PARALLEL")
  local opts=() o
  [ "$SAME_INIT" = 1 ] && opts+=(--init "$WORK/init/${s}_${m}_s${seed}.pt")
  if [ "$impl" = ours ]; then
    for o in $OURS_OPTS; do opts+=(--opt "$o"); done
    cmd=("$PY" "$HERE/run_ours.py" --bin "$LIBREYOLO_BIN" "${common_args[@]}" "${opts[@]}")
  else
    for o in $REF_OPTS; do opts+=(--opt "$o"); done
    cmd=("$PY" "$HERE/run_reference.py" "${common_args[@]}" "${opts[@]}")
  fi
  local t
  t=$(date +%s)
  if [ "$budget" -gt 0 ]; then
    timeout -s TERM -k 30 "$budget" "${cmd[@]}" > "$WORK/logs/$name.out" 2> "$WORK/logs/$name.log"
  else
    "${cmd[@]}" > "$WORK/logs/$name.out" 2> "$WORK/logs/$name.log"
  fi
  rc=$?
  say "$name: rc=$rc $(( $(date +%s) - t )) s (at $(elapsed) s) $(tail -1 "$WORK/logs/$name.log" | cut -c1-200)"
}

if [ "$SAME_INIT" = 1 ]; then  # the starting weights, before any run
  mkdir -p "$WORK/init"
  for s in $SETS; do for m in $MODELS; do for seed in $SEEDS; do
    "$PY" "$HERE/make_init.py" --model "$m" --data "${DATA[$s]}" --seed "$seed" \
      --out "$WORK/init/${s}_${m}_s${seed}.pt" >> "$WORK/logs/init.txt" 2>&1 || { say "init $s $m $seed: FAILED"; exit 1; }
  done; done; done
  say "init: $(grep -c -- '->' "$WORK/logs/init.txt") weight files (SAME_INIT=1)"
fi

running=0
for job in "${JOBS[@]}"; do
  while [ "$running" -ge "$PARALLEL" ]; do wait -n; running=$((running - 1)); pack; done
  # shellcheck disable=SC2086  # the job is "impl set model seed", split on purpose
  run_one $job &
  running=$((running + 1))
  sleep 2  # stagger the starts (dataset scans, CUDA contexts)
done
while [ "$running" -gt 0 ]; do wait -n; running=$((running - 1)); pack; done

# --- merge, check, plot
"$PY" "$HERE/compare.py" "$WORK/json" --out "$WORK/merged.json" --plot "$WORK/curves.png" \
  --no-aug-epochs "$NO_AUG_EPOCHS" > "$WORK/compare.txt" 2>&1
say "compare: rc=$? (0 all checks pass, 1 a check fails or a run failed, 2 nothing to compare)"
tee -a "$SUMMARY" < "$WORK/compare.txt" >&2
cp "$WORK/merged.json" "$WORK/curves.png" "$FINAL/" 2>/dev/null
say "total $(elapsed) s"
pack
