#!/usr/bin/env python3
"""Makes tests/data/yolo9_aux_reference.pt: the reference implementation's (LibreYOLO 1.6.0)
YOLOv9-t PGI auxiliary branch, run on the CPU, which tests/test_models_yolo9_aux.cpp feeds to
the C++ branch and compares.

The branch reads the backbone's B3, B4 and pre-SPP B5; here those are random tensors of a 64 x 64
input's level sizes, so the fixture needs only the branch's own weights (randomised, BatchNorm
statistics included, so that eval mode is not an identity).

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_yolo9_aux_fixture.py OUT.pt
Running it twice gives identical files.

Contents: nc; b3 [2, 64, 8, 8], b4 [2, 96, 4, 4], b5 [2, 128, 2, 2] float32; every tensor of the
branch under its state-dict name ("aux.*", "aux_head.*"); train_<i> (i = 0..2) the auxiliary
head's raw maps [2, 64 + nc, H, W] of a training-mode forward, eval_<i> those of an eval-mode one.
"""
import sys

import torch

from libreyolo.models.yolo9.nn import LibreYOLO9Model

NC = 3


def main(out_path):
    torch.manual_seed(20261204)
    model = LibreYOLO9Model(config="t", nb_classes=NC)
    model.enable_aux(weight=0.25)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not (name.startswith("aux.") or name.startswith("aux_head.")):
                continue
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
            else:
                t.copy_(torch.randn_like(t) * 0.1)
    b3 = torch.randn(2, 64, 8, 8)
    b4 = torch.randn(2, 96, 4, 4)
    b5 = torch.randn(2, 128, 2, 2)
    out = {"nc": torch.tensor(NC), "b3": b3, "b4": b4, "b5": b5}
    for name, t in model.state_dict().items():
        if name.startswith("aux.") or name.startswith("aux_head."):
            out[name] = t.clone()
    with torch.no_grad():
        model.eval()
        maps = model.aux_head(list(model.aux(b3, b4, b5)))[1]
        for i, m in enumerate(maps):
            out[f"eval_{i}"] = m.clone()
        model.train()
        maps = model.aux_head(list(model.aux(b3, b4, b5)))
        for i, m in enumerate(maps):
            out[f"train_{i}"] = m.clone()
    torch.save(out, out_path)
    print(f"wrote {out_path}: {sum(1 for k in out if k.startswith('aux'))} branch tensors")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "yolo9_aux_reference.pt")
