"""Shared pieces of the convergence benchmark: the per-run JSON shape, and reading the
per-epoch rows both implementations write (results.csv; the reference also writes the same
rows as metrics.jsonl for every model family).

A run's JSON (written by run_reference.py and run_ours.py, read by compare.py):

    {
      "impl": "ref" | "ours",
      "model": "yolo9t",            # the benchmark's model name
      "set": "colour",              # dataset label (free text, from --set), or null
      "data": "/abs/data.yaml",
      "seed": 0, "epochs": 30, "batch": 16, "imgsz": 320, "workers": 8, "device": "0",
      "wall_s": 123.4,              # whole training run (see each runner for what it spans)
      "run_dir": "...",             # the implementation's run directory
      "source": "results.csv",      # where the per-epoch rows were read from
      "ok": true,                   # false: the run failed (exit status / exception in "error")
      "per_epoch": [
        {"epoch": 1, "loss": 5.1, "loss_terms": {"box": 1.2, "cls": 2.0, "dfl": 1.9},
         "map50": 0.01, "map50_95": 0.003, "top1": null, "validated": true, "epoch_s": 3.2}, ...
      ],                            # a classification run: "top1" (accuracy), mAPs null
      ...                           # runner-specific extras (versions, command, ...)
    }
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

MAP50_95_KEYS = ("metrics/mAP50-95", "metrics/mAP50-95(B)")
MAP50_KEYS = ("metrics/mAP50", "metrics/mAP50(B)")
TOP1_KEYS = ("metrics/accuracy_top1",)


def _num(v):
    """A float from a CSV/JSON cell, or None for empty, missing or non-finite cells."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        f = float(v)
    else:
        s = str(v).strip()
        if not s or s.lower() in ("none", "nan", "null"):
            return None
        try:
            f = float(s)
        except ValueError:
            return None
    return f if math.isfinite(f) else None


def _truthy(v) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes")


def _first(row: dict, keys):
    for k in keys:
        if k in row:
            v = _num(row[k])
            if v is not None:
                return v
    return None


def loss_term_name(column: str) -> str | None:
    """'train/box_loss' -> 'box'; None for the total ('train/loss') and non-loss columns."""
    if not column.startswith("train/") or column == "train/loss":
        return None
    name = column[len("train/"):]
    return name[: -len("_loss")] if name.endswith("_loss") else name


def normalise_row(row: dict) -> dict:
    """One results.csv / metrics.jsonl row -> the benchmark's per-epoch record."""
    terms = {}
    for k, v in row.items():
        t = loss_term_name(str(k))
        if t is not None and _num(v) is not None:
            terms[t] = _num(v)
    map50_95 = _first(row, MAP50_95_KEYS)
    map50 = _first(row, MAP50_KEYS)
    top1 = _first(row, TOP1_KEYS)  # classification runs
    validated = _truthy(row["validated"]) if "validated" in row else (map50_95 is not None or top1 is not None)
    return {
        "epoch": int(float(row["epoch"])),
        "loss": _num(row.get("train/loss")),
        "loss_terms": terms,
        "map50": map50 if validated else None,
        "map50_95": map50_95 if validated else None,
        "top1": top1 if validated else None,
        "validated": bool(validated),
        "epoch_s": _num(row.get("time")),
    }


def score_text(row: dict) -> str:
    """'mAP50-95 0.41' or 'top-1 0.93' (a classification row) for progress lines."""
    if row.get("map50_95") is None and row.get("top1") is not None:
        return f"top-1 {row['top1']}"
    return f"mAP50-95 {row.get('map50_95')}"


def read_results_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("epoch")]
    return dedupe([normalise_row(r) for r in rows])


def read_metrics_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(normalise_row(json.loads(line)))
    return dedupe(rows)


def dedupe(rows: list[dict]) -> list[dict]:
    """One record per epoch (the last written wins), in epoch order."""
    by_epoch = {}
    for r in rows:
        by_epoch[r["epoch"]] = r
    return [by_epoch[e] for e in sorted(by_epoch)]


def read_run_dir(run_dir: Path, prefer=("metrics.jsonl", "results.csv")) -> tuple[list[dict], str | None]:
    for name in prefer:
        p = Path(run_dir) / name
        if p.is_file() and p.stat().st_size > 0:
            reader = read_metrics_jsonl if name.endswith(".jsonl") else read_results_csv
            return reader(p), name
    return [], None


def write_json(path: Path, obj: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


def data_names(data_yaml: str) -> list[str]:
    """Class names of a data.yaml (list or {id: name} mapping), read with PyYAML; of a
    classification folder (data=DIR), its train/ class folders in sorted order."""
    if Path(data_yaml).is_dir():
        return sorted(p.name for p in (Path(data_yaml) / "train").iterdir() if p.is_dir())
    import yaml

    with open(data_yaml) as f:
        doc = yaml.safe_load(f)
    names = doc.get("names")
    if isinstance(names, dict):
        return [str(names[k]) for k in sorted(names, key=int)]
    if isinstance(names, list):
        return [str(n) for n in names]
    nc = int(doc.get("nc", 0))
    return [f"class{i}" for i in range(nc)]


def add_run_arguments(ap, impl: str, opt_help: str) -> None:
    """The options both runners take (`impl` names the default run directory's prefix)."""
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="the per-run JSON to write")
    ap.add_argument("--model", default="yolo9t")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="0", help="0, cuda:0, cpu")
    ap.add_argument("--project", default="runs/convergence")
    ap.add_argument("--name", default=None, help=f"run directory name (default {impl}_<model>_s<seed>)")
    ap.add_argument("--eval-interval", type=int, default=1)
    ap.add_argument("--set", dest="label", default=None, help="dataset label stored in the JSON")
    ap.add_argument("--concurrent", type=int, default=1,
                    help="runs sharing the GPU at the same time (recorded: their wall times are not comparable)")
    ap.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help=opt_help)
    ap.add_argument("--init", default=None, metavar="FILE",
                    help="start from these weights (make_init.py) instead of a fresh initialisation, so that both "
                         "implementations start from the same network")


def run_record(impl: str, a, data: str, extra_options) -> dict:
    """The fields every per-run JSON starts with (from the runner's parsed options)."""
    return {
        "impl": impl,
        "model": a.model,
        "set": a.label,
        "data": data,
        "seed": a.seed,
        "epochs": a.epochs,
        "batch": a.batch,
        "imgsz": a.imgsz,
        "workers": a.workers,
        "device": a.device,
        "eval_interval": a.eval_interval,
        "concurrent": a.concurrent,
        "extra_options": extra_options,
        "init": str(Path(a.init).resolve()) if a.init else None,
    }
