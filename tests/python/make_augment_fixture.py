#!/usr/bin/env python3
"""Makes tests/data/augment_reference.pt: training samples of the reference implementation
(LibreYOLO 1.6.0's augmentation classes, run on the CPU) for fixed random draws, which
tests/test_data_augment_reference.cpp feeds to the C++ augmentation and compares.

Every random number the reference draws (Python's `random` and numpy's global generator) is
scripted: the maker replaces the generators' functions with ones that hand out a recorded list
and checks that the reference asked for exactly that list, in order. The draws are written
beside the results, so the C++ side needs no random generator of Python's.

usage (a Python with numpy, OpenCV, torch, and the libreyolo 1.6.0 wheel importable):
    python tests/python/make_augment_fixture.py OUT.pt
Running it twice gives identical files.

Contents (all tensors): tile_<k> [H, W, 3] uint8 RGB images already at imgsz scale (longest
side S), labels_<k> [N, 5] float64 (x1, y1, x2, y2, class) in those pixels; S; and per case c:
case<c>_kind (0: YOLOv9 mosaic, 1: YOLOv9 plain sample, 2: YOLOX mosaic without mixup),
case<c>_draws float64 [16] = (index or xc, yc, partner 1..3, angle deg, scale, shear x deg,
shear y deg, translate x px, translate y px, hsv on, gain h, gain s, gain v, flip),
case<c>_image [S, S, 3] uint8 RGB and case<c>_targets [M, 5] float32 (class, x1, y1, x2, y2
normalised to [0, 1], real rows only).
"""
import random
import sys

import numpy as np
import torch

from libreyolo.data.augment import geometry, color, yolo9, yolox

S = 64


class Script:
    """Hands out recorded values for named draws, checking the order of the calls."""

    def __init__(self):
        self.queue = []

    def load(self, items):
        self.queue = list(items)

    def take(self, kind):
        assert self.queue, f"the reference drew an unplanned {kind}"
        k, v = self.queue.pop(0)
        assert k == kind, f"the reference drew {kind} where {k} was planned (left: {self.queue})"
        return v

    def done(self):
        assert not self.queue, f"planned draws left over: {self.queue}"


script = Script()


def install():
    """Scripted stand-ins for every generator function the augmentation modules call."""
    for module in (random,):
        module.random = lambda: script.take("random")
        module.uniform = lambda a, b: script.take("uniform")
        module.randint = lambda a, b: script.take("randint")

    class NpRandom:
        @staticmethod
        def uniform(lo, hi, n):
            return np.asarray(script.take("np_uniform"), dtype=np.float64)

        @staticmethod
        def randint(lo, hi, n):
            return np.asarray(script.take("np_randint"), dtype=np.int64)

        @staticmethod
        def beta(a, b):
            return script.take("beta")

    class NpProxy:
        """numpy as the HSV jitter sees it: everything but the generator is numpy's."""

        random = NpRandom

        def __getattr__(self, name):
            return getattr(np, name)

    color.np = NpProxy()


def smooth_image(rng, h, w):
    """A photo-like picture: coarse noise resized up (cubic), with two solid rectangles."""
    import cv2

    coarse = rng.integers(0, 256, size=(max(2, h // 8), max(2, w // 8), 3)).astype(np.uint8)
    img = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    boxes = []
    for cls in range(2):
        bw, bh = int(rng.integers(w // 5, w // 2)), int(rng.integers(h // 5, h // 2))
        x1, y1 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        img[y1 : y1 + bh, x1 : x1 + bw] = (230, 60, 30) if cls == 0 else (40, 70, 220)
        boxes.append([x1, y1, x1 + bw, y1 + bh, cls])
    return img, np.asarray(boxes, dtype=np.float64)


class TinyDataset:
    """The reference's dataset interface over images already at imgsz scale (BGR inside)."""

    def __init__(self, rgb_images, labels):
        self.bgr = [np.ascontiguousarray(im[:, :, ::-1]) for im in rgb_images]
        self.labels = labels

    def __len__(self):
        return len(self.bgr)

    def load_anno(self, i):
        return self.labels[i]

    def pull_item(self, i):
        return self.bgr[i].copy(), self.labels[i].copy(), self.bgr[i].shape[:2], i


def hsv_draws(on, gains):
    """The transform's HSV draws giving integer gains `gains` (truncated u * gain)."""
    out = [("random", 0.0 if on else 0.99)]
    if on:
        u = [(g + (0.5 if g >= 0 else -0.5)) / full for g, full in zip(gains, (5.0, 30.0, 30.0))]
        out += [("np_uniform", u), ("np_randint", [1, 1, 1])]
    return out


def targets_yolo9(padded):
    real = padded[padded[:, 0] >= 0]
    return torch.from_numpy(np.ascontiguousarray(real, dtype=np.float32))


def to_rgb_u8(chw, scale):
    hwc = np.transpose(chw, (1, 2, 0)) * scale
    return torch.from_numpy(np.ascontiguousarray(np.rint(hwc).clip(0, 255).astype(np.uint8)))


def main(out_path):
    install()
    rng = np.random.default_rng(20261204)
    sizes = [(64, 48), (40, 64), (64, 64), (30, 64), (64, 22)]
    images, labels = zip(*(smooth_image(rng, h, w) for h, w in sizes))
    ds = TinyDataset(images, list(labels))
    out = {"S": torch.tensor(S)}
    for k, (im, lb) in enumerate(zip(images, labels)):
        out[f"tile_{k}"] = torch.from_numpy(np.ascontiguousarray(im))
        out[f"labels_{k}"] = torch.from_numpy(lb)

    # (kind, index or centre, partners, affine, hsv, flip)
    cases = [
        (0, (70, 58), (1, 2, 3), (0.0, 1.0, 0.0, 0.0, 0.0, 0.0), (True, (3, -17, 22)), False),
        (0, (45, 81), (3, 4, 1), (0.0, 0.62, 0.0, 0.0, 5.3, -4.1), (True, (-4, 25, -12)), True),
        (0, (90, 40), (2, 2, 4), (0.0, 1.43, 0.0, 0.0, -6.2, 3.7), (False, (0, 0, 0)), False),
        (0, (33, 95), (4, 0, 2), (0.0, 0.87, 0.0, 0.0, 1.1, 6.0), (True, (0, 0, 29)), True),
        (1, (1, 0), (0, 0, 0), (0.0, 1.0, 0.0, 0.0, 0.0, 0.0), (True, (2, 11, -28)), True),
        (1, (4, 0), (0, 0, 0), (0.0, 1.0, 0.0, 0.0, 0.0, 0.0), (True, (-5, -29, 7)), False),
        (2, (77, 66), (1, 3, 4), (7.5, 1.2, 1.5, -0.8, 4.4, -2.5), (True, (1, -9, 16)), True),
        (2, (50, 52), (2, 0, 3), (-9.1, 0.45, -1.9, 1.2, -6.1, 5.9), (False, (0, 0, 0)), False),
    ]
    for c, (kind, centre, partners, aff, (hsv_on, gains), flip) in enumerate(cases):
        angle, scale, shx, shy, tx, ty = aff
        tx, ty = (tx / S) * S, (ty / S) * S  # what the reference computes from its draws
        draws = [float(centre[0]), float(centre[1]), *map(float, partners), angle, scale, shx, shy, tx, ty,
                 float(hsv_on), *map(float, gains), float(flip)]
        if kind in (0, 1):
            data = yolo9.YOLO9MosaicMixupDataset(
                ds, (S, S), preproc=yolo9.YOLO9TrainTransform(max_labels=50, hsv_prob=0.5), mosaic=kind == 0,
                degrees=0.0, translate=0.1, mosaic_scale=(0.5, 1.5), shear=0.0)
        else:
            data = yolox.MosaicMixupDataset(
                ds, (S, S), preproc=yolox.TrainTransform(max_labels=50, hsv_prob=0.5),
                degrees=10.0, translate=0.1, mosaic_scale=(0.1, 2.0), shear=2.0, enable_mixup=False)
        plan = []
        if kind != 1:  # kind 1: mosaic off, nothing drawn for it
            plan += [("random", 0.0), ("uniform", centre[1] + 0.25), ("uniform", centre[0] + 0.25)]
            plan += [("randint", p) for p in partners]
            plan += [("uniform", angle), ("uniform", scale), ("uniform", shx), ("uniform", shy),
                     ("uniform", aff[4] / S), ("uniform", aff[5] / S)]
        plan += hsv_draws(hsv_on, gains)
        plan += [("random", 0.0 if flip else 0.99)]
        if kind in (0, 1):
            plan += [("random", 0.99)]  # the vertical flip (off)
        script.load(plan)
        index = centre[0] if kind == 1 else 0
        img, padded, *_ = data[index]
        script.done()
        out[f"case{c}_kind"] = torch.tensor(kind)
        out[f"case{c}_draws"] = torch.tensor(draws, dtype=torch.float64)
        if kind == 2:
            # YOLOX: BGR 0-255 and (class, cx, cy, w, h) pixel rows, padding all zero.
            out[f"case{c}_image"] = to_rgb_u8(img[::-1], 1.0)
            real = padded[padded[:, 3] * padded[:, 4] > 0]
            xyxy = np.stack([real[:, 0], real[:, 1] - real[:, 3] / 2, real[:, 2] - real[:, 4] / 2,
                             real[:, 1] + real[:, 3] / 2, real[:, 2] + real[:, 4] / 2], 1)
            xyxy[:, 1:] = np.clip(xyxy[:, 1:] / S, 0, 1)
            out[f"case{c}_targets"] = torch.from_numpy(xyxy.astype(np.float32))
        else:
            out[f"case{c}_image"] = to_rgb_u8(img, 255.0)
            out[f"case{c}_targets"] = targets_yolo9(padded)
    torch.save(out, out_path)
    print(f"wrote {out_path}: {len(cases)} cases")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "augment_reference.pt")
