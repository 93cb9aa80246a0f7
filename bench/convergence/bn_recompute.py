#!/usr/bin/env python3
"""Validate a run's epoch checkpoints before and after their BatchNorm running statistics are
recomputed from plain training images: tells a dip in the weights from a dip in the statistics.

    python3 bench/convergence/bn_recompute.py --run RUN_DIR --data DIR/data.yaml \
        [--epochs 7,8,9] [--images 256] [--imgsz 320] [--device cuda] --out bn.json

RUN_DIR/weights/epoch_<N>.pt must exist (train with save_period=1). The checkpoints may be ours or
the reference's: both are read by the reference package (LibreYOLO 1.6.0, importable), whose
validator scores them, so the two implementations are measured by one ruler. For each epoch:

* `val`: mAP50-95, mAP50 and recall as saved;
* `val_recomputed`: the same after every BatchNorm's running mean and variance are replaced by
  the plain average over the first --images training images (decoded in full, letterboxed to
  imgsz with grey 114, RGB / 255, no augmentation), forward passes in training mode without
  gradients;
* `worst_mean_shift`: the layers whose saved running mean lies furthest from the recomputed
  one, in recomputed standard deviations, and the log-ratio of their variances.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import cv2
import numpy as np
import torch
import torch.nn as nn
from libreyolo import LibreYOLO


def letterboxed(paths, imgsz, device):
    xs = []
    for p in paths:
        im = cv2.imread(p)[:, :, ::-1]
        h, w = im.shape[:2]
        r = imgsz / max(h, w)
        im = cv2.resize(im, (round(w * r), round(h * r)), interpolation=cv2.INTER_LINEAR)
        canvas = np.full((imgsz, imgsz, 3), 114, np.uint8)
        canvas[: im.shape[0], : im.shape[1]] = im
        xs.append(torch.from_numpy(canvas.copy()).permute(2, 0, 1).float() / 255)
    return torch.stack(xs).to(device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", default="7,8,9")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    root = os.path.dirname(os.path.abspath(a.data))
    paths = sorted(glob.glob(os.path.join(root, "images", "train", "*.jpg")))[: a.images]
    if not paths:
        raise SystemExit(f"no training JPEGs under {root}/images/train")
    val_device = "0" if a.device == "cuda" else a.device
    result = {"run": a.run, "data": a.data, "images": len(paths), "epochs": {}}
    for e in [int(x) for x in a.epochs.split(",")]:
        ckpt = os.path.join(a.run, "weights", f"epoch_{e}.pt")

        def validate(model, tag):
            r = model.val(data=a.data, imgsz=a.imgsz, batch=a.batch, device=val_device, verbose=False,
                          plots=False, project="/tmp/bn_recompute", name=f"{tag}_{e}", exist_ok=True)
            return {k: round(float(r[k]), 4) for k in ("metrics/mAP50-95", "metrics/mAP50", "metrics/recall") if k in r}

        row = {"val": validate(LibreYOLO(ckpt, device=a.device), "saved")}
        model = LibreYOLO(ckpt, device=a.device)  # a fresh copy: validation may fuse the layers
        net = model.model
        bns = [(n, m) for n, m in net.named_modules() if isinstance(m, nn.BatchNorm2d)]
        saved = {n: (m.running_mean.clone(), m.running_var.clone()) for n, m in bns}
        for _, m in bns:
            m.reset_running_stats()
            m.momentum = None  # a plain average over every batch
        net.train()
        with torch.no_grad():
            for i in range(0, len(paths), a.batch):
                net(letterboxed(paths[i:i + a.batch], a.imgsz, a.device))
        net.eval()
        shifts = []
        for n, m in bns:
            mean, var = saved[n]
            sd = m.running_var.clamp_min(1e-8).sqrt()
            shifts.append((float(((mean - m.running_mean).abs() / sd).max()),
                           float((var / m.running_var.clamp_min(1e-8)).log().abs().max()), n))
        shifts.sort(reverse=True)
        row["worst_mean_shift"] = [{"layer": n, "sd": round(s, 3), "var_log_ratio": round(v, 3)} for s, v, n in shifts[:6]]
        row["val_recomputed"] = validate(model, "recomputed")
        result["epochs"][str(e)] = row
        print(e, json.dumps(row), flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
