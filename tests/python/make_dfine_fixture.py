"""D-FINE (or DEIM) CPU parity fixture from the reference implementation (LibreYOLO 1.6.0).

--family deim: the same network built from the reference's DEIM modules (SiLU in the decoder's
feed-forward layers, LQE and MLP heads) and trained with its criterion (the matchability-aware
class term, gamma 1.5), into deim_narrow_nc20_s320.pt and deim_narrow_nc20_s320_expect.pt (the
three-level network only: the two-level layout is D-FINE's own code path).

Writes into tests/data (or --out):
  dfine_narrow_nc20_s320.pt          a LibreYOLO checkpoint (model_family "dfine") of a narrow
                                     three-level D-FINE: an HGNetv2 of the B0 kinds of parts (learnable
                                     affine blocks, light blocks, downsampling) at small widths, encoder
                                     width 48 (so the decoder's input projections exist, as in size x),
                                     decoder width 32, 3/6/3 sampling points, 3 layers, 20 classes,
                                     anchors for 320;
  dfine_narrow2_nc20_s320.pt         the same kinds of parts on two levels (strides 16 and 32, size n's
                                     layout) with equal encoder and decoder widths;
  dfine_narrow_nc20_s320_expect.pt   a flat dict of tensors: the input, the eval outputs of both
                                     networks (query selection, predictions, the postprocessed
                                     detections), the FDR primitives on random input, the targets,
                                     training-mode outputs of the three-level network without and
                                     with denoising (every random draw of the denoising group
                                     recorded), its loss terms and gradients, and each recorded
                                     gradient's own float32 error (ref_f32_err_grad_<tag>.<name>,
                                     against the reference's float64 run of the same step).

The models start from torch.manual_seed(0); BatchNorm affine parameters and the decoder tensors the
reference initialises to zero or constants get deterministic noise from a generator seeded 1000,
and running statistics come from three training-mode forwards, so that no path is trivially zero.
The input is redrawn until the encoder's top-k selection is far from ties (margins recorded). CPU,
float32, deterministic algorithms, one thread.

    PYTHONPATH=<dir holding libreyolo 1.6.0> python tests/python/make_dfine_fixture.py [--family deim]
    ... make_dfine_fixture.py [--family deim] --add-float64-errors   (only the float32 errors, added to
                                                                     the existing files)
"""

import argparse
import copy
import os
import sys

import torch
import torch.nn as nn

import importlib

from libreyolo.utils.serialization import wrap_libreyolo_checkpoint

FAMILY = "deim" if "--family" in sys.argv and sys.argv[sys.argv.index("--family") + 1] == "deim" else "dfine"
_pkg = f"libreyolo.models.{FAMILY}"
dfdec = importlib.import_module(f"{_pkg}.decoder")
HGNetv2 = importlib.import_module(f"{_pkg}.backbone").HGNetv2
Transformer = dfdec.DEIMTransformer if FAMILY == "deim" else dfdec.DFINETransformer
HybridEncoder = importlib.import_module(f"{_pkg}.encoder").HybridEncoder
_fdr = importlib.import_module(f"{_pkg}.fdr")
Integral, distance2bbox, weighting_function = _fdr.Integral, _fdr.distance2bbox, _fdr.weighting_function
_loss = importlib.import_module(f"{_pkg}.loss")
Criterion = _loss.DEIMCriterion if FAMILY == "deim" else _loss.DFINECriterion
HungarianMatcher = importlib.import_module(f"{_pkg}.matcher").HungarianMatcher
postprocess = importlib.import_module(f"libreyolo.postprocess.{FAMILY}").postprocess
# DEIM's decoder: SiLU in its layers and MLP heads (LibreYOLO's DEIM size table).
DECODER_ACT = {"activation": "silu", "mlp_act": "silu"} if FAMILY == "deim" else {}
CLASS_TERM = "mal" if FAMILY == "deim" else "vfl"
CLASS_GAMMA = 1.5 if FAMILY == "deim" else 2.0

NAME = f"{FAMILY}_narrow_nc20_s320"
NAME2 = f"{FAMILY}_narrow2_nc20_s320"
NC = 20
IMGSZ = 320
BATCH = 2
GT_COUNTS = [6, 3]
MAX_DET = 30

# A backbone of HGNetv2's kinds of stages at small widths: (in, mid, out, blocks, downsample, light,
# kernel, layers).
TINY = {
    "stem_channels": [3, 8, 8],
    "stage_config": {
        "stage1": [8, 8, 16, 1, False, False, 3, 2],
        "stage2": [16, 8, 32, 1, True, False, 3, 2],
        "stage3": [32, 16, 48, 2, True, True, 5, 2],
        "stage4": [48, 16, 64, 1, True, True, 5, 2],
    },
}

GRAD_NAMES = [
    "backbone.stem.stem1.conv.weight",
    "backbone.stem.stem2a.lab.scale",
    "backbone.stages.2.blocks.1.layers.0.conv2.conv.weight",
    "encoder.input_proj.2.conv.weight",
    "encoder.encoder.0.layers.0.self_attn.in_proj_weight",
    "encoder.fpn_blocks.0.cv2.0.bottlenecks.0.conv1.conv.weight",
    "encoder.pan_blocks.1.cv4.norm.bias",
    "encoder.downsample_convs.0.0.cv2.conv.weight",
    "decoder.input_proj.0.conv.weight",
    "decoder.enc_output.proj.weight",
    "decoder.enc_score_head.bias",
    "decoder.enc_bbox_head.layers.2.weight",
    "decoder.query_pos_head.layers.0.weight",
    "decoder.decoder.layers.0.self_attn.in_proj_weight",
    "decoder.decoder.layers.0.cross_attn.sampling_offsets.weight",
    "decoder.decoder.layers.1.gateway.gate.weight",
    "decoder.decoder.layers.2.linear1.weight",
    "decoder.decoder.lqe_layers.1.reg_conf.layers.0.weight",
    "decoder.dec_score_head.2.weight",
    "decoder.dec_bbox_head.0.layers.2.bias",
    "decoder.dec_bbox_head.2.layers.2.weight",
    "decoder.pre_bbox_head.layers.2.weight",
    "decoder.denoising_class_embed.weight",
]


class Narrow(nn.Module):
    """backbone / encoder / decoder from the reference's own classes, at small widths."""

    def __init__(self, levels):
        super().__init__()
        HGNetv2.arch_configs["TINY"] = TINY
        three = levels == 3
        self.backbone = HGNetv2("TINY", use_lab=True, return_idx=(1, 2, 3) if three else (2, 3), freeze_at=-1,
                                freeze_norm=False)
        enc_hidden = 48 if three else 32
        self.encoder = HybridEncoder(
            in_channels=(32, 48, 64) if three else (48, 64), feat_strides=(8, 16, 32) if three else (16, 32),
            hidden_dim=enc_hidden, dim_feedforward=64, expansion=0.5, depth_mult=0.67,
            use_encoder_idx=(2,) if three else (1,), eval_spatial_size=(IMGSZ, IMGSZ))
        self.decoder = Transformer(
            **DECODER_ACT,
            num_classes=NC, hidden_dim=32, feat_channels=(enc_hidden,) * levels,
            feat_strides=(8, 16, 32) if three else (16, 32), num_levels=levels,
            num_points=(3, 6, 3) if three else (6, 6), num_layers=3, dim_feedforward=64,
            eval_spatial_size=(IMGSZ, IMGSZ), eval_idx=-1, reg_scale=4.0)

    def forward(self, x, targets=None):
        return self.decoder(self.encoder(self.backbone(x)), targets=targets)


def build(levels):
    torch.manual_seed(0)
    return Narrow(levels)


def perturb(m, g):
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.mul_(1 + 0.2 * torch.randn(mod.weight.shape, generator=g))
                mod.bias.add_(0.1 * torch.randn(mod.bias.shape, generator=g))
        for name, p in m.named_parameters():
            if name.endswith("lab.scale") or name.endswith("lab.bias"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
        d = m.decoder
        noisy = []
        for layer in d.decoder.layers:
            noisy += [(layer.cross_attn.sampling_offsets.weight, 0.01),
                      (layer.cross_attn.attention_weights.weight, 0.01),
                      (layer.cross_attn.attention_weights.bias, 0.3),
                      (layer.gateway.gate.weight, 0.05)]
        for lqe in d.decoder.lqe_layers:
            noisy += [(lqe.reg_conf.layers[-1].weight, 0.1), (lqe.reg_conf.layers[-1].bias, 0.1)]
        for head in list(d.dec_bbox_head) + [d.enc_bbox_head, d.pre_bbox_head]:
            noisy += [(head.layers[-1].weight, 0.02), (head.layers[-1].bias, 0.2)]
        for head in list(d.dec_score_head) + [d.enc_score_head]:
            noisy += [(head.bias, 0.5)]
        for p, s in noisy:
            p.add_(s * torch.randn(p.shape, generator=g))


def settle(m, g):
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


def criterion():
    matcher = HungarianMatcher(weight_dict={"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0},
                               use_focal_loss=True, alpha=0.25, gamma=2.0)
    weights = {f"loss_{CLASS_TERM}": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5}
    return Criterion(matcher=matcher, weight_dict=weights, losses=[CLASS_TERM, "boxes", "local"], alpha=0.75,
                     gamma=CLASS_GAMMA, num_classes=NC, reg_max=32, distributed_normalize=False)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


def float64_errors(m, exp, put):
    """The fixture's own float32 error of every recorded gradient (ref_f32_err_grad_<tag>.<name>):
    its relative distance to the reference's float64 run of the same training step (the network cast
    to double, the recorded denoising draws replayed). It depends on the float32 summation order of
    the machine that made the fixture; a parity test adds it to its own. The float64 run must select
    the same queries and matches: its encoder outputs and loss terms are checked against the
    recorded float32 ones."""
    x = exp["input_u8"].double() / 255.0
    targets = [{"labels": exp[f"targets.img{b}.labels"], "boxes": exp[f"targets.img{b}.boxes"].double()}
               for b in range(BATCH)]
    recorded = [exp[f"cdn.{k}"] for k in ("rand_label_u", "rand_new_label", "rand_sign_bits", "rand_part_u")]
    for tag in ("nodn", "dn"):
        mm = copy.deepcopy(m).double().train()
        if tag == "dn":
            queue = list(recorded)
            rand_like, randint_like = torch.rand_like, torch.randint_like

            def replay(like, *args, **kw):
                t = queue.pop(0)
                assert t.shape == like.shape, (t.shape, like.shape)
                return t.to(kw.get("dtype") or like.dtype)

            torch.rand_like, torch.randint_like = replay, replay
            try:
                out = mm(x, targets=targets)
            finally:
                torch.rand_like, torch.randint_like = rand_like, randint_like
            assert not queue, "the float64 run drew fewer denoising values than recorded"
        else:
            out = mm(x)
        # The same queries (their order may differ where float64 orders near-equal scores otherwise:
        # the decoder and the loss do not depend on it).
        ours, want = out["enc_aux_outputs"][0]["pred_boxes"].detach(), exp[f"train_{tag}.enc_aux_outputs.0.pred_boxes"]
        near = (ours.unsqueeze(2) - want.double().unsqueeze(1)).abs().amax(-1).amin(-1)  # [B, Q]
        assert float(near.max()) < 1e-4, f"{tag}: the float64 run selects other queries ({float(near.max()):.2e})"
        # The reference computes the FGL targets' bin weights in float32 (translate_gt's .float()),
        # whatever the boxes' precision: so does this run.
        translate = _fdr.translate_gt
        as_float = lambda v: v.float() if torch.is_tensor(v) else v  # noqa: E731
        _fdr.translate_gt = lambda gt, *a: tuple(t.to(gt.dtype) for t in translate(*map(as_float, (gt, *a))))
        try:
            losses = criterion()(out, targets)
        finally:
            _fdr.translate_gt = translate
        for k, v in losses.items():
            want = float(exp[f"loss_{tag}.{k}"])
            d = abs(float(v) - want) / max(abs(want), 1e-6)
            assert d < 1e-4, f"{tag} {k}: float64 {float(v)} against the recorded float32 {want} (other matches?)"
        sum(losses.values()).backward()
        params = dict(mm.named_parameters())
        for n in GRAD_NAMES:
            want = exp[f"grad_{tag}.{n}"]
            if want.numel() == 0:
                continue
            err = rel(want, params[n].grad)
            put(f"ref_f32_err_grad_{tag}.{n}", torch.tensor(err, dtype=torch.float64))
            print(f"  {tag} {n}: the fixture's float32 error {err:.2e}")


def add_float64_errors(out_dir):
    """Adds the ref_f32_err_grad_* entries to an existing expect file, leaving every other entry as it is."""
    m = build(3)
    ckpt = torch.load(os.path.join(out_dir, f"{NAME}.pt"), weights_only=False)
    m.load_state_dict(ckpt["model"])
    m.eval()
    path = os.path.join(out_dir, f"{NAME}_expect.pt")
    exp = torch.load(path, weights_only=True)
    exp = {k: v for k, v in exp.items() if not k.startswith("ref_f32_err_grad_")}

    def put(key, v):
        exp[key] = v

    float64_errors(m, exp, put)
    torch.save(exp, path)
    print(path, os.path.getsize(path), "bytes")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    ap.add_argument("--family", choices=["dfine", "deim"], default="dfine")
    ap.add_argument("--add-float64-errors", action="store_true",
                    help="only add the fixture's own float32 errors to the existing files in --out")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if a.add_float64_errors:
        return add_float64_errors(a.out)

    exp, margins = {}, {}

    def put(key, v):
        if isinstance(v, bool):
            v = torch.tensor(v)
        elif isinstance(v, int):
            v = torch.tensor(v, dtype=torch.int64)
        elif isinstance(v, float):
            v = torch.tensor(v, dtype=torch.float32)
        exp[key] = v.detach().clone().contiguous()

    g = torch.Generator().manual_seed(1000)
    m = build(3)
    perturb(m, g)
    settle(m, g)
    m2 = build(2)
    perturb(m2, g)
    settle(m2, g)

    nq = m.decoder.num_queries
    for attempt in range(100):
        x_u8 = torch.randint(0, 256, (BATCH, 3, IMGSZ, IMGSZ), generator=g, dtype=torch.uint8)
        x = x_u8.float() / 255.0
        ok = True
        outs = []
        for tag, net in (("eval", m), ("eval2", m2)):
            seen = {}
            hook = net.decoder.enc_score_head.register_forward_hook(
                lambda _m, _i, o: seen.__setitem__("logits", o.clone()))
            with torch.no_grad():
                out = net(x)
            hook.remove()
            score = seen["logits"].max(-1).values
            srt = score.sort(dim=1, descending=True).values
            boundary = float((srt[:, nq - 1] - srt[:, nq]).min())
            adjacent = float((srt[:, : nq - 1] - srt[:, 1:nq]).min())
            flat = out["pred_logits"].sigmoid().flatten(1).sort(dim=1, descending=True).values
            det_gap = float((flat[:, :MAX_DET] - flat[:, 1:MAX_DET + 1]).min())
            ok = ok and boundary > 3e-5 and adjacent > 1e-6 and det_gap > 3e-6
            outs.append((tag, net, seen, score, out, boundary, adjacent, det_gap))
        if ok:
            break
    else:
        raise SystemExit("no input draw far enough from ties")
    margins["input_draws"] = attempt + 1
    put("input_u8", x_u8)
    for tag, net, seen, score, out, boundary, adjacent, det_gap in outs:
        margins[f"{tag}_topk_boundary_gap"] = boundary
        margins[f"{tag}_topk_min_adjacent_gap"] = adjacent
        margins[f"{tag}_detection_min_gap"] = det_gap
        ind = torch.topk(score, nq, dim=1).indices
        put(f"{tag}.topk_ind", ind)
        put(f"{tag}.topk_logits", seen["logits"].gather(1, ind.unsqueeze(-1).expand(-1, -1, NC)))
        put(f"{tag}.pred_logits", out["pred_logits"])
        put(f"{tag}.pred_boxes", out["pred_boxes"])
        put(f"{tag}.anchors", net.decoder.anchors)
        put(f"{tag}.valid_mask", net.decoder.valid_mask)
        # Detections of image 0 at its original size 400 x 300 (w x h): the top MAX_DET, conf 0.05.
        det = postprocess({"pred_logits": out["pred_logits"][:1], "pred_boxes": out["pred_boxes"][:1]},
                          conf_thres=0.05, original_size=(400, 300), max_det=MAX_DET)
        put(f"{tag}.det.boxes", torch.as_tensor(det["boxes"]).float())
        put(f"{tag}.det.scores", torch.as_tensor(det["scores"]).float())
        put(f"{tag}.det.classes", torch.as_tensor(det["classes"]).long())

    # The FDR primitives on random input.
    up, rs = m.decoder.up, m.decoder.reg_scale
    for scale in (4.0, 8.0):
        put(f"fdr.project_{int(scale)}", weighting_function(32, up, torch.tensor([scale])))
    corners = 3 * torch.randn(BATCH, 7, 4 * 33, generator=g)
    refs = torch.rand(BATCH, 7, 4, generator=g) * 0.5 + 0.1
    put("fdr.corners", corners)
    put("fdr.refs", refs)
    dist = Integral(32)(corners, weighting_function(32, up, rs))
    put("fdr.integral", dist)
    put("fdr.boxes", distance2bbox(refs, dist, rs))

    targets = draw_targets(g)
    for b, d in enumerate(targets):
        put(f"targets.img{b}.labels", d["labels"])
        put(f"targets.img{b}.boxes", d["boxes"])

    def train_step(denoising):
        mm = copy.deepcopy(m).train()
        crit = criterion()
        seen = {}
        if denoising:
            original = dfdec.get_contrastive_denoising_training_group
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

            dfdec.get_contrastive_denoising_training_group = group
            torch.manual_seed(7)
            try:
                out = mm(x, targets=targets)
            finally:
                dfdec.get_contrastive_denoising_training_group = original
        else:
            out = mm(x)
        losses = crit(out, targets)
        total = sum(losses.values())
        total.backward()
        return mm, out, losses, seen

    def put_level(prefix, level):
        for k in ("pred_logits", "pred_boxes", "pred_corners", "ref_points"):
            if k in level:
                put(f"{prefix}.{k}", level[k])

    def record(tag, mm, out, losses):
        put_level(f"train_{tag}", out)
        for kind in ("aux_outputs", "enc_aux_outputs", "dn_outputs"):
            for i, level in enumerate(out.get(kind, [])):
                put_level(f"train_{tag}.{kind}.{i}", level)
        for kind in ("pre_outputs", "dn_pre_outputs"):
            if kind in out:
                put_level(f"train_{tag}.{kind}", out[kind])
        for k, v in losses.items():
            put(f"loss_{tag}.{k}", v.detach().reshape(()))
        params = dict(mm.named_parameters())
        for n in GRAD_NAMES:
            gr = params[n].grad
            put(f"grad_{tag}.{n}", gr if gr is not None else torch.zeros(0))

    mm, out, losses, _ = train_step(False)
    record("nodn", mm, out, losses)
    mm, out, losses, seen = train_step(True)
    record("dn", mm, out, losses)
    draws = seen["draws"]
    assert len(draws) == 4, len(draws)
    for key, t in zip(("rand_label_u", "rand_new_label", "rand_sign_bits", "rand_part_u"), draws):
        put(f"cdn.{key}", t)
    put("cdn.num_group", int(seen["result"][3]["dn_num_group"]))

    for k, v in margins.items():
        put(f"margin.{k}", float(v) if not isinstance(v, int) else v)
    float64_errors(m, exp, put)

    os.makedirs(a.out, exist_ok=True)
    names = {i: f"class_{i}" for i in range(NC)}
    for name, net in ((NAME, m), (NAME2, m2)) if FAMILY == "dfine" else ((NAME, m),):
        ckpt = wrap_libreyolo_checkpoint(net.state_dict(), model_family=FAMILY, size="s", task="detect", nc=NC,
                                         names=names, imgsz=IMGSZ)
        torch.save(ckpt, os.path.join(a.out, f"{name}.pt"))
        print(name + ".pt", os.path.getsize(os.path.join(a.out, name + ".pt")), "bytes")
    torch.save(exp, os.path.join(a.out, f"{NAME}_expect.pt"))
    print(NAME + "_expect.pt", os.path.getsize(os.path.join(a.out, NAME + "_expect.pt")), "bytes")
    print("parameters", sum(p.numel() for p in m.parameters()), sum(p.numel() for p in m2.parameters()),
          "margins", margins)
    print("losses", {k: float(v) for k, v in exp.items() if k.startswith("loss_")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
