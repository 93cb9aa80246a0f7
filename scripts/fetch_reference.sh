#!/usr/bin/env bash
# Run HERE (with network; not on the GPU machine) before a convergence benchmark call: downloads
# into .refwheels/ (git-ignored) the reference implementation's wheel, LibreYOLO 1.6.0 (without
# its dependencies), plus the two dependencies the GPU machine's Python lacks, as wheels for
# CPython 3.12 on manylinux x86_64: pycocotools (the reference's COCO evaluation) and mss.
# Everything else the reference imports (torch, torchvision, numpy, scipy, opencv, pyyaml,
# pillow, tqdm, typer, click, requests, safetensors, cloudpickle) is already there.
# bench/convergence/gpu_run.sh installs them with `pip install --no-index --no-deps --target`.
#   REFWHEELS_DIR   destination (default .refwheels)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${REFWHEELS_DIR:-$ROOT/.refwheels}
PIP=${PIP:-pip}
mkdir -p "$DEST"

"$PIP" download --quiet --no-deps --only-binary=:all: -d "$DEST" "libreyolo==1.6.0"
# pycocotools 2.0.11 ships a cp312-abi3 manylinux2014 wheel; mss is pure Python.
"$PIP" download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$DEST" \
  "pycocotools==2.0.11" "mss==10.2.0"

ls -l "$DEST"/*.whl
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "total: $((total / 1024)) KiB in $(find "$DEST" -maxdepth 1 -name '*.whl' | wc -l) wheels"
if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
  echo "error: the wheels exceed 60 MB (the device carry is 64 MiB in all)" >&2
  exit 1
fi
