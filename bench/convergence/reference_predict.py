#!/usr/bin/env python3
"""The reference's (LibreYOLO 1.6.0's) predict latency on one JPEG, for the side-by-side predict
figures: for each model x cuda_graph setting, a from-scratch model (no download) predicts the same
image file `--iters` times after `--warmup` untimed calls; each call is the whole `model(path)`
(decode, preprocessing, forward, postprocess), timed on the host with the GPU synchronised after it.
Prints one JSON object with the first call, min, median and mean in milliseconds.

    python3 bench/convergence/reference_predict.py --image /tmp/libreyolo_bench_640x480.jpg \\
        --models rtdetr-r18,yolo9t --graphs off,on [--device 0] [--iters 100] [--warmup 10]

Comparable with `bench_predict` (same image, same whole-call timing).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_step import new_model  # noqa: E402
from run_reference import parse_model  # noqa: E402

CLASSIFIERS = ("resnet", "mobilenetv4", "efficientnetv2")


def one_run(a, model_name: str, graph: bool) -> dict:
    import torch

    record = {"model": model_name, "cuda_graph": graph, "image": a.image, "iters": a.iters, "warmup": a.warmup}
    try:
        # The class count of a fresh model by name in ours: 1000 for a classifier, 80 for a detector.
        model = new_model(model_name, 1000 if parse_model(model_name)[0] in CLASSIFIERS else 80, a.device)
        # A fresh classifier is left in training mode by its constructor (1.6.0), where BatchNorm
        # refuses a batch of one; a loaded one is in eval mode. Predict in eval mode, as loaded.
        if getattr(model, "model", None) is not None:
            model.model.eval()
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        kwargs = {"conf": 0.25}
        if graph:
            kwargs["cuda_graph"] = True
        times = []
        for i in range(a.warmup + a.iters):
            t0 = time.perf_counter()
            model(a.image, **kwargs)
            sync()
            dt = (time.perf_counter() - t0) * 1000.0
            if i == 0:
                record["first_ms"] = dt
            if i >= a.warmup:
                times.append(dt)
        record.update({"ok": True, "min_ms": min(times), "median_ms": statistics.median(times),
                       "mean_ms": statistics.fmean(times)})
    except Exception as e:  # one failed setting is reported, the others still run
        record.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
    print(f"[reference_predict] {json.dumps(record)}", file=sys.stderr, flush=True)
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", required=True)
    p.add_argument("--models", default="rtdetr-r18")
    p.add_argument("--graphs", default="off,on")
    p.add_argument("--device", default="0")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args()
    import libreyolo

    out = {"benchmark": "reference_predict", "libreyolo": getattr(libreyolo, "__version__", None), "results": []}
    for m in a.models.split(","):
        for g in a.graphs.split(","):
            out["results"].append(one_run(a, m, g == "on"))
    print(json.dumps(out, indent=2))
    return 0 if all(r["ok"] for r in out["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
