#!/usr/bin/env python3
"""Makes tests/data/picodet_reference.pt: a PicoDet network of the reference implementation
(LibreYOLO 1.6.0) far narrower than s, run on the CPU in eval mode, which
tests/test_picodet_parity.cpp loads as a checkpoint and compares with the C++ network, decode and
postprocess.

The reference's size table fixes the widths, so the network is the reference's LibrePICODETModel
built from an extra row added to its tables for this script ("n"): ESNet at scale 0.25 with s's
block ratios (stages 32, 64, 128), neck and head 16 wide, three depthwise-separable convolutions
per head tower, 3 classes. Every BatchNorm's affine is perturbed (so that no eval-mode layer is an
identity), then the running statistics are calibrated by three training-mode forwards of the 320
input and two noisy copies (a cumulative average). The head's weights are redrawn wider than
their N(0, 0.01) initialisation and its biases set so that scores spread over (0, 1) and the box
distributions are far from uniform.

The expected values are the reference's forward, decode and postprocess computed in float64 and
rounded to float32 (so that they carry no float32 error of the reference's own).
Margins (checked when the file is made): no score lies within 3e-5 of a threshold, and where
"val" keeps 300 detections the 300th and 301st differ by more than 3e-5 in score.

Inputs: two originals of 480 x 360 and 200 x 320 (w x h), random blocky RGB content, stretched to
S x S by the reference's own preprocessing (cv2 INTER_LINEAR, then minus mean over std):
  S = 320  both images (batch 2);
  S = 416  image 0 alone (a 7 x 7 stride-64 level);
  S = 400  image 1 alone (stride 32 gives 13 x 13, doubled 26 against stride 16's 25: the
           top-down path's resize).

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_picodet_fixture.py OUT.pt
Running it twice gives identical files.

Contents: a LibreYOLO checkpoint (model_family "picodet", size "s", nc 3, imgsz 320, "model" the
state dict) with two more entries:
  fixture   dict: seed (int), scale (float), sizes (list of int)
  expect    dict:
    orig_size                    int64 [2, 2]            each original's (w, h)
    s<S>.input_u8                uint8 [B, 3, S, S]      the stretched RGB images
    s<S>.input_crop              float32 [B, 3, 40, 40]  the reference's network input, rows 0-39
                                                          and columns 180-219
    s<S>.raw_<l>                 float32 [B, 35, h, w]   level l's head map: 3 class logits, then
                                                          the 32 box logits (side-major)
    s<S>.decoded                 float32 [B, A, 7]       the head's export output: xyxy input
                                                          pixels, then sigmoid scores
    s<S>.ref_f32_err_maps        float64 []              the reference's own float32 forward
                                                          against its float64 one: max |error| /
                                                          max |value|, the largest over the levels
    s<S>.ref_f32_err_decoded     float64 []              the same of the decoded boxes and scores
    <set>.conf, <set>.iou        float64 []              the thresholds (max_det 300)
    s<S>.<set>.img<i>.boxes      float32 [K, 4]          postprocess of batch image i: xyxy in the
                                                          original's pixels
    s<S>.<set>.img<i>.scores     float32 [K]
    s<S>.<set>.img<i>.classes    int64 [K]
  with <set> "predict" (conf 0.25, iou 0.45) and "val" (conf 0.001, iou 0.6) against the originals,
  and "whole" (predict's thresholds with the S x S input taken as the original); at 416 and 400
  "predict" and "whole" only.
"""
import sys

import cv2
import numpy as np
import torch
import torch.nn as nn

from libreyolo.models.picodet import nn as picodet_nn
from libreyolo.models.picodet.utils import preprocess_numpy
from libreyolo.postprocess.picodet import postprocess
from libreyolo.utils.serialization import wrap_libreyolo_checkpoint

SEED = 20261206
NC = 3
SCALE = 0.25
ORIGINALS = [(480, 360), (200, 320)]  # (w, h)
# input size: the originals it sees, the postprocess sets
RUNS = {320: ([0, 1], ["predict", "val", "whole"]), 416: ([0], ["predict", "whole"]), 400: ([1], ["predict", "whole"])}
THRESHOLDS = {"predict": (0.25, 0.45), "val": (0.001, 0.6), "whole": (0.25, 0.45)}
MAX_DET = 300
MARGIN = 3e-5
# The class biases' centre.
CLS_BIAS = -2.0


def build():
    picodet_nn.ESNet.ARCH["n"] = {"scale": SCALE, "ratios": picodet_nn.ESNet.ARCH["s"]["ratios"]}
    picodet_nn.SIZE_SPEC["n"] = {"backbone": "n", "neck_ch": 16, "head_ch": 16, "stacked_convs": 3}
    return picodet_nn.LibrePICODETModel(size="n", nb_classes=NC)


def make_originals(g):
    out = []
    for w, h in ORIGINALS:
        # Blocky content (8 x 8 cells) with fine noise, so the maps have structure at every level.
        coarse = torch.randint(0, 256, ((h + 7) // 8, (w + 7) // 8, 3), generator=g)
        coarse = coarse.repeat_interleave(8, 0).repeat_interleave(8, 1)[:h, :w]
        noise = torch.randint(-24, 25, (h, w, 3), generator=g)
        out.append((coarse + noise).clamp(0, 255).to(torch.uint8).numpy())
    return out


def perturb_and_calibrate(model, x, g):
    head = model.head
    with torch.no_grad():
        for tower in head.cls_convs:
            for block in tower:
                for conv in (block.depthwise_conv.conv, block.pointwise_conv.conv):
                    fan_in = conv.weight[0].numel()
                    conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * (1.5 / fan_in) ** 0.5)
        for conv in head.gfl_cls:
            conv.weight.copy_(0.15 * torch.randn(conv.weight.shape, generator=g))
            conv.bias[:NC] = CLS_BIAS + 0.3 * torch.randn(NC, generator=g)
            conv.bias[NC:] = 1.0 * torch.randn(conv.bias.shape[0] - NC, generator=g)
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
        for k in range(3):
            model(x + 0.3 * k * torch.randn(x.shape, generator=g))
    for bn in bns:
        bn.momentum = 0.1


def stretch(img, size):
    return cv2.resize(img, (size, size), interpolation=cv2.INTER_LINEAR)


def main(out_path):
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED + 1)
    originals = make_originals(g)
    model = build()
    inputs = {}
    exp = {"orig_size": torch.tensor(ORIGINALS, dtype=torch.int64)}
    for size, (which, _) in RUNS.items():
        u8 = np.stack([stretch(originals[i], size) for i in which])
        x = torch.stack([torch.from_numpy(preprocess_numpy(originals[i], size)[0]) for i in which])
        exp[f"s{size}.input_u8"] = torch.from_numpy(u8).permute(0, 3, 1, 2).contiguous()
        exp[f"s{size}.input_crop"] = x[:, :, :40, 180:220].clone()
        inputs[size] = x
    for name, (conf, iou) in THRESHOLDS.items():
        exp[f"{name}.conf"] = torch.tensor(conf, dtype=torch.float64)
        exp[f"{name}.iou"] = torch.tensor(iou, dtype=torch.float64)

    perturb_and_calibrate(model, inputs[320], g)
    model.eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    # The reference's own float32 forward, kept to measure its float32 error below.
    f32 = {}
    with torch.no_grad():
        for size in RUNS:
            cls, reg = model(inputs[size])
            model.head.export = True
            f32[size] = ([torch.cat([c, r], 1) for c, r in zip(cls, reg)], model(inputs[size]))
            model.head.export = False
    model.double()
    with torch.no_grad():
        for size, (which, sets) in RUNS.items():
            xd = inputs[size].double()
            p = f"s{size}."
            cls, reg = model(xd)
            for l in range(4):
                exp[p + f"raw_{l}"] = torch.cat([cls[l], reg[l]], 1).float()
            model.head.export = True
            decoded = model(xd)
            model.head.export = False
            exp[p + "decoded"] = decoded.float()
            # How far the reference's own float32 forward is from its float64 one (max |error| over
            # max |value|, the largest of the four levels; the decoded boxes and scores).
            maps32, dec32 = f32[size]
            exp[p + "ref_f32_err_maps"] = torch.tensor(max(
                float((m32.double() - torch.cat([c, r], 1)).abs().max() / torch.cat([c, r], 1).abs().max())
                for m32, c, r in zip(maps32, cls, reg)), dtype=torch.float64)
            exp[p + "ref_f32_err_decoded"] = torch.tensor(max(
                float((dec32[..., a:b].double() - decoded[..., a:b]).abs().max() / decoded[..., a:b].abs().max())
                for a, b in ((0, 4), (4, 4 + NC))), dtype=torch.float64)
            for set_name in sets:
                conf, iou = THRESHOLDS[set_name]
                scores = decoded[..., 4:]
                assert (scores - conf).abs().min() > MARGIN, f"{size}: a score lies at threshold {conf}"
                for i, o in enumerate(which):
                    w, h = (size, size) if set_name == "whole" else ORIGINALS[o]
                    one = ([c[i:i + 1] for c in cls], [r[i:i + 1] for r in reg])
                    d = postprocess(one, conf_thres=conf, iou_thres=iou, input_size=size, original_size=(w, h),
                                    max_det=MAX_DET)
                    q = f"{p}{set_name}.img{i}."
                    exp[q + "boxes"] = torch.tensor(np.asarray(d["boxes"]), dtype=torch.float32).reshape(-1, 4)
                    exp[q + "scores"] = torch.tensor(np.asarray(d["scores"]), dtype=torch.float32).reshape(-1)
                    exp[q + "classes"] = torch.tensor(np.asarray(d["classes"]), dtype=torch.int64).reshape(-1)
                    if exp[q + "scores"].numel() == MAX_DET:
                        more = postprocess(one, conf_thres=conf, iou_thres=iou, input_size=size,
                                           original_size=(w, h), max_det=MAX_DET + 1)
                        s = np.sort(np.asarray(more["scores"]))[::-1]
                        assert s[MAX_DET - 1] - s[MAX_DET] > MARGIN, "max_det cuts between close scores"

    ckpt = wrap_libreyolo_checkpoint(weights, model_family="picodet", size="s", task="detect", nc=NC, imgsz=320)
    ckpt["fixture"] = {"seed": SEED, "scale": SCALE, "sizes": list(RUNS)}
    ckpt["expect"] = exp
    torch.save(ckpt, out_path)

    back = torch.load(out_path, weights_only=True, map_location="cpu")
    assert list(back["model"].keys()) == list(weights.keys())
    counts = {k[:-7]: v.numel() for k, v in exp.items() if k.endswith(".scores")}
    errs = {size: (float(exp[f"s{size}.ref_f32_err_maps"]), float(exp[f"s{size}.ref_f32_err_decoded"])) for size in RUNS}
    print(f"wrote {out_path}: {len(back['model'])} weight entries, detections {counts}, "
          f"the reference's float32 errors (maps, decoded) {errs}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
