#!/usr/bin/env python3
"""Train the reference Python implementation (LibreYOLO 1.6.0, PyPI `libreyolo==1.6.0`) from
scratch on a data.yaml and write the benchmark's per-run JSON (see common.py).

    python3 bench/convergence/run_reference.py --data DIR/data.yaml --out ref.json \
        [--model yolo9t|yolox-s|rtdetr-r18] [--epochs 30] [--batch 16] [--imgsz 320] [--workers 8] \
        [--seed 0] [--device 0] [--project runs/conv] [--name ref_yolo9t_s0] [--set colour]

What it does, with the reference's public API:

* builds an untrained model of the requested family and size with the family's class
  (`LibreYOLO9(None, size="t", nb_classes=nc)` / `LibreYOLOX(None, size="s", ...)`; RT-DETR:
  `LibreRTDETR._from_scratch(size="r18", ...)`, its build without the ImageNet backbone). A
  weights file is never named, so nothing is downloaded (the `LibreYOLO("...pt")` factory would
  try to fetch missing weights; the classes themselves do not, except RT-DETR's default build).
* calls `model.train(data=..., epochs, batch, imgsz, workers, seed, device, project, name,
  exist_ok=True, eval_interval=1, pretrained=False)`. `pretrained=False` is the reference's
  own from-scratch path (the same one its CLI takes for `pretrained=false`): the network is
  re-initialised with `seed` before training, and no transfer weights are loaded.
  `eval_interval=1` is the one departure from the reference's defaults (its default is 10):
  the benchmark needs mAP after every epoch. Everything else (optimizer, schedule,
  augmentation, no-aug epochs, EMA, AMP, ...) is the family's own default.
* `wall_s` is the `train()` call, start to end (dataset scan, training, per-epoch
  validation, checkpoints); `build_and_train_s` adds the model's construction (where the
  CUDA context is created), `process_s` also the imports. Ours' `wall_s` is its whole
  process, so it includes the equivalents of all three (a few seconds at most).
* reads the per-epoch rows the reference writes into its run directory: `metrics.jsonl`
  (written for every family), else `results.csv` (YOLOv9 only), else the `epoch_metrics`
  list `train()` returns. Columns: `train/loss`, `train/<term>_loss`, `metrics/mAP50`,
  `metrics/mAP50-95`, `validated`, `time`.

`--opt key=value` passes one more training option (e.g. `--opt amp=false`); values are
parsed as YAML scalars. `--set` only labels the dataset in the JSON. The reference package must be importable (`pip install --no-deps
libreyolo-1.6.0-*.whl` plus its dependencies; gpu_run.sh puts them on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
import traceback
from pathlib import Path

T_START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

REF_VERSION = "1.6.0"


def parse_model(name: str) -> tuple[str, str]:
    """'yolo9t', 'yolo9-t', 'LibreYOLO9t', 'yolox-s', 'resnet18', 'mobilenetv4s', 'efficientnetv2-b0'
    -> (family, size)."""
    s = name.strip().lower()
    s = re.sub(r"\.pt$", "", s)
    if s.startswith("libreyolo"):
        s = "yolo" + s[len("libreyolo"):]
    m = re.fullmatch(r"(yolo9|yolox|yolo7|rtdetrv2|rtdetrv4|rtdetr|dfine|deim|rtmdet|picodet|resnet|mobilenetv4|"
                     r"efficientnetv2)"
                     r"[-_]?([a-z0-9]*)", s)
    if not m:
        raise SystemExit(f"unknown model '{name}': expected yolo9<t|s|m|c>, yolox-<n|t|s|m|l|x>, "
                         "yolo7-b, rtdetr-<r18|r34|r50|r50m|r101|l|x>, rtdetrv2-<r18|r34|r50|r50m|r101>, "
                         "rtdetrv4-<s|m|l|x>, dfine-<n|s|m|l|x>, deim-<n|s|m|l|x>, "
                         "rtmdet-<t|s|m|l|x>, picodet-<s|m|l>, resnet<18|34|50|101>, mobilenetv4<s|m|l> "
                         "or efficientnetv2-<b0|b1|b2|b3>")
    family = m.group(1)
    size = m.group(2) or {"yolo9": "t", "yolox": "s", "yolo7": "b", "rtdetr": "r18", "rtdetrv2": "r18",
                            "rtdetrv4": "s", "dfine": "s", "deim": "s",
                            "rtmdet": "s", "picodet": "s", "resnet": "50", "mobilenetv4": "s",
                            "efficientnetv2": "b0"}[family]
    return family, size


# The reference's model class of each family (`libreyolo.<name>`).
MODEL_CLASSES = {"yolo9": "LibreYOLO9", "yolox": "LibreYOLOX", "yolo7": "LibreYOLO7", "rtmdet": "LibreRTMDet",
                 "picodet": "LibrePICODET", "rtdetr": "LibreRTDETR", "rtdetrv2": "LibreRTDETRv2",
                 "dfine": "LibreDFINE", "deim": "LibreDEIM", "rtdetrv4": "LibreRTDETRv4",
                 "resnet": "LibreResNet", "mobilenetv4": "LibreMobileNetV4", "efficientnetv2": "LibreEfficientNetV2"}


def model_class(family: str):
    import libreyolo

    return getattr(libreyolo, MODEL_CLASSES[family])


def parse_set(items: list[str]) -> dict:
    import yaml

    out = {}
    for it in items:
        if "=" not in it:
            raise SystemExit(f"--set takes key=value, got '{it}'")
        k, v = it.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train LibreYOLO 1.6.0 from scratch; write per-epoch mAP JSON.")
    common.add_run_arguments(ap, "ref", "one more training option for model.train()")
    a = ap.parse_args(argv)

    family, size = parse_model(a.model)
    name = a.name or f"ref_{a.model}_s{a.seed}"
    data = str(Path(a.data).resolve())
    record = {
        **common.run_record("ref", a, data, parse_set(a.opt)),
        "family": family,
        "size": size,
        "wall_s": None,
        "process_s": None,
        "run_dir": None,
        "source": None,
        "ok": False,
        "per_epoch": [],
    }

    # SIGTERM (gpu_run.sh's deadline, `timeout`) ends the run through the except clause below,
    # which still writes the JSON with the epochs finished so far.
    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}: run stopped before the end")

    signal.signal(signal.SIGTERM, on_term)
    t_train = None
    try:
        import torch
        import libreyolo

        version = getattr(libreyolo, "__version__", None)
        record["versions"] = {"libreyolo": version, "torch": torch.__version__, "python": sys.version.split()[0]}
        if version != REF_VERSION:
            print(f"warning: libreyolo {version} imported from {libreyolo.__file__}, expected {REF_VERSION}",
                  file=sys.stderr)
        cls = model_class(family)
        names = common.data_names(data)
        t_build = time.perf_counter()
        if a.init:
            # The given weights, kept: pretrained=True below (no re-initialisation).
            model = cls(str(Path(a.init).resolve()), size=size, nb_classes=len(names), device=a.device)
        elif family in ("rtdetr", "rtdetrv2"):
            # Its from-scratch build: no ImageNet backbone download, every backbone norm trained
            # (what ours builds from a model name).
            model = cls._from_scratch(size=size, nb_classes=len(names), device=a.device, seed=a.seed)
        else:
            model = cls(None, size=size, nb_classes=len(names), device=a.device)
        kwargs = dict(
            data=data,
            epochs=a.epochs,
            batch=a.batch,
            imgsz=a.imgsz,
            workers=a.workers,
            seed=a.seed,
            device=a.device,
            project=str(Path(a.project).resolve()),
            name=name,
            exist_ok=True,
            pretrained=bool(a.init),
            eval_interval=a.eval_interval,
        )
        kwargs.update(record["extra_options"])
        record["train_kwargs"] = {k: v for k, v in kwargs.items()}
        print(f"[run_reference] {cls.__name__}({a.init!r}, size={size!r}, nb_classes={len(names)}).train({kwargs})",
              file=sys.stderr, flush=True)

        t_train = time.perf_counter()
        results = model.train(**kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        record["wall_s"] = time.perf_counter() - t_train
        record["build_and_train_s"] = time.perf_counter() - t_build  # + model construction (CUDA init)

        run_dir = Path(results.get("save_dir") or Path(a.project) / name)
        record["run_dir"] = str(run_dir)
        rows, source = common.read_run_dir(run_dir)
        if not rows and results.get("epoch_metrics"):
            rows = common.dedupe([common.normalise_row(m) for m in results["epoch_metrics"]])
            source = "train() return value"
        record["per_epoch"] = rows
        record["source"] = source
        record["best_mAP50_95"] = results.get("best_mAP50_95")
        record["best_epoch"] = results.get("best_epoch")
        record["ok"] = len(rows) > 0 and rows[-1]["epoch"] >= a.epochs
        if not rows:
            record["error"] = f"no per-epoch rows found in {run_dir}"
        elif not record["ok"]:
            record["error"] = f"stopped after epoch {rows[-1]['epoch']} of {a.epochs}"
    except BaseException as e:  # record the failure (and the epochs done so far), then re-raise
        record["error"] = f"{type(e).__name__}: {e}"
        record["traceback"] = traceback.format_exc()
        record["process_s"] = time.perf_counter() - T_START
        if record["wall_s"] is None and t_train is not None:
            record["wall_s"] = time.perf_counter() - t_train  # up to the failure: not a whole run
        run_dir = Path(a.project).resolve() / name  # exist_ok=True: the reference uses project/name as is
        try:
            rows, source = common.read_run_dir(run_dir)
        except Exception:  # a half-written file: keep what the JSON has
            rows, source = [], None
        if rows and not record["per_epoch"]:
            record.update(per_epoch=rows, source=source, run_dir=str(run_dir))
        record["ok"] = False
        common.write_json(Path(a.out), record)
        raise
    record["process_s"] = time.perf_counter() - T_START
    common.write_json(Path(a.out), record)
    last = record["per_epoch"][-1] if record["per_epoch"] else {}
    print(f"[run_reference] {a.model} seed {a.seed}: {len(record['per_epoch'])} epochs, "
          f"final {common.score_text(last)}, wall {record['wall_s']:.1f} s -> {a.out}", file=sys.stderr)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
