#!/usr/bin/env python3
"""Makes tests/data/hgnetv2_reference.pt: the reference implementation's (LibreYOLO 1.6.0)
HGNetv2 backbone of RT-DETR, built with a narrow stage table and run on the CPU, which
tests/test_rtdetr_hgnetv2.cpp feeds to the C++ backbone and compares.

The narrow table keeps every kind of part of the l/x backbones: the stem (2x2 convolutions with
right/bottom zero padding, the padded 2x2 max pool, the concatenation), a stage without and
stages with the depthwise downsample, plain (3x3) and light (1x1 then depthwise 5x5) layers, and
residual blocks (block >= 1) in a plain and a light stage. Every BatchNorm (affine and running
statistics) is randomised so that eval mode is not an identity. The input is 70 x 58, odd sizes
after the first stride, so the stem's padding and the strided convolutions' rounding are
exercised.

usage (a Python with torch and the libreyolo 1.6.0 wheel importable, e.g. /tmp/refvenv/bin/python):
    python tests/python/make_hgnetv2_fixture.py OUT.pt
Running it twice gives identical files.

Contents:
  stem             int64 [2]: the stem's middle and output widths
  stages           int64 [4, 8]: per stage (in, mid, out, blocks, downsample, light, kernel, layers)
  input            float32 [2, 3, 70, 58]
  every tensor of the backbone under its state-dict name ("stem.*", "stages.*"), before any
  forward
  eval_<i>         (i = 0..2) the outputs of stages 1, 2, 3 of an eval-mode forward
  train_<i>        the same of a training-mode forward (batch statistics), run after the eval one
  after_train.<name>  every BatchNorm buffer (running_mean, running_var, num_batches_tracked)
                   after that training forward
"""
import sys

import torch

from libreyolo.models.rtdetr.hgnetv2 import HGNetv2

STEM = [3, 8, 12]
STAGES = {
    # in, mid, out, blocks, downsample, light, kernel, layers
    "stage1": [12, 8, 16, 1, False, False, 3, 2],
    "stage2": [16, 8, 24, 2, True, False, 3, 3],
    "stage3": [24, 12, 32, 2, True, True, 5, 3],
    "stage4": [32, 16, 40, 1, True, True, 5, 2],
}


class NarrowHGNetv2(HGNetv2):
    arch_configs = {"narrow": {"stem_channels": STEM, "stage_config": STAGES, "url": ""}}


def main(out_path):
    torch.manual_seed(20261206)
    model = NarrowHGNetv2("narrow", use_lab=False, return_idx=[1, 2, 3], freeze_at=-1, freeze_norm=False)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
            elif ".bn." in name:
                t.copy_(torch.randn_like(t) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
    x = torch.rand(2, 3, 70, 58)
    out = {
        "stem": torch.tensor(STEM[1:], dtype=torch.int64),
        "stages": torch.tensor([[int(v) for v in row] for row in STAGES.values()], dtype=torch.int64),
        "input": x,
    }
    for name, t in model.state_dict().items():
        out[name] = t.clone()
    with torch.no_grad():
        model.eval()
        for i, y in enumerate(model(x)):
            out[f"eval_{i}"] = y.clone()
        model.train()
        for i, y in enumerate(model(x)):
            out[f"train_{i}"] = y.clone()
    for name, t in model.state_dict().items():
        if name.endswith(("running_mean", "running_var", "num_batches_tracked")):
            out["after_train." + name] = t.clone()
    torch.save(out, out_path)
    n = sum(1 for k in out if k.startswith(("stem.", "stages.")))
    print(f"wrote {out_path}: {n} backbone tensors, outputs {[tuple(out[f'eval_{i}'].shape) for i in range(3)]}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
