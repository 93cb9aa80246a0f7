#!/usr/bin/env python3
"""The reference's (LibreYOLO 1.6.0's) training step time, from its own profiler, for the side-by-side
step figures of a family: for each model x batch x cuda_graph setting, a from-scratch model trains on
generated data with `profile=True, profile_then_stop=True` (5 warm-up steps discarded, 20 measured)
and the run's `profile_summary.json` gives the real (unsynchronised) step, the data-loader wait and
the rest (`compute_ms`). Prints one JSON object; the runs' folders stay under --project.

    python3 bench/convergence/reference_step.py --data DATA.yaml --models rtdetr-r18 \\
        --batches 4,8 --graphs off,on --imgsz 640 --amp-dtype bfloat16 [--device 0] [--workers 8]

Comparable with `bench_train_step` (one batch replayed, no loader) through `compute_ms`, and with
`bench_train_e2e` through `step_ms`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_reference import model_class, parse_model  # noqa: E402


def new_model(model_name: str, nc: int, device: str):
    """A from-scratch reference model of `model_name` (no weights downloaded)."""
    family, size = parse_model(model_name)
    cls = model_class(family)
    if family in ("rtdetr", "rtdetrv2"):
        return cls._from_scratch(size=size, nb_classes=nc, device=device, seed=0)
    return cls(None, size=size, nb_classes=nc, device=device)


def one_run(a, model_name: str, batch: int, graph: bool) -> dict:
    import torch

    family, size = parse_model(model_name)
    import common  # noqa: E402  (this folder)

    nc = len(common.data_names(a.data))
    name = f"refstep_{family}{size}_b{batch}_{'graph' if graph else 'eager'}"
    record = {"model": model_name, "batch": batch, "cuda_graph": graph, "imgsz": a.imgsz, "amp_dtype": a.amp_dtype}
    t0 = time.perf_counter()
    try:
        model = new_model(model_name, nc, a.device)
        results = model.train(data=a.data, epochs=a.epochs, batch=batch, imgsz=a.imgsz, workers=a.workers, seed=0,
                              device=a.device, project=str(Path(a.project).resolve()), name=name, exist_ok=True,
                              pretrained=False, amp=a.amp_dtype != "off", cuda_graph=graph, profile=True,
                              profile_then_stop=True, profile_open=False, eval_interval=1000,
                              **({"amp_dtype": a.amp_dtype} if a.amp_dtype != "off" else {}))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        run_dir = Path(results.get("save_dir") or Path(a.project) / name)
        summary = json.loads((run_dir / "profile_summary.json").read_text())
        record.update({"ok": True, "run_dir": str(run_dir), "real": summary.get("real"),
                       "verdict": summary.get("verdict"), "wall_s": time.perf_counter() - t0})
    except Exception as e:  # one failed setting is reported, the others still run
        record.update({"ok": False, "error": f"{type(e).__name__}: {e}", "wall_s": time.perf_counter() - t0})
    print(f"[reference_step] {json.dumps(record)}", file=sys.stderr, flush=True)
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--models", default="rtdetr-r18")
    p.add_argument("--batches", default="4,8")
    p.add_argument("--graphs", default="off,on")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--amp-dtype", default="bfloat16", help="bfloat16, float16 or off")
    p.add_argument("--device", default="0")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3, help="enough epochs to hold warm-up + measured steps")
    p.add_argument("--project", default="/tmp/reference_step")
    a = p.parse_args()
    import libreyolo

    out = {"benchmark": "reference_train_step", "libreyolo": getattr(libreyolo, "__version__", None),
           "data": a.data, "results": []}
    for m in a.models.split(","):
        for b in a.batches.split(","):
            for g in a.graphs.split(","):
                out["results"].append(one_run(a, m, int(b), g == "on"))
    print(json.dumps(out, indent=2))
    return 0 if all(r["ok"] for r in out["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
