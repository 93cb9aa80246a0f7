#!/usr/bin/env python3
"""Makes tests/data/yolo7_reference.pt: the reference implementation's (LibreYOLO 1.6.0) YOLOv7
network at 1/16 of b's widths, run on the CPU in eval mode, which tests/test_yolo7_parity.cpp
loads as a checkpoint and compares with the C++ network, decode and postprocess.

The network is the reference's own YOLOv7Model built from its v7.yaml with every out_channels
divided by 16 (first layer 2 channels instead of 32; the same 106 layers, names and graph) and 3
classes, so that the file stays small. Its BatchNorm running statistics are calibrated by three
training-mode forwards of random images (a cumulative average), then every BatchNorm's affine
and the head's implicit tensors are perturbed, so that no eval-mode layer is an identity. The
head's weights are scaled up and its objectness and class biases lowered, so that scores spread
over (0, 1) and a few tens of predictions per image pass predict's threshold.

Margins (checked when the file is made): no prediction's best score lies within 1e-5 of either
threshold, and the 300th and 301st detections of "val" differ by more than 1e-5 in score, so the
detections do not hinge on rounding.

The input is two letterboxed 320 x 320 images: image 0 an original of 640 x 480 (w x h) scaled
by 0.5 (content 320 x 240, padding below), image 1 an original of 200 x 320 at scale 1
(content 200 x 320, padding to the right); content pixels random, padding 114.

usage (a Python with torch and the libreyolo 1.6.0 wheel importable, e.g. /tmp/refvenv/bin/python):
    python tests/python/make_yolo7_fixture.py OUT.pt
Running it twice gives identical files.

Contents: a LibreYOLO checkpoint (the reference's wrap_libreyolo_checkpoint: model_family
"yolo7", size "b", nc 3, imgsz 320, "model" the state dict) with two more entries:
  fixture   dict: width (int, the first layer's channels), div (int), seed (int)
  expect    dict of tensors:
    input_u8                  uint8 [2, 3, 320, 320]  RGB; the network input is input_u8 / 255
    orig_size                 int64 [2, 2]            each image's original (w, h)
    raw_<l>                   float32 [2, 24, 320 / s, 320 / s]  the head's maps, l = 0, 1, 2
                                                       (strides 8, 16, 32)
    decoded                   float32 [2, 7, 6300]    decode_export: xyxy input pixels, then
                                                       obj * cls per class
    <set>.conf, <set>.iou     float64 []              the thresholds (max_det 300)
    <set>.img<i>.boxes        float32 [K, 4]          postprocess of image i: xyxy original pixels
    <set>.img<i>.scores       float32 [K]
    <set>.img<i>.classes      int64 [K]
  with <set> "predict" (conf 0.25, iou 0.45) and "val" (conf 0.001, iou 0.6), and "whole": predict's
  thresholds with each 320 x 320 input taken as the original image (what predicting on the input
  itself at imgsz 320 gives).
    <case>.targets            float32 [2, 4, 5]       the loss's ground truth (class, x1, y1, x2, y2)
                                                       as fractions of 320, class -1 for padding
    <case>.total, .iou, .obj, .cls  float64 []        the reference loss of the raw_<l> maps (iou
                                                       already x5)
    <case>.num_fg_per_gt      float64 []              positives / ground-truth boxes
    <case>.pos_index          int64 [P]               the positives, b * 6300 + prediction index
    <case>.pos_gt, .pos_iou   int64 / float32 [P]     each one's ground-truth row and IoU
    <case>.grad_1, .grad_2    float32, as raw_1, raw_2  d total / d map
    <case>.grad_0_crop        float32 [2, 24, 20, 20]  d total / d raw_0, its top-left quarter
  with <case> "loss" (three boxes in image 0, two in image 1) and "loss_one_empty" (image 1
  without boxes; no gradients).
"""
import pathlib
import sys
import tempfile

import torch
import torch.nn as nn
import yaml

from libreyolo.models.yolo7 import net as v7net
from libreyolo.models.yolo7.loss import YOLOv7Loss
from libreyolo.models.yolo7.net import YOLOv7Model
from libreyolo.postprocess.yolo7 import decode_export, postprocess
from libreyolo.utils.serialization import wrap_libreyolo_checkpoint

from fixture_images import letterboxed_blocks

SEED = 20261207
DIV = 16
NC = 3
IMGSZ = 320
ORIGINALS = [(640, 480), (200, 320)]  # (w, h)
# name: (conf, iou, each image's original (w, h) for the mapping back)
SETS = {"predict": (0.25, 0.45, ORIGINALS), "val": (0.001, 0.6, ORIGINALS),
        "whole": (0.25, 0.45, [(IMGSZ, IMGSZ)] * 2)}
# The head's weights are scaled by HEAD_GAIN (scores spread over (0, 1)) and SCORE_OFFSET is added
# to every objectness and class bias.
HEAD_GAIN = 3.0
SCORE_OFFSET = -1.5
MAX_DET = 300
# The loss's ground truth per image: (class, x1, y1, x2, y2) in input pixels (multiples of 10, so
# exact as fractions of 320 too), padded to LOSS_ROWS rows.
LOSS_GT = [
    [(0, 20, 30, 120, 200), (2, 150, 40, 300, 160), (1, 60, 220, 100, 260)],
    [(1, 10, 10, 310, 310), (0, 200, 250, 240, 300)],
]
LOSS_ROWS = 4


def narrow_yaml(directory):
    cfg = yaml.safe_load(v7net._V7_YAML.read_text(encoding="utf-8"))
    for section in ("backbone", "head"):
        for item in cfg["model"][section]:
            (_, info), = item.items()
            args = (info or {}).get("args") or {}
            if "out_channels" in args:
                assert args["out_channels"] % DIV == 0
                args["out_channels"] //= DIV
    path = pathlib.Path(directory) / "v7_narrow.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def calibrate_and_perturb(model, g):
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(2, 3, IMGSZ, IMGSZ, generator=g))
    for bn in bns:
        bn.momentum = 0.03
    with torch.no_grad():
        for bn in bns:
            bn.weight.copy_(1.0 + 0.2 * torch.randn(bn.weight.shape, generator=g))
            bn.bias.copy_(0.1 * torch.randn(bn.bias.shape, generator=g))
        for det in model.layers[105].heads:
            a, m = det.implicit_a.implicit, det.implicit_m.implicit
            a.copy_(0.1 * torch.randn(a.shape, generator=g))
            m.copy_(1.0 + 0.1 * torch.randn(m.shape, generator=g))
            det.head_conv.weight.mul_(HEAD_GAIN)
            bias = det.head_conv.bias.view(3, 5 + NC)
            bias[:, 4:] += SCORE_OFFSET


def record_loss(model, raw, exp, prefix, gt, grads):
    """The reference loss (outside data parallelism) of the eval maps `raw` against `gt`: its
    terms, the positives of its assignment and (with `grads`) the maps' gradients."""
    crit = YOLOv7Loss(NC, model.anchors, model.strides, distributed_normalize=False)
    px = torch.zeros(len(gt), LOSS_ROWS, 5)  # (class, cx, cy, w, h) pixels, zero rows pad
    norm = torch.zeros(len(gt), LOSS_ROWS, 5)  # (class, x1, y1, x2, y2) / 320, class -1 pads
    norm[:, :, 0] = -1
    for b, rows in enumerate(gt):
        for j, (c, x1, y1, x2, y2) in enumerate(rows):
            px[b, j] = torch.tensor([c, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1])
            norm[b, j] = torch.tensor([c, x1 / IMGSZ, y1 / IMGSZ, x2 / IMGSZ, y2 / IMGSZ])
    maps = [r.detach().clone().requires_grad_(True) for r in raw]
    out = crit(maps, px)
    out["total_loss"].backward()
    exp[prefix + "targets"] = norm
    for key, name in (("total_loss", "total"), ("iou_loss", "iou"), ("obj_loss", "obj"), ("cls_loss", "cls")):
        exp[prefix + name] = out[key].detach().to(torch.float64)
    exp[prefix + "num_fg_per_gt"] = torch.tensor(float(out["num_fg"]), dtype=torch.float64)
    # The assignment, image by image, as the loss makes it.
    with torch.no_grad():
        outputs, xs, ys, es = crit._decode(maps)
        xs, ys, es = torch.cat(xs, 1), torch.cat(ys, 1), torch.cat(es, 1)
        index, matched, ious = [], [], []
        for b, rows in enumerate(gt):
            if not rows:
                continue
            n = len(rows)
            _, fg, pred_iou, gt_inds, _ = crit.get_assignments(
                b, n, px[b, :n, 1:5], px[b, :n, 0], outputs[b, :, :4], es, xs, ys, outputs[:, :, 5:],
                outputs[:, :, 4:5])
            index.append(fg.nonzero().view(-1) + b * outputs.shape[1])
            matched.append(gt_inds)
            ious.append(pred_iou.float())
    exp[prefix + "pos_index"] = torch.cat(index)
    exp[prefix + "pos_gt"] = torch.cat(matched)
    exp[prefix + "pos_iou"] = torch.cat(ious)
    if grads:
        for i in (1, 2):
            exp[prefix + f"grad_{i}"] = maps[i].grad.clone()
        exp[prefix + "grad_0_crop"] = maps[0].grad[:, :, :20, :20].clone()


def main(out_path):
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED + 1)
    with tempfile.TemporaryDirectory() as d:
        model = YOLOv7Model(NC, yaml_path=narrow_yaml(d))
    calibrate_and_perturb(model, g)
    model.eval()

    x_u8 = letterboxed_blocks(ORIGINALS, IMGSZ, g)
    exp = {"input_u8": x_u8, "orig_size": torch.tensor(ORIGINALS, dtype=torch.int64)}
    with torch.no_grad():
        raw = model(x_u8.float() / 255.0)
        for i, r in enumerate(raw):
            exp[f"raw_{i}"] = r.clone()
        anchors = [torch.tensor(a, dtype=torch.float32).view(-1, 2) for a in model.anchors]
        exp["decoded"] = decode_export(raw, anchors, model.strides, NC).clone()
        for name, (conf, iou, originals) in SETS.items():
            exp[f"{name}.conf"] = torch.tensor(conf, dtype=torch.float64)
            exp[f"{name}.iou"] = torch.tensor(iou, dtype=torch.float64)
            for i, size in enumerate(originals):
                one = [r[i:i + 1] for r in raw]
                d = postprocess(one, model.anchors, model.strides, NC, conf_thres=conf, iou_thres=iou,
                                input_size=IMGSZ, original_size=size, max_det=MAX_DET)
                p = f"{name}.img{i}."
                exp[p + "boxes"] = torch.tensor(d["boxes"], dtype=torch.float32).reshape(-1, 4)
                exp[p + "scores"] = torch.tensor(d["scores"], dtype=torch.float32).reshape(-1)
                exp[p + "classes"] = torch.tensor(d["classes"], dtype=torch.int64).reshape(-1)

    record_loss(model, raw, exp, "loss.", LOSS_GT, grads=True)
    record_loss(model, raw, exp, "loss_one_empty.", [LOSS_GT[0], []], grads=False)

    ckpt = wrap_libreyolo_checkpoint(model.state_dict(), model_family="yolo7", size="b", task="detect", nc=NC,
                                     imgsz=IMGSZ)
    ckpt["fixture"] = {"width": int(model.layers[0].conv.out_channels), "div": DIV, "seed": SEED}
    ckpt["expect"] = exp
    torch.save(ckpt, out_path)

    best = exp["decoded"][:, 4:].max(1).values
    for conf, _, _ in SETS.values():
        assert (best - conf).abs().min() > 1e-5, "a score lies at a threshold"
    for i in range(len(ORIGINALS)):
        s = exp[f"val.img{i}.scores"]
        if s.numel() == MAX_DET:
            d = postprocess([r[i:i + 1] for r in raw], model.anchors, model.strides, NC, conf_thres=SETS["val"][0],
                            iou_thres=SETS["val"][1], input_size=IMGSZ, original_size=ORIGINALS[i], max_det=MAX_DET + 1)
            assert d["scores"][MAX_DET - 1] - d["scores"][MAX_DET] > 1e-5, "max_det cuts between equal scores"

    back = torch.load(out_path, weights_only=True, map_location="cpu")
    assert list(back["model"].keys()) == list(model.state_dict().keys())
    counts = {k: exp[k + ".img0.scores"].numel() for k in SETS} | {
        k + "1": exp[k + ".img1.scores"].numel() for k in SETS}
    print(f"wrote {out_path}: {len(back['model'])} weight entries, maps "
          f"{[tuple(r.shape) for r in raw]}, detections {counts}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
