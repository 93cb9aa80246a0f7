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
an error in the update rule shows in the first steps, before the floor grows (PicoDet: with
Nesterov off, or momentum 0.937 instead of 0.9, step 1's probe is 8.6e-4 or 2.5e-5 off, its floor
9.5e-7). Of the final state only which tensors moved is kept: most single moves after 12 steps are
as large as their floor.

Runs, 12 steps of batch 4 at 128 px in training mode, the family's recipe with its epochs and
batches an epoch set so that the steps cover the warm-up and the start of the decay; each batch:
mid-grey noise with filled rectangles of four colours:
  picodet  the start weights of its parity fixture (picodet_reference.pt: a PicoDet far narrower
           than s, 3 classes, made by make_picodet_fixture.py); 3 epochs of 4 batches (one epoch of
           quadratic warm-up, then the cosine);
  yolo9    a fresh YOLOv9-t of 3 classes (no auxiliary branch), its values rounded to float16 and
           kept here; 6 epochs of 2 batches (three epochs of linear warm-up, the momentum rising from
           0.8 to 0.937, then the linear decay).

The float32 noise floor of the probe: the same run twelve times with the weights perturbed by one
rounding (each value times 1 + u, u uniform in +-2^-24) at the start and after every update, on 1,
2 and 3 threads (sums in other orders), as two implementations' roundings differ in every operation
of every step; `spread_loss` is the largest distance of those runs from the unperturbed one (one
thread) at each step.

usage (a Python with torch and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_trajectory_fixture.py FAMILY OUT.pt      (FAMILY: picodet, yolo9)

Contents (a dict):
  start              str            the file in tests/data whose "model" is the start state, or ""
  start_names, start_shapes, start_values (start ""): the start state's floating-point tensors
                     (list of str, list of shapes, float16 [total] flat in that order; its integer
                     buffers are the fresh network's zeros)
  epochs, per_epoch  int64 []       the run's recipe length and batches an epoch
  images             uint8 [4, 4, 128, 128, 3]    RGB, NHWC; step i trains on images[i % 4]
  lr                 float64 [S]    the learning rate each step used (the first group's)
  momentum           float64 [S]    the SGD momentum each step used
  loss, spread_loss  float32 [S]    the probe's value at each step and its noise floor
  ema_updates        int64 []
  param_names, group               list of str, int64 [P]: each parameter's group in the reference's
                                    optimizer: 0 BatchNorm weights, 1 decayed weights, 2 biases
  state_names, final, ema          list of str, float64 [N]: the sum of squares of each floating-
                                    point state tensor's move (parameters, BatchNorm statistics)
                                    from the start to after the last step, of the network and of
                                    its EMA
"""
import sys
from pathlib import Path

import torch

import make_picodet_fixture  # its narrow network (this folder)
from libreyolo.models.picodet.trainer import PICODETTrainer
from libreyolo.models.yolo9.nn import LibreYOLO9Model
from libreyolo.models.yolo9.trainer import YOLO9Trainer
from libreyolo.training.config import PICODETConfig, YOLO9Config
from libreyolo.training.ema import ModelEMA
from libreyolo.training.trainer import BaseTrainer

SEED = 20261208
IMGSZ = 128
BATCH = 4
DISTINCT = 4  # distinct batches, used in turn
COLOURS = ((230, 40, 40), (40, 220, 40), (40, 40, 230), (230, 220, 40))


def fresh_yolo9():
    torch.manual_seed(SEED)
    return LibreYOLO9Model(config="t", nb_classes=3)


# Per family: the network (of the start state's size and class count), the reference's trainer and
# config classes, the training input's conversion ((pixel / divisor - mean) / std over RGB), the
# start state (a file in tests/data whose "model" it is, or None: the fresh network, its values
# rounded to float16 and kept in this fixture) and the run's epochs and batches an epoch (12 steps,
# the warm-up and some of the decay).
FAMILIES = {
    "picodet": dict(network=make_picodet_fixture.build, trainer=PICODETTrainer, config=PICODETConfig,
                    divisor=1.0, mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375),
                    start="picodet_reference.pt", epochs=3, per_epoch=4),
    "yolo9": dict(network=fresh_yolo9, trainer=YOLO9Trainer, config=YOLO9Config, divisor=255.0, mean=(0, 0, 0),
                  std=(1, 1, 1), start=None, epochs=6, per_epoch=2),
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
        f = FAMILIES[family]
        trainer_cls = f["trainer"]
        self.divisor, self.mean, self.std = f["divisor"], torch.tensor(f["mean"]), torch.tensor(f["std"])
        self.t = trainer_cls.__new__(trainer_cls)
        self.t.config = f["config"](epochs=f["epochs"], batch=BATCH, imgsz=IMGSZ, device="cpu")
        self.t.model = model
        self.t.device = torch.device("cpu")
        self.t.optimizer = BaseTrainer._setup_optimizer(self.t)
        self.t.lr_scheduler = trainer_cls.create_scheduler(self.t, f["per_epoch"])
        # decay and tau as the trainer's setup reads them
        self.t.ema_model = ModelEMA(model, decay=self.t.config.ema_decay, tau=getattr(self.t.config, "ema_tau", 2000))
        BaseTrainer._apply_scheduler(self.t, 0)

    def step(self, it, images, nudge=None):
        t = self.t
        lr = t.optimizer.param_groups[0]["lr"]
        momentum = t.optimizer.param_groups[0]["momentum"]
        x = ((images.float() / self.divisor - self.mean) / self.std).permute(0, 3, 1, 2).contiguous()
        loss = probe(t.model(x))
        t.optimizer.zero_grad()
        loss.backward()
        t.optimizer.step()
        if nudge is not None:
            with torch.no_grad():
                for q in t.model.parameters():
                    q.copy_(one_rounding(q, nudge))
        t.ema_model.update(t.model)
        BaseTrainer._apply_scheduler(t, it + 1)
        return lr, momentum, float(loss.detach())


def steps(family):
    return FAMILIES[family]["epochs"] * FAMILIES[family]["per_epoch"]


def moved(now, start):
    """The sum of squares of a tensor's move from the start, in float64."""
    return float(((now.double() - start.double()) ** 2).sum())


NUDGES = 12


def one_rounding(v, g):
    """v with each value times 1 + u, u uniform in +-2^-24 (float32's rounding step), from g."""
    u = (torch.rand(v.shape, generator=g, dtype=torch.float64) * 2 - 1) * 2.0 ** -24
    return (v.double() * (1 + u)).to(v.dtype)


def run(family, start, images, nudge=None):
    model = FAMILIES[family]["network"]()
    model.load_state_dict(start)
    model.train()
    p = Pieces(family, model)
    lrs, moms, losses = [], [], []
    for it in range(steps(family)):
        lr, mom, loss = p.step(it, images[it % DISTINCT], nudge)
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
    own = FAMILIES[family]["start"] is None
    if own:
        start = {k: v.half().float() if v.is_floating_point() else v
                 for k, v in FAMILIES[family]["network"]().state_dict().items()}
    else:
        start = torch.load(data / FAMILIES[family]["start"], weights_only=True)["model"]
    images = make_images()
    lrs, moms, losses, final, ema, updates, groups = run(family, start, images)

    g = torch.Generator().manual_seed(SEED + 1)
    spread_loss = torch.zeros(steps(family), dtype=torch.float64)
    for i in range(NUDGES):
        torch.set_num_threads(1 + i % 3)  # sums in other orders too
        nudged = {k: one_rounding(v, g) if v.is_floating_point() else v.clone() for k, v in start.items()}
        l2 = run(family, nudged, images, nudge=g)[2]
        spread_loss = torch.maximum(spread_loss, (torch.tensor(losses, dtype=torch.float64) -
                                                  torch.tensor(l2, dtype=torch.float64)).abs())
    torch.set_num_threads(1)

    res = {"images": images, "lr": torch.tensor(lrs, dtype=torch.float64),
           "momentum": torch.tensor(moms, dtype=torch.float64), "loss": torch.tensor(losses, dtype=torch.float32),
           "spread_loss": spread_loss.float(), "ema_updates": torch.tensor(updates),
           "start": "" if own else FAMILIES[family]["start"],
           "epochs": torch.tensor(FAMILIES[family]["epochs"]), "per_epoch": torch.tensor(FAMILIES[family]["per_epoch"]),
           "param_names": list(groups), "group": torch.tensor(list(groups.values())),
           "state_names": list(final), "final": torch.tensor(list(final.values()), dtype=torch.float64),
           "ema": torch.tensor([ema[k] for k in final], dtype=torch.float64)}
    if own:
        floats = {k: v for k, v in start.items() if v.is_floating_point()}
        res["start_names"] = list(floats)
        res["start_shapes"] = [list(v.shape) for v in floats.values()]
        res["start_values"] = torch.cat([v.reshape(-1) for v in floats.values()]).half()
    torch.save(res, out_path)
    sizes = [sum(1 for gi in groups.values() if gi == i) for i in range(3)]
    assert set(ema) == set(final)
    print(f"wrote {out_path}: group sizes {sizes}, EMA updates {updates}")
    for it in range(steps(family)):
        print(f"  step {it:2d} lr {lrs[it]:.6f} momentum {moms[it]:.4f} loss {losses[it]:.7f} "
              f"(spread {float(spread_loss[it]):.2e})")
    still = [k for k, v in final.items() if v == 0]
    print(f"  {len(final) - len(still)} of {len(final)} state tensors moved; unmoved: {', '.join(still)}")

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in FAMILIES:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
