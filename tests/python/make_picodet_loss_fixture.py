#!/usr/bin/env python3
"""Makes tests/data/picodet_loss_reference.pt: the reference implementation's (LibreYOLO 1.6.0)
PicoDet loss and SimOTA assignment on synthetic head maps, which tests/test_picodet_loss.cpp
compares with PicodetLoss (terms, assignment at every prior, gradients of the maps).

Maps: a 256 x 256 input (levels of 32, 16, 8 and 4 cells at strides 8 to 64), 4 classes, batch 3;
class logits ~ N(-2, 1), box logits ~ N(0, 1.5) (so that decoded boxes vary in size), float32.
Ground truth (xyxy input pixels, class):
  image 0: five boxes of several sizes, one of them 6 x 6 (fewer candidates than its k could
           ask for) and two overlapping;
  image 1: no box (padding rows only);
  image 2: the maximum count, 20 boxes, many overlapping (priors taken by several boxes).
The targets are padded to 20 rows, class -1, as the C++ loss gets them (normalised by 256).

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_picodet_loss_fixture.py OUT.pt

Contents (a dict):
  cls_<l>, box_<l>   float32 [3, 4, h, w], [3, 32, h, w]   the maps, l = 0..3
  targets            float32 [3, 20, 5]  (class, x1, y1, x2, y2) / 256, padding class -1
  imgsz              int64 []            256
  loss_cls, loss_bbox, loss_dfl, total   float32 []
  num_pos            int64 []
  fg                 bool [3, N]         positive priors (N = 1360, level-major, row-major)
  gt_index           int64 [3, N]        the matched row (0 where background)
  labels             int64 [3, N]        the matched class (-1 where background)
  grad_cls_<l>, grad_box_<l>             float32  d total / d maps
"""
import sys

import torch

from libreyolo.models.picodet.loss import PICODETLoss, _generate_priors

SEED = 20261207
NC = 4
IMGSZ = 256
STRIDES = (8, 16, 32, 64)
T = 20


def boxes_image0():
    return [((20, 30, 120, 200), 0), ((150, 40, 250, 160), 2), ((60, 220, 66, 226), 1),
            ((100, 100, 180, 180), 3), ((120, 120, 200, 210), 3)]


def boxes_image2(g):
    out = []
    for i in range(T):
        cx, cy = (torch.rand(2, generator=g) * 160 + 48).tolist()
        w, h = (torch.rand(2, generator=g) * 90 + 12).tolist()
        out.append(((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), i % NC))
    return out


def main(out_path):
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)
    shapes = [(IMGSZ // s, IMGSZ // s) for s in STRIDES]
    cls = [(torch.randn(3, NC, h, w, generator=g) - 2.0).requires_grad_() for h, w in shapes]
    box = [(1.5 * torch.randn(3, 32, h, w, generator=g)).requires_grad_() for h, w in shapes]
    images = [boxes_image0(), [], boxes_image2(g)]
    targets = torch.full((3, T, 5), -1.0)
    gt_boxes, gt_labels = [], []
    for b, rows in enumerate(images):
        for j, (xyxy, c) in enumerate(rows):
            targets[b, j, 0] = c
            targets[b, j, 1:] = torch.tensor(xyxy) / IMGSZ
        # The reference gets the boxes the C++ loss sees: the normalised targets scaled back.
        n = len(rows)
        gt_boxes.append(targets[b, :n, 1:] * IMGSZ)
        gt_labels.append(targets[b, :n, 0].long())

    loss = PICODETLoss(num_classes=NC, strides=STRIDES, distributed_normalize=False)
    out = loss(cls, box, gt_boxes, gt_labels)
    out["total_loss"].backward()

    # The assignment as the loss made it (same inputs).
    with torch.no_grad():
        priors = _generate_priors(shapes, STRIDES, torch.device("cpu"))
        strides = priors[:, 2]
        cls_flat = torch.cat([c.permute(0, 2, 3, 1).reshape(3, -1, NC) for c in cls], 1).float()
        box_flat = torch.cat([x.permute(0, 2, 3, 1).reshape(3, -1, 32) for x in box], 1).float()
        decoded = loss._batch_decode(box_flat, priors, strides)
        n = priors.shape[0]
        fg = torch.zeros(3, n, dtype=torch.bool)
        gt_index = torch.zeros(3, n, dtype=torch.int64)
        labels = torch.full((3, n), -1, dtype=torch.int64)
        for b in range(3):
            if gt_boxes[b].numel() == 0:
                continue
            inds, lab, _, pos = loss.assigner.assign(priors, decoded[b], cls_flat[b].sigmoid(), gt_boxes[b],
                                                     gt_labels[b])
            fg[b] = pos
            gt_index[b] = (inds - 1).clamp(min=0)
            labels[b] = lab
    assert int(fg.sum()) == int(out["num_pos"])

    res = {"targets": targets, "imgsz": torch.tensor(IMGSZ), "num_pos": torch.tensor(int(out["num_pos"])),
           "loss_cls": out["loss_cls"].detach().clone(), "loss_bbox": out["loss_bbox"].detach().clone(),
           "loss_dfl": out["loss_dfl"].detach().clone(), "total": out["total_loss"].detach().clone(),
           "fg": fg, "gt_index": gt_index, "labels": labels}
    for l in range(4):
        res[f"cls_{l}"] = cls[l].detach().clone()
        res[f"box_{l}"] = box[l].detach().clone()
        res[f"grad_cls_{l}"] = cls[l].grad.clone()
        res[f"grad_box_{l}"] = box[l].grad.clone()
    torch.save(res, out_path)
    per_image = fg.sum(1).tolist()
    print(f"wrote {out_path}: total {float(out['total_loss'].detach()):.6f} cls {float(out['loss_cls']):.6f} "
          f"bbox {float(out['loss_bbox']):.6f} dfl {float(out['loss_dfl']):.6f} positives {per_image}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
