#!/usr/bin/env python3
"""Makes tests/data/rtmdet_reference.pt: two RTMDet networks of the reference implementation
(LibreYOLO 1.6.0) at 1/6 of t's widths, run on the CPU in eval mode, which
tests/test_rtmdet_parity.cpp loads as checkpoints and compares with the C++ network, decode and
postprocess.

The reference's size table fixes the widths, so each network is the reference's LibreRTMDetModel
of size t whose backbone, neck and head are replaced by the reference's own CSPNeXt,
CSPNeXtPAFPN and RTMDetSepBNHead built at widen 0.0625 (stem 2/4 channels, stages 8, 16, 32,
64, neck and head 16 wide) and 3 classes:
  "t"  deepen 0.167 (one block per stage), one block per neck CSP layer, no exp on the distances
       (as t and s);
  "m"  deepen 0.33 (1, 2, 2, 1 blocks), two blocks per neck CSP layer, exp on the distances
       (as m, l and x).
Every BatchNorm's affine is perturbed (so that no eval-mode layer is an identity), then the
running statistics are calibrated by three training-mode forwards of the input images and two
noisy copies (a cumulative average). The head's weights are redrawn wider than its N(0, 0.01) initialisation and
its biases set so that scores spread over (0, 1) and boxes have a few cells' size.

The expected values are the reference's forward, decode and postprocess computed in float64 and
rounded to float32 (so that they carry no float32 error of the reference's own).

Margins (checked when the file is made): no score lies within 3e-5 of a threshold, and where
"val" keeps 300 detections the 300th and 301st differ by more than 3e-5 in score.

The input is two letterboxed 320 x 320 RGB images: image 0 an original of 640 x 480 (w x h)
scaled by 0.5 (content 320 x 240, padding below), image 1 an original of 200 x 320 at scale 1
(content 200 x 320, padding to the right); content pixels random, padding 114. The network input
is the reference's own preprocessing of each (BGR, minus mean, over std).

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_rtmdet_fixture.py OUT.pt
Running it twice gives identical files.

Contents: a LibreYOLO checkpoint of the "t" network (model_family "rtmdet", size "t", nc 3,
imgsz 320, "model" its state dict) with two more entries:
  fixture   dict: seed (int), widen (float), variants (list of str)
  expect    dict:
    input_u8                     uint8 [2, 3, 320, 320]  RGB
    input_crop                   float32 [2, 3, 40, 40]  the reference's network input, rows 0-39
                                                          and columns 180-219 (content and padding)
    orig_size                    int64 [2, 2]            each image's original (w, h)
    m.model                      the state dict of variant "m" (t's is the checkpoint's "model")
    <v>.raw_cls_<l>              float32 [2, 3, 320 / s, 320 / s]  class logits, l = 0, 1, 2
    <v>.raw_reg_<l>              float32 [2, 4, 320 / s, 320 / s]  (l, t, r, b) pixel distances
    <v>.decoded                  float32 [2, 2100, 7]    the head's export output: xyxy input
                                                          pixels, then sigmoid scores
    <set>.conf, <set>.iou        float64 []              the thresholds (max_det 300)
    <v>.<set>.img<i>.boxes       float32 [K, 4]          postprocess of image i: xyxy original pixels
    <v>.<set>.img<i>.scores      float32 [K]
    <v>.<set>.img<i>.classes     int64 [K]
  with <set> "predict" (conf 0.25, iou 0.45), "val" (conf 0.001, iou 0.6) and "whole" (predict's
  thresholds with each 320 x 320 input taken as the original image).
"""
import sys

import numpy as np
import torch
import torch.nn as nn

from libreyolo.models.rtmdet.nn import CSPNeXt, CSPNeXtPAFPN, LibreRTMDetModel, RTMDetSepBNHead
from libreyolo.models.rtmdet.utils import preprocess_numpy
from libreyolo.postprocess.rtmdet import postprocess
from libreyolo.utils.serialization import wrap_libreyolo_checkpoint

from fixture_images import letterboxed_blocks

SEED = 20261208
NC = 3
IMGSZ = 320
WIDEN = 0.0625
# variant: (deepen, neck CSP blocks, exp_on_reg, the class biases' centre)
VARIANTS = {"t": (0.167, 1, False, -2.6), "m": (0.33, 2, True, -2.0)}
ORIGINALS = [(640, 480), (200, 320)]  # (w, h)
SETS = {"predict": (0.25, 0.45, ORIGINALS), "val": (0.001, 0.6, ORIGINALS),
        "whole": (0.25, 0.45, [(IMGSZ, IMGSZ)] * 2)}
MAX_DET = 300
# No score within MARGIN of a threshold, nor of the next one where max_det cuts.
MARGIN = 3e-5
# The class convolutions' weights ~ N(0, CLS_GAIN).
CLS_GAIN = 0.15


def build(deepen, neck_blocks, exp_on_reg):
    model = LibreRTMDetModel(size="t", nc=NC)
    model.backbone = CSPNeXt(deepen_factor=deepen, widen_factor=WIDEN, out_indices=(2, 3, 4))
    stages = [int(c * WIDEN) for c in (256, 512, 1024)]
    width = stages[0]
    model.neck = CSPNeXtPAFPN(in_channels=stages, out_channels=width, num_csp_blocks=neck_blocks)
    model.head = RTMDetSepBNHead(num_classes=NC, in_channels=width, feat_channels=width, exp_on_reg=exp_on_reg)
    return model


def calibrate_and_perturb(model, exp_on_reg, cls_bias, x, g):
    head = model.head
    with torch.no_grad():
        # The towers' shared convolutions (level 0's modules) and the prediction convolutions.
        for tower in (head.cls_convs[0], head.reg_convs[0]):
            for layer in tower:
                layer.conv.weight.copy_(0.08 * torch.randn(layer.conv.weight.shape, generator=g))
        for conv in head.rtm_cls:
            conv.weight.copy_(CLS_GAIN * torch.randn(conv.weight.shape, generator=g))
            conv.bias.copy_(cls_bias + 0.3 * torch.randn(conv.bias.shape, generator=g))
        for conv in head.rtm_reg:
            # Distances of a few cells: exp(b) s with exp_on_reg, else b s.
            gain, base = (0.03, 0.8) if exp_on_reg else (0.1, 2.0)
            conv.weight.copy_(gain * torch.randn(conv.weight.shape, generator=g))
            conv.bias.copy_(base + 0.2 * torch.randn(conv.bias.shape, generator=g))
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in bns:
            bn.weight.copy_(1.0 + 0.2 * torch.randn(bn.weight.shape, generator=g))
            bn.bias.copy_(0.1 * torch.randn(bn.bias.shape, generator=g))
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        # The images themselves and two noisy copies: statistics of the input the network gets.
        for k in range(3):
            model(x + 0.3 * k * torch.randn(x.shape, generator=g))
    for bn in bns:
        bn.momentum = 0.1


def run_variant(name, x, exp, g):
    """Builds variant `name`, records what it computes and returns its (float32) state dict."""
    deepen, neck_blocks, exp_on_reg, cls_bias = VARIANTS[name]
    model = build(deepen, neck_blocks, exp_on_reg)
    calibrate_and_perturb(model, exp_on_reg, cls_bias, x, g)
    model.eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    # The forward in float64, its results rounded to float32: the reference's values without its
    # own float32 rounding (the C++ network's float32 error is then its own alone).
    model.double()
    xd = x.double()
    p = name + "."
    with torch.no_grad():
        cls, reg = model(xd)
        for i in range(3):
            exp[p + f"raw_cls_{i}"] = cls[i].float()
            exp[p + f"raw_reg_{i}"] = reg[i].float()
        model.head.export = True
        decoded = model(xd)
        exp[p + "decoded"] = decoded.float()
        model.head.export = False
        for set_name, (conf, iou, originals) in SETS.items():
            for i, (w, h) in enumerate(originals):
                ratio = min(IMGSZ / w, IMGSZ / h)
                one = (tuple(c[i:i + 1] for c in cls), tuple(r[i:i + 1] for r in reg))
                d = postprocess(one, conf_thres=conf, iou_thres=iou, input_size=IMGSZ, original_size=(w, h),
                                ratio=ratio, max_det=MAX_DET)
                q = f"{p}{set_name}.img{i}."
                exp[q + "boxes"] = torch.tensor(np.asarray(d["boxes"]), dtype=torch.float32).reshape(-1, 4)
                exp[q + "scores"] = torch.tensor(np.asarray(d["scores"]), dtype=torch.float32).reshape(-1)
                exp[q + "classes"] = torch.tensor(np.asarray(d["classes"]), dtype=torch.int64).reshape(-1)
                if set_name == "val" and exp[q + "scores"].numel() == MAX_DET:
                    more = postprocess(one, conf_thres=conf, iou_thres=iou, input_size=IMGSZ, original_size=(w, h),
                                       ratio=ratio, max_det=MAX_DET + 1)
                    s = np.asarray(more["scores"])
                    assert s[MAX_DET - 1] - s[MAX_DET] > MARGIN, "max_det cuts between close scores"
    scores = decoded[..., 4:]
    for conf, _, _ in SETS.values():
        assert (scores - conf).abs().min() > MARGIN, f"{name}: a score lies at a threshold"
    if name != "t":  # the checkpoint's own "model" is t's
        exp[p + "model"] = weights
    return weights


def main(out_path):
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED + 1)
    x_u8 = letterboxed_blocks(ORIGINALS, IMGSZ, g)
    x = torch.stack([torch.from_numpy(preprocess_numpy(img.permute(1, 2, 0).numpy(), IMGSZ)[0]) for img in x_u8])
    exp = {"input_u8": x_u8, "input_crop": x[:, :, :40, 180:220].clone(),
           "orig_size": torch.tensor(ORIGINALS, dtype=torch.int64)}
    for conf_name, (conf, iou, _) in SETS.items():
        exp[f"{conf_name}.conf"] = torch.tensor(conf, dtype=torch.float64)
        exp[f"{conf_name}.iou"] = torch.tensor(iou, dtype=torch.float64)
    weights = {name: run_variant(name, x, exp, g) for name in VARIANTS}

    ckpt = wrap_libreyolo_checkpoint(weights["t"], model_family="rtmdet", size="t", task="detect",
                                     nc=NC, imgsz=IMGSZ)
    ckpt["fixture"] = {"seed": SEED, "widen": WIDEN, "variants": list(VARIANTS)}
    ckpt["expect"] = exp
    torch.save(ckpt, out_path)

    back = torch.load(out_path, weights_only=True, map_location="cpu")
    assert list(back["model"].keys()) == list(weights["t"].keys())
    counts = {f"{v}.{s}{i}": exp[f"{v}.{s}.img{i}.scores"].numel() for v in VARIANTS for s in SETS for i in (0, 1)}
    print(f"wrote {out_path}: {len(back['model'])} weight entries, detections {counts}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
