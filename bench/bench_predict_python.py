#!/usr/bin/env python3
"""Predict of one JPEG through the Python package, timed as bench_predict times the C++ call.

Prints JSON: the whole Python call (`model(path, ...)`, results converted to Python objects
included), min and median over --iters after --warmup, and the C++ stages the results report
(preprocess, inference, postprocess). Run it beside `bench_predict` on the same image, model and
options in the same call: the difference of the two `total` figures is the package's overhead.

    python3 bench/bench_predict_python.py --image /tmp/libreyolo_bench_640x480.jpg --model yolo9t \
        --device cuda [--cuda-graph on] [--half] [--iters 100] [--warmup 10]
"""
import argparse
import json
import statistics
import time

import torch  # noqa: F401  (loads LibTorch's libraries before the package's core)
from libreyolo_cpp import LibreYOLO


def stat(values):
    return {"min_ms": min(values), "median_ms": statistics.median(values)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--model", default="yolo9t")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cuda-graph", default="off")
    ap.add_argument("--half", action="store_true")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--warmup-s", type=float, default=3.0,
                    help="warm up for at least this long too: the device JPEG decoder starts on a thread "
                         "of its own after the first call (bench_predict waits for it explicitly)")
    a = ap.parse_args()
    model = LibreYOLO(a.model, device=a.device)
    kw = {"half": a.half}
    if a.cuda_graph != "off":
        kw["cuda_graph"] = a.cuda_graph
    t_end = time.perf_counter() + a.warmup_s
    done = 0
    while done < max(a.warmup, 1) or time.perf_counter() < t_end:
        model(a.image, **kw)
        done += 1
    total, stages = [], {"preprocess": [], "inference": [], "postprocess": []}
    for _ in range(a.iters):
        t0 = time.perf_counter()
        r = model(a.image, **kw)
        total.append((time.perf_counter() - t0) * 1e3)
        for k in stages:
            stages[k].append(r[0].speed[k + "_ms"])
    print(json.dumps({"benchmark": "predict_one_jpeg_python", "model": a.model, "device": a.device,
                      "cuda_graph": a.cuda_graph, "half": a.half, "iters": a.iters, "total": stat(total),
                      **{k: stat(v) for k, v in stages.items()}}, indent=2))


if __name__ == "__main__":
    main()
