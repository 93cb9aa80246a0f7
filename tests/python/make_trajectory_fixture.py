#!/usr/bin/env python3
"""Makes tests/data/<family>_trajectory_reference.pt: a short training run of the reference
implementation (LibreYOLO 1.6.0) on fixed batches through its own trainer's pieces (parameter
groups, optimizer, learning-rate scheduler with its momentum warm-up, EMA), which
tests/test_trajectory.cpp repeats with this project's step runner and the family's recipe.

A single-step test checks a loss and its gradients; this checks what only appears over steps: the
schedule's value at each step (warm-up into the decay), the SGD momentum of each step, which
parameters carry the weight decay, and the update rule itself (momentum, Nesterov, decay) through
the loss the updated weights give at the next steps. The loss is a smooth probe, the same on both
sides: the mean over every value the training forward returns of (x - 0.5)^2. Even so the
trajectory is chaotic at the recipe's rate (a max-pool's choice or a clipped activation flips on a
rounding, and the runs part within a few steps), so each step's probe carries its own noise floor;
an error in the update rule shows in the first steps, before the floor grows (in this run: Nesterov
off, momentum 0.937 instead of 0.9: 8.6e-4 and 1.4e-4 off at steps 1 and 2, floors 1.4e-6 and
1.5e-5). Of the final state only which tensors moved is kept: most single moves after 12 steps are
as large as their floor.

Run: the reference's network from the start weights of the family's parity fixture in tests/data
(picodet_reference.pt: a PicoDet far narrower than s, 3 classes, made by make_picodet_fixture.py),
in training mode, 12 steps of batch 4 at 128 px, the family's recipe with epochs=3 and 4 batches an
epoch (one epoch of warm-up, then the decay); each batch: mid-grey noise with filled rectangles of
four colours.

The float32 noise floor of the probe: the same run from the start weights perturbed by one
rounding (each value times 1 + u, u uniform in +-2^-24), six times; `spread_loss` is the largest
distance of those runs from the unperturbed one at each step.

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_trajectory_fixture.py FAMILY OUT.pt      (FAMILY: picodet)

Contents (a dict):
  start              str            the file in tests/data whose "model" is the start state
  images             uint8 [4, 4, 128, 128, 3]    RGB, NHWC; step i trains on images[i % 4]
  lr                 float64 [12]   the learning rate each step used (the first group's)
  momentum           float64 [12]   the SGD momentum each step used
  loss, spread_loss  float32 [12]   the probe's value at each step and its noise floor
  final.<name>       float64 []     the sum of squares of each floating-point state tensor's move
                                    (parameters, BatchNorm statistics) from the start to after the
                                    last step
  ema.<name>         float64 []     the same of the EMA's state
  ema_updates        int64 []
  group.<name>       int64 []       the parameter's group in the reference's optimizer: 0 BatchNorm
                                    weights, 1 decayed weights, 2 biases
"""
import sys
from pathlib import Path

import torch

import make_picodet_fixture  # its narrow network (this folder)
from libreyolo.models.picodet.trainer import PICODETTrainer
from libreyolo.training.config import PICODETConfig
from libreyolo.training.ema import ModelEMA
from libreyolo.training.trainer import BaseTrainer

SEED = 20261208
IMGSZ = 128
BATCH = 4
STEPS = 12
DISTINCT = 4  # distinct batches, used in turn
PER_EPOCH = 4
EPOCHS = 3
COLOURS = ((230, 40, 40), (40, 220, 40), (40, 40, 230), (230, 220, 40))

# family: (network of the start weights' size and class count, trainer class, config class, the
# input's mean and std over RGB 0-255, the file in tests/data whose "model" entry is the start state)
FAMILIES = {
    "picodet": (make_picodet_fixture.build, PICODETTrainer, PICODETConfig,
                (123.675, 116.28, 103.53), (58.395, 57.12, 57.375), "picodet_reference.pt"),
}


def make_images():
    g = torch.Generator().manual_seed(SEED)
    images = torch.randint(0, 256, (DISTINCT, BATCH, IMGSZ, IMGSZ, 3), generator=g, dtype=torch.int64)
    images = (images // 2 + 64).to(torch.uint8)  # mid-grey noise
    for s in range(DISTINCT):
        for b in range(BATCH):
            for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
                w, h = (torch.randint(10, 60, (2,), generator=g)).tolist()
                x1 = int(torch.randint(0, IMGSZ - w, (1,), generator=g))
                y1 = int(torch.randint(0, IMGSZ - h, (1,), generator=g))
                c = int(torch.randint(0, len(COLOURS), (1,), generator=g))
                images[s, b, y1:y1 + h, x1:x1 + w] = torch.tensor(COLOURS[c], dtype=torch.uint8)
    return images


def flat_outputs(out):
    """Every tensor the training forward returns, in any nesting of lists, tuples and dicts."""
    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    return [t for o in out for t in flat_outputs(o)]


def probe(out):
    values = flat_outputs(out)
    n = sum(v.numel() for v in values)
    return sum(((v.float() - 0.5) ** 2).sum() for v in values) / n


class Pieces:
    """The reference trainer's own methods, on a trainer object that holds only what they read."""

    def __init__(self, family, model):
        _, trainer_cls, config_cls, mean, std, _ = FAMILIES[family]
        self.mean, self.std = torch.tensor(mean), torch.tensor(std)
        self.t = trainer_cls.__new__(trainer_cls)
        self.t.config = config_cls(epochs=EPOCHS, batch=BATCH, imgsz=IMGSZ, device="cpu")
        self.t.model = model
        self.t.device = torch.device("cpu")
        self.t.optimizer = BaseTrainer._setup_optimizer(self.t)
        self.t.lr_scheduler = trainer_cls.create_scheduler(self.t, PER_EPOCH)
        # decay and tau as the trainer's setup reads them
        self.t.ema_model = ModelEMA(model, decay=self.t.config.ema_decay, tau=getattr(self.t.config, "ema_tau", 2000))
        BaseTrainer._apply_scheduler(self.t, 0)

    def step(self, it, images):
        t = self.t
        lr = t.optimizer.param_groups[0]["lr"]
        momentum = t.optimizer.param_groups[0]["momentum"]
        x = ((images.float() - self.mean) / self.std).permute(0, 3, 1, 2).contiguous()
        loss = probe(t.model(x))
        t.optimizer.zero_grad()
        loss.backward()
        t.optimizer.step()
        t.ema_model.update(t.model)
        BaseTrainer._apply_scheduler(t, it + 1)
        return lr, momentum, float(loss.detach())


def moved(now, start):
    """The sum of squares of a tensor's move from the start, in float64."""
    return float(((now.double() - start.double()) ** 2).sum())


NUDGES = 6


def run(family, start, images):
    model = FAMILIES[family][0]()
    model.load_state_dict(start)
    model.train()
    p = Pieces(family, model)
    lrs, moms, losses = [], [], []
    for it in range(STEPS):
        lr, mom, loss = p.step(it, images[it % DISTINCT])
        lrs.append(lr)
        moms.append(mom)
        losses.append(loss)
    final = {k: moved(v.detach(), start[k]) for k, v in model.state_dict().items() if v.is_floating_point()}
    ema = {k: moved(v.detach(), start[k]) for k, v in p.t.ema_model.ema.state_dict().items() if v.is_floating_point()}
    group_of = {id(q): gi for gi, g in enumerate(p.t.optimizer.param_groups) for q in g["params"]}
    groups = {k: group_of[id(q)] for k, q in model.named_parameters()}
    return lrs, moms, losses, final, ema, p.t.ema_model.updates, groups


def main(family, out_path):
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    data = Path(__file__).resolve().parents[1] / "data"
    start = torch.load(data / FAMILIES[family][5], weights_only=True)["model"]
    images = make_images()
    lrs, moms, losses, final, ema, updates, groups = run(family, start, images)

    g = torch.Generator().manual_seed(SEED + 1)
    spread_loss = torch.zeros(STEPS, dtype=torch.float64)
    for _ in range(NUDGES):
        nudged = {}
        for k, v in start.items():
            if v.is_floating_point():
                u = (torch.rand(v.shape, generator=g, dtype=torch.float64) * 2 - 1) * 2.0 ** -24
                nudged[k] = (v.double() * (1 + u)).to(v.dtype)
            else:
                nudged[k] = v.clone()
        l2 = run(family, nudged, images)[2]
        spread_loss = torch.maximum(spread_loss, (torch.tensor(losses, dtype=torch.float64) -
                                                  torch.tensor(l2, dtype=torch.float64)).abs())

    res = {"images": images, "lr": torch.tensor(lrs, dtype=torch.float64),
           "momentum": torch.tensor(moms, dtype=torch.float64), "loss": torch.tensor(losses, dtype=torch.float32),
           "spread_loss": spread_loss.float(), "ema_updates": torch.tensor(updates), "start": FAMILIES[family][5]}
    for k, gi in groups.items():
        res[f"group.{k}"] = torch.tensor(gi)
    for k, v in final.items():
        res[f"final.{k}"] = torch.tensor(v, dtype=torch.float64)
    for k, v in ema.items():
        res[f"ema.{k}"] = torch.tensor(v, dtype=torch.float64)
    torch.save(res, out_path)
    sizes = [sum(1 for gi in groups.values() if gi == i) for i in range(3)]
    print(f"wrote {out_path}: group sizes {sizes}, EMA updates {updates}")
    for it in range(STEPS):
        print(f"  step {it:2d} lr {lrs[it]:.6f} momentum {moms[it]:.4f} loss {losses[it]:.7f} "
              f"(spread {float(spread_loss[it]):.2e})")
    still = [k for k, v in final.items() if v == 0]
    print(f"  {len(final) - len(still)} of {len(final)} state tensors moved; unmoved: {', '.join(still)}")

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in FAMILIES:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
