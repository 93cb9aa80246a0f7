#!/usr/bin/env bash
# Runs python/examples/ (the documentation's Python examples with the import line changed) on the
# GPU machine, from the repository root, with the package built by scripts/gpu_python_module.sh:
#   PKG=.carry/python OUT=/tmp/examples bash scripts/gpu_python_examples.sh [NAME ...]
# Each example runs in a scratch folder holding `my-dataset.yaml` (a small generated set: 16
# training and 4 validation images) and the weight files the examples name (fresh models saved
# under those names), with a time limit (LIMIT_S, default 150); the multi-GPU ones
# only when two GPUs are present. Output: $OUT/<name>.log and a line per example in $OUT/summary.txt.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PKG=${PKG:-$ROOT/.carry/python}
OUT=${OUT:-$ROOT/out/examples}
LIMIT_S=${LIMIT_S:-150}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/libreyolo-examples.XXXXXX)
python3 "$ROOT/bench/convergence/make_data.py" --set colour --out "$WORK" --seed 0 --train 16 --val 4 \
  > /dev/null 2> "$OUT/data.log" || { echo "data: FAILED" | tee -a "$OUT/summary.txt"; exit 1; }
cp "$WORK/data.yaml" "$WORK/my-dataset.yaml"
# The weight files the examples name (LibreYOLO downloads its pretrained ones; this machine has no
# network): the package's fresh models of those sizes, saved under those names.
(cd "$WORK" && PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" python3 -c "
from libreyolo_cpp import LibreYOLO
for name, path in (('yolo9s', 'LibreYOLO9s.pt'), ('yolo9t', 'LibreYOLO9t.pt'), ('rtdetr-r18', 'LibreRTDETRr18.pt')):
    LibreYOLO(name, device='cpu').save(path)
") > "$OUT/weights.log" 2>&1 || { echo "weights: FAILED" | tee -a "$OUT/summary.txt"; exit 1; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
names=("$@")
[ ${#names[@]} -eq 0 ] && for f in "$ROOT"/python/examples/*.py; do names+=("$(basename "$f" .py)"); done
for n in "${names[@]}"; do
  if [[ $n == multi_gpu_* ]] && [ "$gpus" -lt 2 ]; then
    echo "$n: not run ($gpus GPU)" | tee -a "$OUT/summary.txt"
    continue
  fi
  t0=$(date +%s.%N)
  (cd "$WORK" && PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" timeout "$LIMIT_S" python3 -c \
    "import runpy; runpy.run_path('$ROOT/python/examples/$n.py', run_name='__main__')") > "$OUT/$n.log" 2>&1
  rc=$?
  echo "$n: rc=$rc $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s; $(grep -v '^\s*$' "$OUT/$n.log" | tail -1 | cut -c1-160)" \
    | tee -a "$OUT/summary.txt"
done
rm -rf "$WORK"
