"""How the reference implementation (LibreYOLO 1.6.0) initialises a fresh model of each family,
as per-tensor statistics, for the test that ours starts training from the same distributions.

A from-scratch run of the reference starts from its model class built with no weights
(`LibreYOLO9(None, size="t", nb_classes=3)`, ...), plus what its trainer does to a fresh head
before the first step: YOLOX's trainer sets the class and objectness biases to the 0.01 prior
(`head.initialize_biases(0.01)`), YOLOv7's `train()` does the same to its detection convolutions.
For every floating-point tensor of the state dict: its element count, the mean and standard
deviation (population) of its finite values and the count of the others (an anchor table's
infinities), the model built after torch.manual_seed(0) with 3 classes.

Writes tests/data/reference_init_stats.json (or --out):
  {"<family>-<size>": [[name, numel, mean, std, non-finite count], ...], ...}

    PYTHONPATH=<dir holding libreyolo 1.6.0> python tests/python/make_init_stats.py
"""

import argparse
import json
from pathlib import Path

import torch

import libreyolo

# family, size, the reference's class. RT-DETR (v1) is left out: its from-scratch build loads a
# pretrained ResNet backbone from the network.
MODELS = [
    ("yolo9", "t", "LibreYOLO9"),
    ("yolox", "s", "LibreYOLOX"),
    ("yolo7", "b", "LibreYOLO7"),
    ("rtmdet", "t", "LibreRTMDet"),
    ("picodet", "s", "LibrePICODET"),
    ("rtdetrv2", "r18", "LibreRTDETRv2"),
    ("dfine", "n", "LibreDFINE"),
    ("deim", "n", "LibreDEIM"),
    ("rtdetrv4", "s", "LibreRTDETRv4"),
    ("resnet", "18", "LibreResNet"),
    ("mobilenetv4", "s", "LibreMobileNetV4"),
    ("efficientnetv2", "b0", "LibreEfficientNetV2"),
]


def fresh(family: str, size: str, cls: str) -> torch.nn.Module:
    torch.manual_seed(0)
    wrapper = getattr(libreyolo, cls)(None, size=size, nb_classes=3)
    net = wrapper.model
    if family == "yolox":
        net.head.initialize_biases(0.01)
    elif family == "yolo7":
        net.initialize_biases(0.01)
    return net


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "reference_init_stats.json"))
    a = ap.parse_args()
    out = {}
    for family, size, cls in MODELS:
        rows = []
        for name, t in fresh(family, size, cls).state_dict().items():
            if not t.is_floating_point():
                continue
            v = t.detach().double().flatten()
            finite = v[torch.isfinite(v)]
            mean = float(finite.mean()) if finite.numel() else 0.0
            std = float(finite.std(unbiased=False)) if finite.numel() else 0.0
            rows.append([name, v.numel(), round(mean, 7), round(std, 7), int(v.numel() - finite.numel())])
        out[f"{family}-{size}"] = rows
        print(f"{family}-{size}: {len(rows)} tensors")
    Path(a.out).write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
