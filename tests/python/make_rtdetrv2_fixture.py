"""RT-DETRv2 CPU parity fixture from the reference implementation (LibreYOLO 1.6.0).

Writes into tests/data (or --out):
  rtdetrv2_r18narrow_nc20_s320.pt         a LibreYOLO checkpoint (model_family "rtdetrv2") of a narrow
                                          RT-DETRv2-r18: the r18 topology at 1/8 of the backbone's
                                          widths, hidden 32, feed-forward 64, 20 classes, sampling
                                          points 4/3/2 on the three levels, anchors for 320;
  rtdetrv2_r18narrow_nc20_s320_expect.pt  a flat dict of tensors: the input, the targets, eval outputs
                                          (query selection, predictions, the same network with
                                          discrete sampling), training-mode outputs without and with
                                          denoising (every random draw of the denoising group
                                          recorded), every level's matches, every loss term
                                          (the encoder term "_enc_0" included) and 20 gradients.

The model starts from torch.manual_seed(0); BatchNorm affine parameters and the decoder tensors the
reference initialises to zero get deterministic noise from a generator seeded 1000, and running
statistics come from three training-mode forwards, so that no path is trivially zero. The input and
the targets are redrawn until the encoder's top-k selection and the Hungarian optima are far from
ties (the margins are recorded). CPU, float32, deterministic algorithms, one thread.

    PYTHONPATH=<dir holding libreyolo 1.6.0> python tests/python/make_rtdetrv2_fixture.py
"""

import argparse
import copy
import os
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
from scipy.optimize import linear_sum_assignment

import libreyolo.models.rtdetrv2.decoder as v2dec
from libreyolo.models.rtdetr.backbone import BasicBlock, Blocks, ConvNormLayer, PResNet
from libreyolo.models.rtdetr.loss import SetCriterion
from libreyolo.models.rtdetr.trainer import convert_targets_for_detr
from libreyolo.models.rtdetrv2.loss import RTDETRv2Loss
from libreyolo.models.rtdetrv2.nn import RTDETRv2Model
from libreyolo.utils.serialization import wrap_libreyolo_checkpoint

NAME = "rtdetrv2_r18narrow_nc20_s320"
NC = 20
IMGSZ = 320
BATCH = 2
POINTS = [4, 3, 2]
GT_COUNTS = [7, 3]

GRAD_NAMES = [
    "backbone.conv1.conv1_1.conv.weight",
    "backbone.res_layers.3.blocks.1.branch2b.norm.weight",
    "encoder.input_proj.2.0.weight",
    "encoder.encoder.0.layers.0.self_attn.in_proj_weight",
    "encoder.fpn_blocks.0.bottlenecks.0.conv1.conv.weight",
    "encoder.pan_blocks.1.conv3.norm.bias",
    "decoder.input_proj.0.conv.weight",
    "decoder.enc_output.proj.weight",
    "decoder.enc_output.norm.weight",
    "decoder.enc_score_head.bias",
    "decoder.enc_bbox_head.layers.2.weight",
    "decoder.query_pos_head.layers.0.weight",
    "decoder.decoder.layers.0.self_attn.in_proj_weight",
    "decoder.decoder.layers.0.cross_attn.sampling_offsets.weight",
    "decoder.decoder.layers.1.cross_attn.attention_weights.bias",
    "decoder.decoder.layers.2.cross_attn.value_proj.weight",
    "decoder.decoder.layers.2.linear1.weight",
    "decoder.dec_score_head.2.weight",
    "decoder.dec_bbox_head.0.layers.2.bias",
    "decoder.denoising_class_embed.weight",
]


def small_presnet18(div):
    """The reference's PResNet-18-vd (its own stage and block classes) with every width / div."""
    net = PResNet.__new__(PResNet)
    nn.Module.__init__(net)
    stem = 64 // div
    net.conv1 = nn.Sequential(OrderedDict([
        ("conv1_1", ConvNormLayer(3, stem // 2, 3, 2, act="relu")),
        ("conv1_2", ConvNormLayer(stem // 2, stem // 2, 3, 1, act="relu")),
        ("conv1_3", ConvNormLayer(stem // 2, stem, 3, 1, act="relu")),
    ]))
    widths = [w // div for w in (64, 128, 256, 512)]
    net.res_layers = nn.ModuleList()
    cin = stem
    for i, w in enumerate(widths):
        net.res_layers.append(Blocks(BasicBlock, cin, w, 2, i + 2, act="relu", variant="d"))
        cin = w
    net.return_idx = [1, 2, 3]
    net.out_channels = widths[1:]
    net.out_strides = [8, 16, 32]
    return net


def build(method="default"):
    torch.manual_seed(0)
    return RTDETRv2Model(
        num_classes=NC, backbone=small_presnet18(8), hidden_dim=32, dim_feedforward=64,
        decoder_dim_feedforward=64, expansion=0.5, num_decoder_layers=3, eval_idx=-1,
        num_decoder_points=list(POINTS), eval_spatial_size=(IMGSZ, IMGSZ), cross_attn_method=method)


def perturb(m, g):
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.mul_(1 + 0.2 * torch.randn(mod.weight.shape, generator=g))
                mod.bias.add_(0.1 * torch.randn(mod.bias.shape, generator=g))
        d = m.decoder
        noisy = []
        for layer in d.decoder.layers:
            noisy += [(layer.cross_attn.sampling_offsets.weight, 0.01),
                      (layer.cross_attn.attention_weights.weight, 0.01),
                      (layer.cross_attn.attention_weights.bias, 0.3)]
        for head in list(d.dec_bbox_head) + [d.enc_bbox_head]:
            noisy += [(head.layers[-1].weight, 0.01), (head.layers[-1].bias, 0.1)]
        for head in list(d.dec_score_head) + [d.enc_score_head]:
            noisy += [(head.bias, 0.5)]
        for p, s in noisy:
            p.add_(s * torch.randn(p.shape, generator=g))


def assignment_gap(cost):
    """How much the optimal assignment's cost grows when any one of its pairs is forbidden."""
    c = np.asarray(cost, dtype=np.float64)
    rows, cols = linear_sum_assignment(c)
    best = c[rows, cols].sum()
    gap = float("inf")
    for i, j in zip(rows, cols):
        c2 = c.copy()
        c2[i, j] = 1e9
        r2, c2c = linear_sum_assignment(c2)
        gap = min(gap, c2[r2, c2c].sum() - best)
    return gap


def draw_targets(g):
    out = []
    for n in GT_COUNTS:
        rows = []
        for j in range(n):
            lo, hi = (0.04, 0.12) if j % 2 == 0 else (0.15, 0.5)
            w, h = (lo + torch.rand(2, generator=g) * (hi - lo)).tolist()
            cx = w / 2 + float(torch.rand(1, generator=g)) * (1 - w)
            cy = h / 2 + float(torch.rand(1, generator=g)) * (1 - h)
            rows.append([cx, cy, w, h])
        out.append({"labels": torch.randint(0, NC, (n,), generator=g, dtype=torch.int64),
                    "boxes": torch.tensor(rows, dtype=torch.float32).reshape(n, 4)})
    return out


def padded(targets, rows=20):
    t = torch.zeros(len(targets), rows, 5)
    t[:, :, 0] = -1
    for b, d in enumerate(targets):
        n, bx = len(d["labels"]), d["boxes"]
        t[b, :n, 0] = d["labels"].float()
        t[b, :n, 1:] = torch.stack([bx[:, 0] - bx[:, 2] / 2, bx[:, 1] - bx[:, 3] / 2,
                                    bx[:, 0] + bx[:, 2] / 2, bx[:, 1] + bx[:, 3] / 2], 1)
    return t


class MatchLog:
    """Keeps every assignment the criterion's matcher solves, in call order."""

    def __init__(self, matcher):
        self.solves = []
        solve = matcher.solve

        def logged(cost, targets):
            r = solve(cost, targets)
            self.solves.append([(i.clone(), j.clone()) for i, j in r])
            return r

        matcher.solve = logged


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    m = build()
    g = torch.Generator().manual_seed(1000)
    perturb(m, g)
    norms = [mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)]
    m.train()
    for mod in norms:
        mod.momentum = None
    with torch.no_grad():
        for _ in range(3):
            m(torch.rand(BATCH, 3, IMGSZ, IMGSZ, generator=g))
    for mod in norms:
        mod.momentum = 0.1
    m.eval()

    exp, margins = {}, {}

    def put(key, v):
        if isinstance(v, bool):
            v = torch.tensor(v)
        elif isinstance(v, int):
            v = torch.tensor(v, dtype=torch.int64)
        elif isinstance(v, float):
            v = torch.tensor(v, dtype=torch.float32)
        exp[key] = v.detach().clone().contiguous()

    # Eval: an input whose encoder top-k (and its order) is far from ties.
    nq = m.decoder.num_queries
    for attempt in range(40):
        x_u8 = torch.randint(0, 256, (BATCH, 3, IMGSZ, IMGSZ), generator=g, dtype=torch.uint8)
        x = x_u8.float() / 255.0
        seen = {}
        hook = m.decoder.enc_score_head.register_forward_hook(lambda _m, _i, o: seen.__setitem__("logits", o.clone()))
        with torch.no_grad():
            out = m(x)
        hook.remove()
        score = seen["logits"].max(-1).values
        srt = score.sort(dim=1, descending=True).values
        boundary = float((srt[:, nq - 1] - srt[:, nq]).min())
        adjacent = float((srt[:, : nq - 1] - srt[:, 1:nq]).min())
        if boundary > 1e-4 and adjacent > 2e-6:
            break
    margins.update(topk_boundary_gap=boundary, topk_min_adjacent_gap=adjacent, input_draws=attempt + 1)
    put("input_u8", x_u8)
    put("eval.topk_ind", torch.topk(score, nq, dim=1).indices)
    put("eval.topk_logits", seen["logits"].gather(1, exp["eval.topk_ind"].unsqueeze(-1).expand(-1, -1, NC)))
    put("eval.pred_logits", out["pred_logits"])
    put("eval.pred_boxes", out["pred_boxes"])
    put("eval.anchors", m.decoder.anchors)
    put("eval.valid_mask", m.decoder.valid_mask)

    # Discrete sampling, on the attention core alone: a whole network's sampling coordinates come
    # within float rounding of a cell edge somewhere, so the core is given locations at least a
    # fifth of a cell from any edge (and some outside the maps, which clamp to the border).
    shapes = [[6, 8], [3, 4], [2, 2]]
    heads, d, q = 2, 3, 5
    value = torch.randn(BATCH, sum(h * w for h, w in shapes), heads, d, generator=g)
    cells = []
    for (h, w), n in zip(shapes, POINTS):
        ij = torch.stack([torch.randint(-1, w + 1, (BATCH, q, heads, n), generator=g),
                          torch.randint(-1, h + 1, (BATCH, q, heads, n), generator=g)], -1).float()
        jitter = (torch.rand(BATCH, q, heads, n, 2, generator=g) - 0.5) * 0.6
        cells.append((ij + jitter) / torch.tensor([w, h]))
    locations = torch.cat(cells, 3)
    weights = torch.rand(BATCH, q, heads, sum(POINTS), generator=g)
    put("discrete.value", value)
    put("discrete.shapes", torch.tensor(shapes))
    put("discrete.locations", locations)
    put("discrete.weights", weights)
    put("discrete.out", v2dec.deformable_attention_core_func_v2(value, shapes, locations, weights, list(POINTS),
                                                              method="discrete"))
    put("bilinear.out", v2dec.deformable_attention_core_func_v2(value, shapes, locations, weights, list(POINTS),
                                                              method="default"))

    # Targets whose Hungarian optimum is unique with margin at every matched level.
    probe = RTDETRv2Loss(num_classes=NC)
    for attempt in range(50):
        cand = draw_targets(g)
        mt = copy.deepcopy(m).train()
        with torch.no_grad():
            o = mt(x)
        gaps = []
        for level in [o] + o["aux_outputs"] + o["enc_aux_outputs"]:
            cost = probe.matcher.compute_cost_matrix(level, cand)
            for b, c in enumerate(cost.split([len(t["labels"]) for t in cand], -1)):
                gaps.append(assignment_gap(c[b].numpy()))
        if min(gaps) > 1e-3:
            targets = cand
            break
    else:
        raise SystemExit("no target draw with a unique Hungarian optimum")
    margins.update(hungarian_min_gap=min(gaps), target_draws=attempt + 1)
    tpad = padded(targets)
    targets = convert_targets_for_detr(tpad, BATCH)
    put("targets_padded", tpad)
    for b, d in enumerate(targets):
        put(f"targets.img{b}.labels", d["labels"])
        put(f"targets.img{b}.boxes", d["boxes"])

    def train_step(denoising):
        mm = copy.deepcopy(m).train()
        crit = RTDETRv2Loss(num_classes=NC)
        log = MatchLog(crit.matcher)
        seen = {}
        if denoising:
            original = v2dec.get_contrastive_denoising_training_group
            rand_like, randint_like = torch.rand_like, torch.randint_like
            draws = []

            def keep(f):
                def drawn(*args, **kw):
                    t = f(*args, **kw)
                    draws.append(t.clone())
                    return t
                return drawn

            def group(*args, **kw):
                torch.rand_like, torch.randint_like = keep(rand_like), keep(randint_like)
                try:
                    r = original(*args, **kw)
                finally:
                    torch.rand_like, torch.randint_like = rand_like, randint_like
                seen.update(result=r, draws=draws)
                return r

            v2dec.get_contrastive_denoising_training_group = group
            torch.manual_seed(7)
            try:
                out = mm(x, targets=targets)
            finally:
                v2dec.get_contrastive_denoising_training_group = original
        else:
            hook = mm.encoder.register_forward_hook(lambda _m, _i, o: seen.__setitem__("encoder", [t.detach().clone() for t in o]))
            out = mm(x)
            hook.remove()
        losses = crit(out, targets)
        losses["total_loss"].backward()
        return mm, out, losses, log, seen

    def record(tag, mm, out, losses, log):
        put(f"train_{tag}.pred_logits", out["pred_logits"])
        put(f"train_{tag}.pred_boxes", out["pred_boxes"])
        for kind in ("aux_outputs", "enc_aux_outputs", "dn_aux_outputs"):
            for i, level in enumerate(out.get(kind, [])):
                put(f"train_{tag}.{kind}.{i}.pred_logits", level["pred_logits"])
                put(f"train_{tag}.{kind}.{i}.pred_boxes", level["pred_boxes"])
        for lvl, solved in enumerate(log.solves):
            for b, (i, j) in enumerate(solved):
                put(f"match_{tag}.level{lvl}.img{b}.pred", i)
                put(f"match_{tag}.level{lvl}.img{b}.gt", j)
        for k, v in losses.items():
            put(f"loss_{tag}.{k}", v.detach().reshape(()))
        params = dict(mm.named_parameters())
        for n in GRAD_NAMES:
            gr = params[n].grad
            put(f"grad_{tag}.{n}", gr if gr is not None else torch.zeros(0))

    mm, out, losses, log, seen = train_step(False)
    for i, t in enumerate(seen["encoder"]):
        put(f"train_nodn.encoder_out_{i}", t)
    record("nodn", mm, out, losses, log)

    mm, out, losses, log, seen = train_step(True)
    record("dn", mm, out, losses, log)
    draws = seen["draws"]
    assert len(draws) == 4, len(draws)
    for key, t in zip(("rand_label_u", "rand_new_label", "rand_sign_bits", "rand_part_u"), draws):
        put(f"cdn.{key}", t)
    meta = seen["result"][3]
    put("cdn.num_group", int(meta["dn_num_group"]))
    for b, (i, j) in enumerate(SetCriterion.get_cdn_matched_indices(meta, targets)):
        put(f"match_dn.dn.img{b}.pred", i)
        put(f"match_dn.dn.img{b}.gt", j)

    for k, v in margins.items():
        put(f"margin.{k}", float(v) if not isinstance(v, int) else v)

    os.makedirs(a.out, exist_ok=True)
    names = {i: f"class_{i}" for i in range(NC)}
    arch = {"backbone_width_divisor": 8, "hidden_dim": 32, "dim_feedforward": 64, "decoder_dim_feedforward": 64,
            "num_decoder_points": list(POINTS), "eval_spatial_size": IMGSZ}
    ckpt = wrap_libreyolo_checkpoint(m.state_dict(), model_family="rtdetrv2", size="r18", task="detect", nc=NC,
                                     names=names, imgsz=IMGSZ, fixture_arch=arch)
    torch.save(ckpt, os.path.join(a.out, f"{NAME}.pt"))
    torch.save(exp, os.path.join(a.out, f"{NAME}_expect.pt"))
    for suffix in (".pt", "_expect.pt"):
        print(NAME + suffix, os.path.getsize(os.path.join(a.out, NAME + suffix)), "bytes")
    print("parameters", sum(p.numel() for p in m.parameters()), "margins", margins)
    print({k: round(float(v), 6) for k, v in exp.items() if k.endswith("total_loss")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
