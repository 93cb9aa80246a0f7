#!/usr/bin/env python3
"""Makes tests/data/<name>_reference.pt for the classify families: a narrow network of the reference
implementation (LibreYOLO 1.6.0), its eval logits, its training-mode cross-entropy and every
parameter's gradient, which tests/test_classify_parity.cpp loads as a checkpoint and compares with
the C++ network.

The reference fixes the widths, so the narrow networks are the reference's own classes made
narrower: ResNet with its stem and four layers rebuilt by its own _make_layer at a smaller base
width (resnet18n: BasicBlock, width 8; resnet50n: Bottleneck, width 4); MobileNetV4 from an extra
row "n" added to its ARCH_DEFS for this script (MNV4_NARROW below, head 64 wide); EfficientNetV2
from an extra row "n" of its VARIANTS (channel multiplier 0.25, depth multiplier 0.5: stem 8,
head 320, blocks 1, 1, 1, 2, 3, 4). 5 classes. Every BatchNorm's
affine and running statistics are redrawn so that no eval-mode layer is an identity.

Expected values are computed in float64 (the network cast to double) and stored as float32, with the
reference's own float32 error (max |f32 - f64| / max |f64|) beside them.

The first file also holds the eval transform's output (the reference's build_classify_transforms:
bicubic shorter-side resize to floor(S / crop_pct), centre crop, ImageNet normalisation) for one
random RGB image at two settings.

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_classify_fixture.py OUT_DIR
Contents of each file: a LibreYOLO checkpoint (model_family "resnet", "mobilenetv4" or "efficientnetv2", task
"classify", nc 5) with
  expect  dict:
    input            float32 [4, 3, 64, 64]   network input (already normalised)
    labels           int64 [4]
    logits_eval      float32 [4, 5]           eval-mode forward
    ref_f32_err_eval float64 []
    loss_train       float64 []               cross-entropy (batch mean) of the training-mode forward
    grad.<name>      float32                  d loss / d parameter, every parameter
    ref_f32_err_grad.<name> float64 []        the reference's float32 gradient against that (a
                                              train-mode BatchNorm over few values amplifies rounding)
  and (resnet18n only) pre.image uint8 [H, W, 3], pre.s<S>_c<crop*1000> float32 [3, S, S].
"""
import copy
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from libreyolo.data.augment.classify import build_classify_transforms
from libreyolo.models.efficientnetv2 import nn as effv2_nn
from libreyolo.models.mobilenetv4 import nn as mnv4_nn
from libreyolo.models.resnet import nn as resnet_nn
from libreyolo.utils.serialization import wrap_libreyolo_checkpoint

SEED = 20261207
NC = 5
BATCH = 4
SIDE = 64


def narrow_resnet(size, width):
    spec = resnet_nn.ARCH_DEFS[size]
    block = resnet_nn.Bottleneck if spec["block"] == "bottleneck" else resnet_nn.BasicBlock
    m = resnet_nn.ResNet(size=size, num_classes=NC)
    m.inplanes = width
    m.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
    m.bn1 = nn.BatchNorm2d(width)
    for k, layers in enumerate(spec["layers"]):
        setattr(m, f"layer{k + 1}", m._make_layer(block, width << k, layers, stride=1 if k == 0 else 2))
    m.num_features = (width << 3) * block.expansion
    m.fc = nn.Linear(m.num_features, NC)
    return m


# MobileNetV4: every block kind (er; uir with both, either and neither depthwise kernel, strided
# by its middle or its starting depthwise; cn 3x3 strided and 1x1) at small widths, head 64 wide.
MNV4_NARROW = {
    "stem": 8,
    "stages": [
        ["er_r1_k3_s2_e4_c16"],
        ["uir_r1_a3_k5_s2_e4_c24", "uir_r1_a3_k3_s1_e2_c24"],
        ["uir_r1_a5_k0_s2_e3_c32", "uir_r1_a0_k3_s1_e2_c32", "uir_r1_a3_k0_s1_e4_c32", "uir_r1_a0_k0_s1_e2_c32"],
        ["cn_r1_k3_s2_e1_c40", "cn_r1_k1_s1_e1_c40"],
        ["cn_r1_k1_s1_c64"],
    ],
}


def narrow_mobilenetv4():
    mnv4_nn.ARCH_DEFS["n"] = MNV4_NARROW
    head = mnv4_nn.HEAD_HIDDEN_SIZE
    mnv4_nn.HEAD_HIDDEN_SIZE = 64
    try:
        return mnv4_nn.MobileNetV4(size="n", num_classes=NC)
    finally:
        mnv4_nn.HEAD_HIDDEN_SIZE = head


def narrow_efficientnetv2():
    effv2_nn.VARIANTS["n"] = {"channel_multiplier": 0.25, "depth_multiplier": 0.5}
    return effv2_nn.EfficientNetV2(size="n", num_classes=NC)


def classifier_of(model):
    return model.fc if hasattr(model, "fc") else model.classifier


def perturb(model, g):
    with torch.no_grad():
        for bn in model.modules():
            if isinstance(bn, nn.BatchNorm2d):
                bn.weight.copy_(1.0 + 0.2 * torch.randn(bn.weight.shape, generator=g))
                bn.bias.copy_(0.1 * torch.randn(bn.bias.shape, generator=g))
                bn.running_mean.copy_(0.1 * torch.randn(bn.running_mean.shape, generator=g))
                bn.running_var.copy_(0.5 + torch.rand(bn.running_var.shape, generator=g))
        classifier_of(model).weight.mul_(4.0)


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def make(name, family, size, model, g, out_dir, with_pre):
    perturb(model, g)
    x = torch.randn(BATCH, 3, SIDE, SIDE, generator=g)
    labels = torch.randint(0, NC, (BATCH,), generator=g)
    exp = {"input": x.clone(), "labels": labels.clone()}

    m32 = copy.deepcopy(model).eval()
    m64 = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        l64 = m64(x.double())
        l32 = m32(x)
    exp["logits_eval"] = l64.float()
    exp["ref_f32_err_eval"] = torch.tensor(rel(l32, l64), dtype=torch.float64)

    t32 = copy.deepcopy(model).train()
    t64 = copy.deepcopy(model).double().train()
    loss64 = F.cross_entropy(t64(x.double()), labels)
    loss64.backward()
    loss32 = F.cross_entropy(t32(x), labels)
    loss32.backward()
    exp["loss_train"] = loss64.detach().clone()
    err = 0.0
    p32 = dict(t32.named_parameters())
    for k, p in t64.named_parameters():
        exp["grad." + k] = p.grad.float()
        e = rel(p32[k].grad, p.grad)
        exp["ref_f32_err_grad." + k] = torch.tensor(e, dtype=torch.float64)
        err = max(err, e)

    if with_pre:
        img = torch.randint(0, 256, (45, 62, 3), generator=g, dtype=torch.uint8)
        img = img.repeat_interleave(2, 0).repeat_interleave(2, 1)[:89, :123].contiguous().numpy()
        exp["pre.image"] = torch.from_numpy(img.copy())
        pil = Image.fromarray(img)
        for s, crop in ((32, 0.95), (48, 0.875)):
            t = build_classify_transforms(s, augment=False, crop_pct=crop, interpolation="bicubic")
            exp[f"pre.s{s}_c{int(round(crop * 1000))}"] = t(pil).float()

    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckpt = wrap_libreyolo_checkpoint(weights, model_family=family, size=size, task="classify", nc=NC, imgsz=SIDE)
    ckpt["expect"] = exp
    path = os.path.join(out_dir, f"{name}_reference.pt")
    torch.save(ckpt, path)
    print(f"wrote {path}: {len(weights)} entries, loss {float(loss64.detach()):.6f}, f32 errors eval "
          f"{float(exp['ref_f32_err_eval']):.2e} grad {err:.2e}")


def main(out_dir):
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)
    make("resnet18n", "resnet", "18", narrow_resnet("18", 8), g, out_dir, True)
    make("resnet50n", "resnet", "50", narrow_resnet("50", 4), g, out_dir, False)
    make("mobilenetv4n", "mobilenetv4", "m", narrow_mobilenetv4(), g, out_dir, False)
    make("efficientnetv2n", "efficientnetv2", "b0", narrow_efficientnetv2(), g, out_dir, False)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
