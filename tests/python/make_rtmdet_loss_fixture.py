#!/usr/bin/env python3
"""Makes tests/data/rtmdet_loss_reference.pt: the reference implementation's (LibreYOLO 1.6.0)
RTMDet loss (quality focal loss, GIoU loss and the dynamic soft label assigner) on synthetic head
maps, for the C++ loss's parity test. The network plays no part: the maps are drawn directly, so
that the assignment and both terms are exercised with boxes of every quality (an untrained
network's boxes barely overlap anything).

Maps: 3 classes, a 320 x 320 input, strides 8, 16, 32 (40 x 40 + 20 x 20 + 10 x 10 = 2100 priors
at the cells' corners). Class logits ~ N(-3, 1.5); box distances (left, top, right, bottom) in
input pixels ~ U(1, 6) strides of their level, plus a few negative ones (sizes t and s do not
exponentiate: distances may be negative, and boxes may have negative widths).

Cases (ground truth per image as (class, x1, y1, x2, y2) pixels):
  two     image 0: three boxes (one 6 x 6, candidates only on the finest level); image 1: two boxes
  empty   image 0: two boxes; image 1: none
  crowd   image 0: 20 overlapping boxes (the batch's maximum); image 1: one box over the whole input

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_rtmdet_loss_fixture.py OUT.pt
Running it twice gives identical files.

Contents: dict
  fixture   dict: nc (int), imgsz (int), seed (int)
  expect    dict of tensors:
    cls_<l>   float32 [2, 3, 320 / s, 320 / s]   class logits of level l (0, 1, 2: strides 8, 16, 32)
    reg_<l>   float32 [2, 4, 320 / s, 320 / s]   distances of level l
    <case>.targets          float32 [2, T, 5]   (class, x1, y1, x2, y2) as fractions of 320, class -1
                                                for padding rows (T = the case's largest count)
    <case>.loss_cls, .loss_bbox, .total   float64 []
    <case>.labels           int64 [2, 2100]    assigned class per prior, 3 = background
    <case>.metrics          float32 [2, 2100]  assigned IoU per prior (0 for background)
    <case>.boxes            float32 [2, 2100, 4]  assigned ground-truth box (zeros for background)
    <case>.grad_cls_<l>, <case>.grad_reg_<l>   d total / d map, shaped as the maps
"""
import pathlib
import sys

import torch

from libreyolo.models.rtmdet.loss import RTMDetLoss

NC, IMGSZ, SEED = 3, 320, 20261205
STRIDES = (8, 16, 32)

CASES = {
    "two": [
        [(0, 40.0, 50.0, 140.0, 170.0), (2, 200.0, 30.0, 310.0, 120.0), (1, 90.0, 250.0, 96.0, 256.0)],
        [(1, 10.0, 10.0, 160.0, 300.0), (0, 180.0, 200.0, 260.0, 290.0)],
    ],
    "empty": [
        [(2, 60.0, 60.0, 200.0, 140.0), (0, 220.0, 150.0, 300.0, 310.0)],
        [],
    ],
}


def crowd_case():
    g = torch.Generator().manual_seed(SEED + 1)
    boxes = []
    for i in range(20):
        cx, cy = 60 + 200 * torch.rand(1, generator=g).item(), 60 + 200 * torch.rand(1, generator=g).item()
        w, h = 16 + 100 * torch.rand(1, generator=g).item(), 16 + 100 * torch.rand(1, generator=g).item()
        x1, y1 = max(cx - w / 2, 0.0), max(cy - h / 2, 0.0)
        x2, y2 = min(cx + w / 2, float(IMGSZ)), min(cy + h / 2, float(IMGSZ))
        boxes.append((i % NC, round(x1, 2), round(y1, 2), round(x2, 2), round(y2, 2)))
    return [boxes, [(1, 0.0, 0.0, float(IMGSZ), float(IMGSZ))]]


def make_maps():
    g = torch.Generator().manual_seed(SEED)
    cls, reg = [], []
    for s in STRIDES:
        n = IMGSZ // s
        cls.append(torch.randn(2, NC, n, n, generator=g) * 1.5 - 3.0)
        d = (1.0 + 5.0 * torch.rand(2, 4, n, n, generator=g)) * s
        flip = torch.rand(2, 4, n, n, generator=g) < 0.02  # a few negative distances
        reg.append(torch.where(flip, -0.3 * d, d))
    return cls, reg


def flat_decoded(cls, reg):
    """The reference loss's own flattening and decode, for calling its assigner alone."""
    b = cls[0].size(0)
    priors = RTMDetLoss(NC).prior_generator.grid_priors([tuple(c.shape[-2:]) for c in cls], device="cpu",
                                                        dtype=torch.float32)
    flat_cls = torch.cat([c.permute(0, 2, 3, 1).reshape(b, -1, NC) for c in cls], 1)
    flat_dist = torch.cat([r.permute(0, 2, 3, 1).reshape(b, -1, 4) for r in reg], 1)
    xy = priors[:, :2]
    dec = torch.stack([xy[:, 0] - flat_dist[..., 0], xy[:, 1] - flat_dist[..., 1], xy[:, 0] + flat_dist[..., 2],
                       xy[:, 1] + flat_dist[..., 3]], -1)
    return flat_cls, dec, priors


def run_case(name, gts, cls, reg, expect):
    t = max(1, max(len(g) for g in gts))
    targets = torch.full((2, t, 5), 0.0)
    targets[..., 0] = -1
    boxes_list, labels_list = [], []
    for i, g in enumerate(gts):
        for j, (c, x1, y1, x2, y2) in enumerate(g):
            targets[i, j] = torch.tensor([c, x1 / IMGSZ, y1 / IMGSZ, x2 / IMGSZ, y2 / IMGSZ])
        boxes_list.append(torch.tensor([r[1:] for r in g], dtype=torch.float32).reshape(-1, 4))
        labels_list.append(torch.tensor([r[0] for r in g], dtype=torch.long))
    # The ground truth as the C++ loss sees it: the normalised targets times the input size.
    boxes_list = [(targets[i, : len(g), 1:] * IMGSZ) for i, g in enumerate(gts)]
    loss = RTMDetLoss(NC, distributed_normalize=False)
    cls_in = [c.clone().requires_grad_(True) for c in cls]
    reg_in = [r.clone().requires_grad_(True) for r in reg]
    out = loss(tuple(cls_in), tuple(reg_in), boxes_list, labels_list)
    out["total_loss"].backward()
    expect[f"{name}.targets"] = targets
    for k in ("loss_cls", "loss_bbox"):
        expect[f"{name}.{k}"] = out[k].detach().double()
    expect[f"{name}.total"] = out["total_loss"].detach().double()
    for l in range(3):
        expect[f"{name}.grad_cls_{l}"] = cls_in[l].grad.clone()
        expect[f"{name}.grad_reg_{l}"] = reg_in[l].grad.clone()
    # The assignment alone, through the reference's assigner on its own inputs.
    flat_cls, dec, priors = flat_decoded(cls, reg)
    mg = max(1, max(b.shape[0] for b in boxes_list))
    gb = torch.zeros(2, mg, 4)
    gl = torch.zeros(2, mg, 1)
    pf = torch.zeros(2, mg, 1)
    for i, (b, c) in enumerate(zip(boxes_list, labels_list)):
        n = b.shape[0]
        gb[i, :n], gl[i, :n, 0], pf[i, :n, 0] = b, c.float(), 1.0
    a = loss.assigner(dec, flat_cls, priors, gl, gb, pf)
    expect[f"{name}.labels"] = a["assigned_labels"].long()
    expect[f"{name}.metrics"] = a["assign_metrics"].float()
    expect[f"{name}.boxes"] = a["assigned_bboxes"].float()
    pos = int((a["assigned_labels"] < NC).sum())
    print(f"{name}: total {out['total_loss'].item():.6f} cls {out['loss_cls'].item():.6f} "
          f"bbox {out['loss_bbox'].item():.6f}, {pos} positives", file=sys.stderr)


def main():
    out_path = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "rtmdet_loss_reference.pt")
    torch.manual_seed(SEED)
    cls, reg = make_maps()
    expect = {}
    for l in range(3):
        expect[f"cls_{l}"] = cls[l]
        expect[f"reg_{l}"] = reg[l]
    cases = dict(CASES)
    cases["crowd"] = crowd_case()
    for name, gts in cases.items():
        run_case(name, gts, cls, reg, expect)
    torch.save({"fixture": {"nc": NC, "imgsz": IMGSZ, "seed": SEED}, "expect": expect}, out_path)
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
