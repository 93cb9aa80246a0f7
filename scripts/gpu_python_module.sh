#!/usr/bin/env bash
# Run HERE after scripts/gpu_prepare.sh: builds the Python package's _core module for another
# machine's Python (the GPU machine's 3.12, whose headers this machine lacks) from build-carry's
# static library, with the small C/C++ libraries it needs (yaml-cpp, libjpeg, libpng, as shared
# libraries: the distribution's static ones are not position-independent) copied beside it.
#   scripts/gpu_python_module.sh PYTHON_INCLUDE_DIR [OUT_DIR]
# PYTHON_INCLUDE_DIR: that Python's headers (the folder with Python.h, named pythonX.Y); OUT_DIR
# (default .carry/python) receives libreyolo_cpp/. There, with torch imported first (its libraries
# are then loaded) and PYTHONPATH=OUT_DIR: `from libreyolo_cpp import LibreYOLO`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
INC=${1:?usage: gpu_python_module.sh PYTHON_INCLUDE_DIR [OUT_DIR]}
OUT=${2:-$ROOT/.carry/python}
[ -f "$INC/Python.h" ] || { echo "no Python.h in $INC" >&2; exit 2; }
VER=$(basename "$INC")          # python3.12
TAG=${VER#python}               # 3.12
SUFFIX=cpython-${TAG/./}-x86_64-linux-gnu
LIB=$ROOT/build-carry/liblibreyolo.a
[ -f "$LIB" ] || { echo "no $LIB: run scripts/gpu_prepare.sh first" >&2; exit 2; }
# shellcheck source=/dev/null
source "$ROOT/scripts/env.sh" > /dev/null
TORCH=$("$LIBREYOLO_PY" -c 'import torch,os;print(os.path.dirname(torch.__file__))')
CUDA=${CUDA_HOME:-/usr/local/cuda}
PKG=$OUT/libreyolo_cpp
mkdir -p "$PKG"
g++ -std=c++17 -O2 -fPIC -flto=auto -shared -o "$PKG/_core.$SUFFIX.so" "$ROOT/python/libreyolo_cpp/_core.cpp" \
  -I"$ROOT/include" -I"$INC" -I"$(dirname "$INC")" -I"$TORCH/include" "$LIB" \
  -L"$TORCH/lib" -ltorch -ltorch_cpu -ltorch_cuda -lc10_cuda -lc10 -L"$CUDA/lib64" -lcudart_static -lnvrtc \
  -lyaml-cpp -ljpeg -lpng16 -lz -ldl -lrt -lpthread -Wl,-rpath,'$ORIGIN'
strip "$PKG/_core.$SUFFIX.so"
cp "$ROOT/python/libreyolo_cpp/__init__.py" "$PKG/"
for l in libyaml-cpp.so libjpeg.so libpng16.so; do  # the sonames the module asks for
  so=$(ldd "$PKG/_core.$SUFFIX.so" | awk -v l="$l" 'index($1, l) == 1 {print $3}')
  [ -n "$so" ] && cp -L "$so" "$PKG/$(basename "$so")"
done
ls -la "$PKG"
