#!/usr/bin/env python3
"""Write one set of starting weights for both implementations (`--init` of run_ours.py and
run_reference.py): the reference's (LibreYOLO 1.6.0) freshly built network for a model, class
count and seed, saved as a LibreYOLO checkpoint, which both read.

    python3 bench/convergence/make_init.py --model picodet-s --data DIR/data.yaml --seed 0 --out init.pt

With it, two runs differ only in what each implementation does from the same weights (the
initialisation draws otherwise differ even where the distributions are the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from run_reference import parse_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="the data.yaml whose class count the head gets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch
    import libreyolo

    family, size = parse_model(a.model)
    classes = {"yolo9": "LibreYOLO9", "yolox": "LibreYOLOX", "yolo7": "LibreYOLO7", "rtmdet": "LibreRTMDet",
               "picodet": "LibrePICODET", "rtdetr": "LibreRTDETR", "rtdetrv2": "LibreRTDETRv2"}
    cls = getattr(libreyolo, classes[family])
    nc = len(common.data_names(a.data))
    torch.manual_seed(a.seed)
    if family in ("rtdetr", "rtdetrv2"):
        model = cls._from_scratch(size=size, nb_classes=nc, device="cpu", seed=a.seed)
    else:
        model = cls(None, size=size, nb_classes=nc, device="cpu")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    model.save(a.out)
    print(f"{a.model} nc={nc} seed={a.seed}: {sum(p.numel() for p in model.model.parameters())} parameters -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
