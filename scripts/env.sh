#!/usr/bin/env bash
# Sourced by the other scripts. Makes sure the build environment exists and exports:
#   LIBREYOLO_PY        python with torch==2.11.0 (its libtorch is what we link against)
#   LIBREYOLO_TORCH_CMAKE  torch.utils.cmake_prefix_path of that python
#   LIBREYOLO_NV_ROOT   site-packages/nvidia of that python (nccl.h lives there)
#   LIBREYOLO_CUDNN_FRONTEND_INCLUDE  cudnn_frontend's headers (fused inference convolutions), or empty
#   LIBREYOLO_GLOO_INCLUDE  gloo's headers (the wheel has Gloo compiled in but ships no gloo
#                       headers; Debian's libgloo-dev has them: extracted into the cache, not
#                       installed). Empty when unavailable: CPU multi-process training is then off.
#
# On a fresh Debian machine this installs the small -dev packages from Debian and
# creates a virtual environment with the torch wheel in a cache OUTSIDE the clone
# (default ~/.cache/libreyolo-cpp, override with LIBREYOLO_CACHE). Later runs reuse it.
# On the GPU machine (LIBREYOLO_SYSTEM_TORCH=1, or no pip access) the system python3
# that already has torch 2.11 is used instead.

LIBREYOLO_TORCH_VERSION=2.11.0
LIBREYOLO_CACHE=${LIBREYOLO_CACHE:-$HOME/.cache/libreyolo-cpp}

_ly_log() { printf '[env] %s\n' "$*" >&2; }

_ly_apt_deps() {
  # Debian packages the build needs; installed only when missing.
  local pkgs="cmake g++ make ninja-build libjpeg-dev libpng-dev libfreetype-dev fonts-dejavu-core libyaml-cpp-dev nlohmann-json3-dev libgtest-dev python3-venv python3-dev chromium"
  local missing=""
  command -v dpkg-query >/dev/null 2>&1 || return 0
  for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  _ly_log "installing Debian packages:$missing"
  local sudo=""
  [ "$(id -u)" != 0 ] && sudo="sudo"
  $sudo apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >&2 || {
    _ly_log "apt-get install failed for:$missing"; return 1; }
}

_ly_gloo_headers() {
  local dir
  for dir in "${LIBREYOLO_GLOO_INCLUDE:-}" /usr/include "$LIBREYOLO_CACHE/gloo/usr/include"; do
    if [ -n "$dir" ] && [ -f "$dir/gloo/context.h" ]; then LIBREYOLO_GLOO_INCLUDE=$dir; return 0; fi
  done
  LIBREYOLO_GLOO_INCLUDE=""
  command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 || return 0
  local tmp
  tmp=$(mktemp -d)
  local sudo=""
  [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  # No package lists yet (a fresh image): fetch them once, then try again.
  (cd "$tmp" && apt-get download -qq libgloo-dev >/dev/null 2>&1) ||
    { $sudo apt-get update -qq >/dev/null 2>&1; (cd "$tmp" && apt-get download -qq libgloo-dev >/dev/null 2>&1); }
  if ls "$tmp"/libgloo-dev_*.deb >/dev/null 2>&1 && mkdir -p "$LIBREYOLO_CACHE/gloo" &&
     dpkg -x "$tmp"/libgloo-dev_*.deb "$LIBREYOLO_CACHE/gloo" && [ -f "$LIBREYOLO_CACHE/gloo/usr/include/gloo/context.h" ]; then
    LIBREYOLO_GLOO_INCLUDE="$LIBREYOLO_CACHE/gloo/usr/include"
    _ly_log "gloo headers from Debian's libgloo-dev in $LIBREYOLO_GLOO_INCLUDE"
  else
    _ly_log "could not fetch libgloo-dev: CPU multi-process (Gloo) training will be off in this build"
  fi
  rm -rf "$tmp"
}

# cudnn_frontend's headers (header-only; the cuDNN library is torch's) for the fused inference
# convolutions: extracted from the pinned PyPI wheel into the cache. Without them that fusion is off.
LIBREYOLO_CUDNN_FRONTEND_VERSION=1.32.0
_ly_cudnn_frontend() {
  local dir="$LIBREYOLO_CACHE/cudnn-frontend-$LIBREYOLO_CUDNN_FRONTEND_VERSION"
  if ! [ -f "$dir/include/cudnn_frontend.h" ]; then
    local tmp
    tmp=$(mktemp -d)
    if "$LIBREYOLO_PY" -m pip download -q --progress-bar off --no-deps --only-binary=:all: -d "$tmp" \
         "nvidia-cudnn-frontend==$LIBREYOLO_CUDNN_FRONTEND_VERSION" >&2 &&
       "$LIBREYOLO_PY" - "$tmp" "$dir" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
    then
      _ly_log "cudnn_frontend $LIBREYOLO_CUDNN_FRONTEND_VERSION headers in $dir/include"
    else
      _ly_log "could not fetch nvidia-cudnn-frontend: fused inference convolutions will be off in this build"
    fi
    rm -rf "$tmp"
  fi
  [ -f "$dir/include/cudnn_frontend.h" ] && LIBREYOLO_CUDNN_FRONTEND_INCLUDE="$dir/include" || LIBREYOLO_CUDNN_FRONTEND_INCLUDE=""
}

_ly_torch_ok() {  # $1 = python
  "$1" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$LIBREYOLO_TORCH_VERSION' else 1)" 2>/dev/null
}

_ly_setup() {
  if [ "${LIBREYOLO_SYSTEM_TORCH:-0}" = 1 ]; then
    LIBREYOLO_PY=${LIBREYOLO_PY:-python3}
    _ly_torch_ok "$LIBREYOLO_PY" || { _ly_log "system $LIBREYOLO_PY has no torch $LIBREYOLO_TORCH_VERSION"; return 1; }
  else
    _ly_apt_deps || return 1
    local venv="$LIBREYOLO_CACHE/venv"
    LIBREYOLO_PY="$venv/bin/python"
    if ! [ -f "$venv/.ready-$LIBREYOLO_TORCH_VERSION" ] || ! _ly_torch_ok "$LIBREYOLO_PY"; then
      _ly_log "creating $venv with torch==$LIBREYOLO_TORCH_VERSION (a large download, done once)"
      mkdir -p "$LIBREYOLO_CACHE"
      python3 -m venv "$venv" >&2 || return 1
      "$venv/bin/pip" install -q --progress-bar off --upgrade pip >&2 || true
      "$venv/bin/pip" install -q --progress-bar off "torch==$LIBREYOLO_TORCH_VERSION" numpy pycocotools >&2 || {
        _ly_log "pip install failed"; return 1; }
      _ly_torch_ok "$LIBREYOLO_PY" || { _ly_log "torch in $venv is not $LIBREYOLO_TORCH_VERSION"; return 1; }
      touch "$venv/.ready-$LIBREYOLO_TORCH_VERSION"
    fi
  fi
  # nvJPEG's header for the GPU loader (a small wheel; the library itself is loaded at run time).
  if [ "${LIBREYOLO_SYSTEM_TORCH:-0}" != 1 ] && ! [ -f "$LIBREYOLO_CACHE/venv/.nvjpeg" ]; then
    if "$LIBREYOLO_PY" -m pip install -q --progress-bar off "nvidia-nvjpeg==13.0.*" >&2; then
      touch "$LIBREYOLO_CACHE/venv/.nvjpeg"
    else
      _ly_log "could not install nvidia-nvjpeg: the GPU loader (loader=gpu) will be off in this build"
    fi
  fi
  # The Python package's build (pybind11; scikit-build-core for `pip install .`) and its tests
  # (pytest; Pillow for its image inputs): small wheels, once.
  if [ "${LIBREYOLO_SYSTEM_TORCH:-0}" != 1 ] && ! [ -f "$LIBREYOLO_CACHE/venv/.python-package-3" ]; then
    if "$LIBREYOLO_PY" -m pip install -q --progress-bar off "pybind11==2.13.*" "pytest==8.*" "pillow==11.*" \
        "scikit-build-core==0.11.*" >&2; then
      touch "$LIBREYOLO_CACHE/venv/.python-package-3"
    else
      _ly_log "could not install pybind11, pytest, Pillow and scikit-build-core: the Python package will not be built or tested"
    fi
  fi
  LIBREYOLO_TORCH_CMAKE=$("$LIBREYOLO_PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')
  LIBREYOLO_NV_ROOT=$("$LIBREYOLO_PY" -c 'import nvidia;print(list(nvidia.__path__)[0])' 2>/dev/null || true)
  [ "${LIBREYOLO_SYSTEM_TORCH:-0}" = 1 ] || _ly_gloo_headers
  [ "${LIBREYOLO_SYSTEM_TORCH:-0}" = 1 ] || _ly_cudnn_frontend
  export LIBREYOLO_PY LIBREYOLO_TORCH_CMAKE LIBREYOLO_NV_ROOT LIBREYOLO_GLOO_INCLUDE LIBREYOLO_CUDNN_FRONTEND_INCLUDE
}

_ly_setup || { _ly_log "environment setup failed"; return 1 2>/dev/null || exit 1; }
