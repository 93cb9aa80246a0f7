#!/usr/bin/env bash
# Runs ON THE GPU MACHINE (device tool, carry [".carry"] prepared by scripts/gpu_prepare.sh):
# GPU tests and benchmarks, with logs and JSON packed into $OUT/results.tar.gz plus a summary.
# Uses the prebuilt binaries in .carry/bin when present, else builds against the machine's own
# torch 2.11 (LIBREYOLO_GPU_BUILD=1 forces the build).
#   LIBREYOLO_GPU_STEPS: parts to run (default "test bench"); names: test forward predict step
#   loader e2e loss image graph verdicts e2e_graph infer_graph fold fusion yolox dist bn pool folder cold; "bench" = all
#   benchmarks.
#   dist needs two GPUs (nvidia-h200-x2): the NCCL tests, the scaling figure (1 GPU vs 2, spawn
#   and torchrun) and two torchrun "nodes" of one GPU each.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FINAL=${OUT:-$ROOT/out}
LOG=$(mktemp -d /tmp/libreyolo-gpu.XXXXXX)
mkdir -p "$FINAL"
pack() { cp "$LOG/summary.txt" "$FINAL/" 2>/dev/null; tar czf "$FINAL/results.tar.gz" -C "$LOG" . ; }
trap pack EXIT
summary() { echo "$*" | tee -a "$LOG/summary.txt"; }
STEPS=" ${LIBREYOLO_GPU_STEPS:-test bench} "
want() { [[ "$STEPS" == *" $1 "* ]] || { [[ "$STEPS" == *" bench "* ]] && [ "$1" != test ]; }; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d "$ROOT/.carry/fixtures" ] && export LIBREYOLO_FIXTURES="$ROOT/.carry/fixtures"
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB:${LD_LIBRARY_PATH:-}"

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > "$LOG/gpu.txt" 2>&1
summary "gpu: $(tail -n +2 "$LOG/gpu.txt" | head -1); cores $(nproc)"

if [ -x "$ROOT/.carry/bin/libreyolo_gpu_tests" ] && [ "${LIBREYOLO_GPU_BUILD:-0}" != 1 ]; then
  BIN=$ROOT/.carry/bin
  export LIBREYOLO_CLI=$BIN/libreyolo  # the tests that start the CLI: not at the build's path here
  summary "binaries: prebuilt (.carry/bin)"
else
  export LIBREYOLO_SYSTEM_TORCH=1 LIBREYOLO_PY=python3 LIBREYOLO_BUILD_DIR=$ROOT/build-gpu
  export LIBREYOLO_JOBS=$(nproc) TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  t0=$(date +%s)
  if ! "$ROOT/scripts/build.sh" > "$LOG/build.log" 2>&1; then tail -40 "$LOG/build.log"; summary "build: FAILED"; exit 1; fi
  summary "build: ok in $(( $(date +%s) - t0 )) s"
  BIN=$LOG/bin; mkdir -p "$BIN"
  cp "$LIBREYOLO_BUILD_DIR/libreyolo" "$LIBREYOLO_BUILD_DIR/tests/libreyolo_gpu_tests" "$LIBREYOLO_BUILD_DIR"/bench/bench_* "$BIN/" 2>/dev/null
fi

run() {  # name, timeout, command...
  local name=$1 t=$2; shift 2
  local s=$(date +%s.%N)
  timeout "$t" "$@" > "$LOG/$name.json" 2> "$LOG/$name.log"
  local rc=$?
  summary "$name: rc=$rc $(python3 -c "print(round($(date +%s.%N)-$s,1))")s"
}

if want test; then
  run gpu_tests 400 "$BIN/libreyolo_gpu_tests" --gtest_output=json:"$LOG/gpu_tests_report.json"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |REPORT' "$LOG/gpu_tests.json" | tee -a "$LOG/summary.txt"
fi
want forward && {
  run forward_fp32 300 "$BIN/bench_forward" --device cuda --dtype fp32 --sizes t,s --batches 1,8,32 --iters 100 --warmup 10
  run forward_bf16 300 "$BIN/bench_forward" --device cuda --dtype bf16 --sizes t,s --batches 1,8,32 --iters 100 --warmup 10
  run forward_bf16_cl 300 "$BIN/bench_forward" --device cuda --dtype bf16 --channels-last --sizes t,s --batches 1,8,32 --iters 100 --warmup 10
}
want predict && {
  run predict 300 "$BIN/bench_predict" --device cuda --iters 100 --warmup 10
  run predict_graph_half 300 "$BIN/bench_predict" --device cuda --iters 100 --warmup 10 --cuda-graph on --half
}
# A folder of 1,000 640x480 JPEGs at batch 32, graphed fp16. On 2026-12-01 only the process that
# had just written the files reached ~1,550 img/s (others 410-540): the first run writes them, the
# next ones read them, then variants that test the suspects (OpenMP teams, malloc's mmap threshold).
want folder && {
  F="--device cuda --folder 1000 --batch 32 --half --cuda-graph on"
  rm -rf /tmp/libreyolo_bench_folder_1000
  run folder_writes 300 "$BIN/bench_predict" $F
  run folder_reads 300 "$BIN/bench_predict" $F
  OMP_NUM_THREADS=1 run folder_omp1 300 "$BIN/bench_predict" $F
  MALLOC_MMAP_THRESHOLD_=134217728 run folder_mmap 300 "$BIN/bench_predict" $F
  run folder_reads_again 300 "$BIN/bench_predict" $F
  run folder_batch1 300 "$BIN/bench_predict" --device cuda --folder 1000 --batch 1 --half --cuda-graph on
  for f in "$LOG"/folder_*.json; do
    summary "$(basename "$f" .json): $(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['img_per_s'],1), 'img/s')" "$f" 2>&1)"
  done
}
# The pooling kernels (LIBREYOLO_FUSED_POOL, on by default since this said they are faster): the
# graphed v9-t step with them off and on, twice each, same binary.
want pool && for r in 1 2; do for v in 0 1; do
  LIBREYOLO_FUSED_POOL=$v run pool_${v}_$r 300 "$BIN/bench_train_step" --device cuda --cudnn-benchmark --ema \
    ${LIBREYOLO_POOL_ARGS:---sizes t,s --batches 8,16,32} --dtypes bf16 --cuda-graph on --steps 30 --warmup 12
done; done
# The fused BatchNorm kernels alone over activation shapes, on the default and two other grids.
want bn && run bn_act 200 "$BIN/bench_bn_act" --grids auto,c8r8,c8r16
want step && {
  # LIBREYOLO_STEP_ARGS replaces the main table's arguments (e.g. fewer sizes, --fused both).
  run step 600 "$BIN/bench_train_step" --device cuda --cudnn-benchmark \
    ${LIBREYOLO_STEP_ARGS:---sizes t,s --batches 8,16,32 --dtypes bf16,fp16,fp32}
  [ -n "${LIBREYOLO_STEP_NCHW:-}" ] && run step_nchw 300 "$BIN/bench_train_step" --device cuda --cudnn-benchmark \
    --sizes t --batches 8,32 --dtypes bf16 --memory-format contiguous
  [ -n "${LIBREYOLO_STEP_AB:-}" ] && run step_ab 300 "$BIN/bench_train_step" --device cuda --cudnn-benchmark \
    --sizes t --batches 8 --dtypes bf16 --fused both
  run step_diag 300 "$BIN/bench_train_step" --device cuda --cudnn-benchmark --sizes t --batches 8 --dtypes bf16 \
    --diagnose --steps 12 ${LIBREYOLO_DIAG_ARGS:-}
}
# Whole-step CUDA graphs: eager and graphed from the same binary, in the same call.
# Timings without the kernel profile (Kineto leaves CUPTI attached, which slows every later launch
# of the process); kernels per step and GPU busy time in a second run of their own.
want graph && {
  run step_graph 500 "$BIN/bench_train_step" --device cuda --cudnn-benchmark --ema --no-kernels \
    ${LIBREYOLO_GRAPH_ARGS:---sizes t,s --batches 8,16,32 --dtypes bf16 --cuda-graph off,on --steps 30 --warmup 12}
  run step_graph_kernels 300 "$BIN/bench_train_step" --device cuda --cudnn-benchmark --ema \
    ${LIBREYOLO_GRAPH_KERNEL_ARGS:---sizes t --batches 8,32 --dtypes bf16 --cuda-graph on --steps 3 --warmup 6}
}
# Inference forward, eager vs one CUDA graph per shape (uint8 images on the device -> predictions).
want infer_graph && {
  run forward_graph_fp32 200 "$BIN/bench_forward" --device cuda --dtype fp32 --channels-last --sizes t --batches 1 \
    --cuda-graph off,on --iters 100 --warmup 10
  run forward_graph_bf16 200 "$BIN/bench_forward" --device cuda --dtype bf16 --channels-last --sizes t --batches 1,32 \
    --cuda-graph off,on --iters 100 --warmup 10
}
# BatchNorm folded into the convolutions for inference, before/after in one binary,
# then kernels per forward (a run of its own: the profiler slows later launches).
want fold && {
  run fold_fp32 200 "$BIN/bench_forward" --device cuda --dtype fp32 --channels-last --sizes t --batches 1 \
    --cuda-graph off,on --fold off,on --iters 100 --warmup 10
  run fold_bf16 200 "$BIN/bench_forward" --device cuda --dtype bf16 --channels-last --sizes t --batches 1,32 \
    --cuda-graph off,on --fold off,on --iters 100 --warmup 10
  run fold_kernels 200 "$BIN/bench_forward" --device cuda --dtype bf16 --channels-last --sizes t --batches 1 \
    --cuda-graph off --fold off,on --kernels --warmup 3
}
# cuDNN fused convolution + bias + SiLU for inference: off, then on with a fresh plan
# cache (plans compiled: first call cost), then on again (plans read from disk), twice; one process
# each, graphed v9-t bf16 at batch 1 and 32; single-image predict off/on.
want fusion && {
  PLANS=$(mktemp -d /tmp/libreyolo-plans.XXXXXX)
  for r in 1 2; do
    for v in off built disk; do
      f=1; [ $v = off ] && f=0
      [ $v = built ] && rm -rf "$PLANS" && mkdir -p "$PLANS"
      LIBREYOLO_CUDNN_FUSION=$f LIBREYOLO_CUDNN_PLAN_CACHE=$PLANS run fusion_${v}_$r 200 "$BIN/bench_forward" \
        --device cuda --dtype bf16 --channels-last --sizes t --batches 1,32 --cuda-graph on --iters 200 --warmup 10
    done
  done
  for v in 0 1; do
    LIBREYOLO_CUDNN_FUSION=$v LIBREYOLO_CUDNN_PLAN_CACHE=$PLANS run fusion_predict_$v 200 "$BIN/bench_predict" \
      --device cuda --iters 200 --warmup 20 --cuda-graph on --half
  done
}
# YOLOX beside YOLOv9: step times eager and graphed.
want yolox && for fam in yolox yolo9; do
  run step_${fam}_s 300 "$BIN/bench_train_step" --device cuda --cudnn-benchmark --ema --no-kernels --family $fam \
    --sizes s --batches 16,32 --dtypes bf16 --cuda-graph off,on --steps 24 --warmup 12
done
# The profiler's verdicts on real configurations, on the bench's 810x1080 JPEG dataset.
want verdicts && {
  E2E_DIR=/tmp/libreyolo_e2e_810x1080
  [ -f "$E2E_DIR/data.yaml" ] || timeout 200 "$BIN/bench_train_e2e" --device cuda --workers 16 --epochs 1 > /dev/null 2>&1
  P="$BIN/libreyolo profile run $E2E_DIR/data.yaml --device cuda:0 --imgsz 640 --amp-dtype bfloat16 --json"
  run prof_t16_w16 200 $P --size t --batch 16 --workers 16 --project "$LOG/prof_t16_w16"
  run prof_t16_w1 200 $P --size t --batch 16 --workers 1 --project "$LOG/prof_t16_w1"
  run prof_t16_w16_graph 200 $P --size t --batch 16 --workers 16 --cuda-graph --project "$LOG/prof_t16_w16_graph"
  run prof_c32_w16 300 $P --size c --batch 32 --workers 16 --project "$LOG/prof_c32_w16"
  run prof_t16_nocache 200 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 $P --size t --batch 16 --workers 16 --project "$LOG/prof_t16_nocache"
  python3 - "$LOG" <<'PY' | tee -a "$LOG/summary.txt"
import json, sys, glob, os
# The full analysis of each run (profile.json under its project), not only the --json headline.
for p in sorted(glob.glob(os.path.join(sys.argv[1], "prof_*", "prof", "profile.json"))):
    try: d = json.load(open(p))
    except Exception as e: print(p, "unreadable", e); continue
    keys = ("bound", "step_ms", "img_per_s", "gpu_util", "gpu_busy_ms_per_step", "kernels_per_step",
            "mean_kernel_us", "cuda_mallocs_per_step", "dataload_frac", "host_overhead_ms_per_step")
    print(p.split(os.sep)[-3], json.dumps({k: d.get(k) for k in keys}))
PY
}
want loss && run loss 300 "$BIN/bench_loss" --device cuda --batch 8,16,32 --iters 50
# Loader alone: per-stage table and threads, the default (mosaic tiles decoded at the
# JPEG DCT scale they are shown at) against the reference's full decode, then cache=ram.
want loader && {
  run loader 300 "$BIN/bench_loader" --count 512 --threads 1,4,8,16 --imgsz 640 --batch 16 --stages \
    --dir /tmp/libreyolo_bench_loader_512
  run loader_exact 300 "$BIN/bench_loader" --count 512 --threads 1,4,8,16 --imgsz 640 --batch 16 --stages \
    --exact-decode --dir /tmp/libreyolo_bench_loader_512
  run loader_ram 300 "$BIN/bench_loader" --count 512 --threads 8,16 --imgsz 640 --batch 16 --cache ram \
    --dir /tmp/libreyolo_bench_loader_512
  # The GPU loader (loader=gpu: nvJPEG decode, samples drawn by a CUDA kernel).
  run loader_gpu 300 "$BIN/bench_loader" --count 512 --threads 4,16 --imgsz 640 --batch 16 --gpu --stages \
    --dir /tmp/libreyolo_bench_loader_512
}
want e2e && {
  run e2e 400 "$BIN/bench_train_e2e" --device cuda --workers 8,16
  run e2e_bf16 300 "$BIN/bench_train_e2e" --device cuda --workers 16 --amp-dtype bfloat16
  run e2e_gpu_loader 300 "$BIN/bench_train_e2e" --device cuda --workers 16 --amp-dtype bfloat16 --epochs 3 \
    --cuda-graph on --set loader=gpu
}
# Cold start: a process's first predict and first training steps with an empty cuDNN plan cache, then
# the same with the cache those runs filled; the first predict also with plans built by the call (the
# library's behaviour before background builds), in a cache of its own.
want cold && {
  COLD=$(mktemp -d /tmp/libreyolo-cold.XXXXXX)
  for c in cold warm; do
    LIBREYOLO_CUDNN_PLAN_CACHE=$COLD/plans run predict_first_$c 200 "$BIN/bench_predict" --device cuda --plans background --iters 20 --warmup 3
    LIBREYOLO_CUDNN_PLAN_CACHE=$COLD/plans_wait run predict_first_wait_$c 200 "$BIN/bench_predict" --device cuda --plans wait --iters 20 --warmup 3
  done
  for c in cold warm; do  # the whole process, through the CLI
    t0=$(date +%s.%N)
    LIBREYOLO_CUDNN_PLAN_CACHE=$COLD/cli timeout 120 "$BIN/libreyolo" predict model=yolo9t device=0 source=SAMPLE_IMAGE \
      project=$COLD/runs > "$LOG/predict_cli_$c.log" 2>&1
    summary "predict_cli_$c: rc=$? process $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s"
  done
  # The first training steps: new convolution plans timed by the step (wait) or on a worker while
  # the first steps run on the heuristics' plans (background, the default); eager, then graphed
  # (two epochs: the second is the steady speed with the plans each mode chose). A throwaway run
  # first, so that no mode pays for reading the libraries from disk.
  E2E="$BIN/bench_train_e2e --device cuda --workers 16 --amp-dtype bfloat16 --dir $COLD/data"
  LIBREYOLO_CUDNN_PLAN_CACHE=$COLD/throwaway run train_first_throwaway 300 $E2E --images 256 --epochs 1
  for mode in wait background; do
    for c in cold warm; do
      LIBREYOLO_CUDNN_PLAN_BUILD=$mode LIBREYOLO_CUDNN_PLAN_CACHE=$COLD/train_$mode \
        run train_first_${mode}_$c 300 $E2E --images 256 --epochs 1
    done
    LIBREYOLO_CUDNN_PLAN_BUILD=$mode LIBREYOLO_CUDNN_PLAN_CACHE=$COLD/graphed_$mode \
      run train_first_graphed_${mode}_cold 300 $E2E --images 1024 --epochs 2 --cuda-graph on
  done
  # The plans each mode chose (read back from its folder), in the graphed step alone, alternated.
  for r in 1 2; do
    for mode in wait background; do
      LIBREYOLO_CUDNN_PLAN_CACHE=$COLD/graphed_$mode run train_step_plans_${mode}_$r 300 "$BIN/bench_train_step" \
        --device cuda --cudnn-benchmark --ema --sizes t --batches 16 --nc 8 --dtypes bf16 --cuda-graph on
    done
  done
  python3 - "$LOG" <<'PY' | tee -a "$LOG/summary.txt"
import json, sys, os
log = sys.argv[1]
for name in sorted(os.listdir(log)):
    if not name.endswith(".json") or not (name.startswith("predict_first") or name.startswith("train_first") or name.startswith("predict_cli") or name.startswith("train_step_plans")):
        continue
    try:
        d = json.load(open(os.path.join(log, name)))
    except Exception as e:
        print(name, "unreadable", e); continue
    if "results" in d and name.startswith("train_step_plans"):
        for r in d["results"]:
            print(name, r.get("model"), r.get("batch"), r.get("dtype"), "graphed" if r.get("cuda_graph") else "", "min", round(r.get("min_ms", -1), 3), "median", round(r.get("median_ms", -1), 3))
    elif "first_predict" in d:
        print(name, json.dumps(d["first_predict"]), "steady min", round(d["total"]["min_ms"], 3))
    elif "runs" in d or "first_steps_s" in json.dumps(d):
        runs = d.get("runs", [d])
        for r in runs:
            print(name, "setup", r.get("setup_s"), "first steps", r.get("first_steps_s"), "phases", json.dumps(r.get("first_step_phases_s")), "plans", json.dumps(r.get("cudnn_plans")),
                  "epochs", json.dumps([[e.get("epoch"), round(e.get("seconds", 0), 3), round(e.get("img_per_s", 0), 1)] for e in r.get("epochs", [])]))
    else:
        print(name, json.dumps(d))
PY
}
# End to end: eager vs graphed, profile off vs on (the profiler's cost once its window is over).
want e2e_graph && run e2e_graph 500 "$BIN/bench_train_e2e" --device cuda --workers 16 --amp-dtype bfloat16 \
  --epochs 3 --cuda-graph off,on ${LIBREYOLO_E2E_ARGS:-}
want dist && {
  [ "${LIBREYOLO_DIST_TESTS:-1}" = 1 ] && run dist_tests 500 "$BIN/libreyolo_gpu_tests" --gtest_filter='DistGpu*'
  [ "${LIBREYOLO_DIST_TESTS:-1}" = 1 ] && grep -E '^\[  (PASSED|FAILED|SKIPPED) |REPORT|^\[       OK|^\[  FAILED' "$LOG/dist_tests.json" | tee -a "$LOG/summary.txt"
  E2E_DIR=/tmp/libreyolo_e2e_810x1080
  [ -f "$E2E_DIR/data.yaml" ] || timeout 200 "$BIN/bench_train_e2e" --device cuda --workers 16 --epochs 1 > /dev/null 2>&1
  # Scaling at the same per-GPU batch (16), 640 px, bf16, 16 loader threads per rank.
  E="--workers 16 --epochs ${LIBREYOLO_DIST_EPOCHS:-3} --amp-dtype bfloat16"
  run scale_1gpu 400 "$BIN/bench_train_e2e" --device 0 --batch 16 $E
  run scale_2gpu_spawn 400 "$BIN/bench_train_e2e" --device 0,1 --batch 32 $E
  # The whole step captured in CUDA graphs with its all-reduces, on two GPUs.
  run scale_1gpu_graph 400 "$BIN/bench_train_e2e" --device 0 --batch 16 $E --set cuda_graph=true
  run scale_2gpu_graph 400 "$BIN/bench_train_e2e" --device 0,1 --batch 32 $E --set cuda_graph=true
  # The same with the small sums (SyncBN, loss normalisers) through NCCL instead of peer memory.
  run scale_2gpu_graph_nccl 400 env LIBREYOLO_PEER_SUM=0 "$BIN/bench_train_e2e" --device 0,1 --batch 32 $E --set cuda_graph=true
  run scale_2gpu_graph_nosyncbn 400 "$BIN/bench_train_e2e" --device 0,1 --batch 32 $E --set cuda_graph=true --set sync_bn=false
  # The same with the decoded, resized images cached on disk (cache=disk): what the
  # GPUs do once JPEG decoding is out of the way.
  [ "${LIBREYOLO_DIST_CACHE:-1}" = 1 ] && run scale_1gpu_cache 400 "$BIN/bench_train_e2e" --device 0 --batch 16 $E --set cache=disk
  [ "${LIBREYOLO_DIST_CACHE:-1}" = 1 ] && run scale_2gpu_spawn_cache 400 "$BIN/bench_train_e2e" --device 0,1 --batch 32 $E --set cache=disk
  if [ -n "${LIBREYOLO_DIST_DIAG:-}" ]; then  # where the time goes: SyncBN, loader threads, one rank
    # Loader workers at the training thread's priority (the default makes them 5 nicer).
    run scale_2gpu_spawn_nice0 400 env LIBREYOLO_LOADER_NICE=0 "$BIN/bench_train_e2e" --device 0,1 --batch 32 $E
    run scale_2gpu_nosyncbn 400 "$BIN/bench_train_e2e" --device 0,1 --batch 32 $E --set sync_bn=false
    [ -n "${LIBREYOLO_DIST_W8:-}" ] && run scale_2gpu_nosyncbn_w8 400 "$BIN/bench_train_e2e" --device 0,1 --batch 32 --workers 8 --epochs ${LIBREYOLO_DIST_EPOCHS:-3} --amp-dtype bfloat16 --set sync_bn=false
    PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    run group_of_one 400 env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$BIN/libreyolo" train model=yolo9t data=$E2E_DIR/data.yaml imgsz=640 epochs=${LIBREYOLO_DIST_EPOCHS:-3} workers=16 amp_dtype=bfloat16 val=false no_aug_epochs=0 exist_ok=true project=$LOG/g1 name=g1 batch=16
    grep -E "Epoch [0-9]+/" "$LOG/group_of_one.log" | sed "s/^/group_of_one: /" | tee -a "$LOG/summary.txt"
  fi
  TR=$(python3 -c 'import shutil;print(shutil.which("torchrun") or "")')
  A="train model=yolo9t data=$E2E_DIR/data.yaml imgsz=640 epochs=${LIBREYOLO_DIST_EPOCHS:-3} workers=16 amp_dtype=bfloat16 val=false no_aug_epochs=0 exist_ok=true project=$LOG/torchrun"
  if [ -n "$TR" ]; then
    run torchrun_2gpu 400 "$TR" --nproc_per_node=2 --no-python "$BIN/libreyolo" $A batch=32 device=0,1 name=one_node
    if [ "${LIBREYOLO_DIST_NODES:-1}" = 1 ]; then
      PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
      N="--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $PORT --no-python"
      CUDA_VISIBLE_DEVICES=1 timeout 400 "$TR" $N --node_rank 1 "$BIN/libreyolo" $A batch=32 name=two_nodes > "$LOG/torchrun_node1.log" 2>&1 &
      run torchrun_2nodes 400 env CUDA_VISIBLE_DEVICES=0 "$TR" $N --node_rank 0 "$BIN/libreyolo" $A batch=32 name=two_nodes
      wait
      summary "torchrun node 1 log tail: $(tail -2 "$LOG/torchrun_node1.log" | tr '\n' ' ')"
    fi
  else
    summary "torchrun: not found on this machine"
  fi
  for f in torchrun_2gpu torchrun_2nodes; do
    grep -E "DDP active|Epoch [0-9]+/|Error|error" "$LOG/$f.log" | head -8 | sed "s/^/$f: /" | tee -a "$LOG/summary.txt"
  done
}
python3 - "$LOG" <<'PY' | tee -a "$LOG/summary.txt"
import json, sys, os, glob
log = sys.argv[1]
for path in sorted(glob.glob(os.path.join(log, "*.json"))):
    name = os.path.basename(path)[:-5]
    if name.endswith("_report"): continue
    try: d = json.load(open(path))
    except Exception: continue
    for r in d.get("results", []) if isinstance(d.get("results"), list) else []:
        print(name, json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}))
    st = d.get("stages")
    if isinstance(st, dict):
        ms = {k: round(v["ms_per_sample"], 2) for k, v in st.get("ms_per_sample", {}).items() if v["ms_per_sample"] > 0.001}
        print(name, "stages", json.dumps({"ms_per_sample": ms, "wall_ms_per_sample": st.get("wall_ms_per_sample"),
                                          "output_hash": st.get("output_hash")}))
    if "runs" in d:
        for r in d["runs"]: print(name, json.dumps(r))
    if "total" in d: print(name, json.dumps({k: d[k] for k in ("total", "preprocess", "inference", "postprocess")}))
PY
