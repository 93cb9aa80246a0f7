#!/usr/bin/env python3
"""Deterministic synthetic datasets for the convergence benchmark: two detection sets and one
classification set.

    python3 bench/convergence/make_data.py --set colour --out /tmp/conv/colour --seed 0
    python3 bench/convergence/make_data.py --set hard   --out /tmp/conv/hard   --seed 0
    python3 bench/convergence/make_data.py --set shapes --out /tmp/conv/shapes --seed 0

Both sets have 512 training and 128 validation JPEGs (quality 90) of 810x1080,
meaning width 810 and height 1080 (portrait), the size the project's end-to-end
benchmark (bench/bench_train_e2e.cpp) generates; --width/--height change it.
The layout is YOLO's:

    OUT/images/{train,val}/NNNNN.jpg
    OUT/labels/{train,val}/NNNNN.txt   one "cls cx cy w h" line per object, normalised
    OUT/data.yaml                      path (absolute), train, val, names

Every pixel of the background is uniform noise (each channel 0..255).

colour  1-7 filled axis-aligned rectangles per image, sides 40-300 px, placed
        without overlapping each other; the class is the colour:
        red (255,40,40), green (40,255,40), blue (40,40,255).
hard    2-12 objects per image whose class is the shape: circle, triangle,
        rectangle, cross, ring. Each object has a random colour (colour carries
        no class information). About 40% of the objects are small (10-30 px
        box sides), the rest 30-220 px. Objects may overlap: a later one
        occludes the earlier ones; the label box stays the box of the whole
        shape, and an object with less than 40% of its pixels visible (more
        than 60% occluded) is dropped from the labels (its visible pixels stay
        in the picture, as clutter).

shapes  classification (the class-folder layout both implementations read:
        OUT/train/<class>/NNNNN.jpg, OUT/val/<class>/NNNNN.jpg; the printed path is
        OUT, the `data=` of a classify run): one shape per image (the five of
        the hard set, the class), in a random colour on the noise background,
        its box 25-85% of the image side, anywhere in the picture; images are
        256x256 unless --width/--height say otherwise; 512 training and 128
        validation images, the classes in turn (image i is of class i mod 5), so
        that every class folder of a split has images.

Everything comes from numpy's PCG64 seeded with (seed, split, image index), so
a given --seed gives the same files byte for byte on any machine with the same
Pillow/libjpeg (pixels and labels are identical everywhere; only the JPEG
encoder could differ). Needs numpy and Pillow.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLOUR_NAMES = ["red", "green", "blue"]
COLOUR_RGB = [(255, 40, 40), (40, 255, 40), (40, 40, 255)]
SHAPE_NAMES = ["circle", "triangle", "rectangle", "cross", "ring"]

SPLITS = {"train": 512, "val": 128}
SPLIT_ID = {"train": 0, "val": 1}

# hard set: an object whose visible fraction falls below this is dropped.
MIN_VISIBLE = 0.4


def image_rng(seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, SPLIT_ID[split], index])))


def noise_background(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------------
# colour set


def colour_image(rng: np.random.Generator, w: int, h: int):
    img = noise_background(rng, w, h)
    n = int(rng.integers(1, 8))
    placed: list[tuple[int, int, int, int]] = []  # x0, y0, x1, y1 (exclusive)
    labels = []
    for _ in range(n):
        for _attempt in range(50):
            bw = int(rng.integers(40, 301))
            bh = int(rng.integers(40, 301))
            bw, bh = min(bw, w), min(bh, h)
            x0 = int(rng.integers(0, w - bw + 1))
            y0 = int(rng.integers(0, h - bh + 1))
            box = (x0, y0, x0 + bw, y0 + bh)
            if all(box[2] <= p[0] or p[2] <= box[0] or box[3] <= p[1] or p[3] <= box[1] for p in placed):
                break
        else:
            continue  # no free place found: fewer objects in this image
        cls = int(rng.integers(0, len(COLOUR_RGB)))
        img[box[1]:box[3], box[0]:box[2]] = COLOUR_RGB[cls]
        placed.append(box)
        labels.append((cls, box))
    return img, labels


# ------------------------------------------------------------------------------------------------
# hard set


def shape_mask(rng: np.random.Generator, cls: int, bw: int, bh: int) -> np.ndarray:
    """A boolean mask [bh, bw] of one shape whose tight box is (nearly) the whole patch."""
    m = Image.new("L", (bw, bh), 0)
    d = ImageDraw.Draw(m)
    name = SHAPE_NAMES[cls]
    if name == "circle":
        d.ellipse([0, 0, bw - 1, bh - 1], fill=255)
    elif name == "triangle":
        apex = float(rng.uniform(0.15, 0.85)) * (bw - 1)
        if rng.random() < 0.5:  # apex up
            pts = [(0, bh - 1), (bw - 1, bh - 1), (apex, 0)]
        else:  # apex down
            pts = [(0, 0), (bw - 1, 0), (apex, bh - 1)]
        d.polygon(pts, fill=255)
    elif name == "rectangle":
        d.rectangle([0, 0, bw - 1, bh - 1], fill=255)
    elif name == "cross":
        tw = max(2, int(round(bw * rng.uniform(0.25, 0.4))))
        th = max(2, int(round(bh * rng.uniform(0.25, 0.4))))
        cx0 = (bw - tw) // 2
        cy0 = (bh - th) // 2
        d.rectangle([cx0, 0, cx0 + tw - 1, bh - 1], fill=255)
        d.rectangle([0, cy0, bw - 1, cy0 + th - 1], fill=255)
    elif name == "ring":
        d.ellipse([0, 0, bw - 1, bh - 1], fill=255)
        f = float(rng.uniform(0.45, 0.65))  # inner diameter / outer
        iw, ih = max(1.0, bw * f), max(1.0, bh * f)
        x0, y0 = (bw - iw) / 2, (bh - ih) / 2
        d.ellipse([x0, y0, x0 + iw - 1, y0 + ih - 1], fill=0)
    return np.asarray(m) > 127


def hard_image(rng: np.random.Generator, w: int, h: int):
    img = noise_background(rng, w, h)
    owner = np.full((h, w), -1, dtype=np.int32)
    n = int(rng.integers(2, 13))
    objs = []  # (cls, x0, y0, mask)
    for i in range(n):
        cls = int(rng.integers(0, len(SHAPE_NAMES)))
        small = rng.random() < 0.4
        lo, hi = (10, 30) if small else (30, 220)
        side = int(rng.integers(lo, hi + 1))
        if SHAPE_NAMES[cls] in ("circle", "ring", "cross"):
            aspect = float(rng.uniform(0.8, 1.25))
        else:
            aspect = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
        cap_w, cap_h = (hi, hi) if small else (w, h)
        bw = int(np.clip(round(side * np.sqrt(aspect)), lo, cap_w))
        bh = int(np.clip(round(side / np.sqrt(aspect)), lo, cap_h))
        mask = shape_mask(rng, cls, bw, bh)
        x0 = int(rng.integers(0, w - bw + 1))
        y0 = int(rng.integers(0, h - bh + 1))
        colour = rng.integers(0, 256, size=3, dtype=np.uint8)
        region = img[y0:y0 + bh, x0:x0 + bw]
        region[mask] = colour
        owner[y0:y0 + bh, x0:x0 + bw][mask] = i
        objs.append((cls, x0, y0, mask))
    labels = []
    for i, (cls, x0, y0, mask) in enumerate(objs):
        total = int(mask.sum())
        if total == 0:
            continue
        bh, bw = mask.shape
        visible = int((owner[y0:y0 + bh, x0:x0 + bw][mask] == i).sum())
        if visible < MIN_VISIBLE * total:
            continue
        ys, xs = np.nonzero(mask)  # the whole shape's tight box, occluded or not
        labels.append((cls, (x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1)))
    return img, labels


# ------------------------------------------------------------------------------------------------
# shapes (classification)


def shapes_image(rng: np.random.Generator, w: int, h: int, cls: int):
    img = noise_background(rng, w, h)
    side = min(w, h)
    bw = int(round(side * rng.uniform(0.25, 0.85)))
    bh = int(np.clip(round(bw * float(np.exp(rng.uniform(np.log(0.7), np.log(1.4))))), 0.25 * side, 0.85 * side))
    mask = shape_mask(rng, cls, bw, bh)
    x0 = int(rng.integers(0, w - bw + 1))
    y0 = int(rng.integers(0, h - bh + 1))
    img[y0:y0 + bh, x0:x0 + bw][mask] = rng.integers(0, 256, size=3, dtype=np.uint8)
    return img, cls


def generate_classify(out: Path, seed: int, w: int, h: int, counts: dict[str, int]) -> dict:
    stats = {"set": "shapes", "seed": seed, "width": w, "height": h, "names": SHAPE_NAMES, "splits": {}}
    for split, count in counts.items():
        for name in SHAPE_NAMES:
            (out / split / name).mkdir(parents=True, exist_ok=True)
        per_class = [0] * len(SHAPE_NAMES)
        for i in range(count):
            img, cls = shapes_image(image_rng(seed, split, i), w, h, i % len(SHAPE_NAMES))
            Image.fromarray(img, "RGB").save(out / split / SHAPE_NAMES[cls] / f"{i:05d}.jpg", quality=90)
            per_class[cls] += 1
        stats["splits"][split] = {"images": count, "objects": count, "per_class": per_class,
                                  "objects_max_side_le_30px": 0}
    return stats


# ------------------------------------------------------------------------------------------------


def write_yaml(out: Path, names: list[str]) -> Path:
    path = out / "data.yaml"
    lines = [
        f"path: {out.resolve()}",
        "train: images/train",
        "val: images/val",
        f"nc: {len(names)}",
        "names:",
    ] + [f"  - {n}" for n in names]
    path.write_text("\n".join(lines) + "\n")
    return path


def generate(kind: str, out: Path, seed: int, w: int, h: int, counts: dict[str, int]) -> dict:
    make = colour_image if kind == "colour" else hard_image
    names = COLOUR_NAMES if kind == "colour" else SHAPE_NAMES
    stats = {"set": kind, "seed": seed, "width": w, "height": h, "names": names, "splits": {}}
    for split, count in counts.items():
        idir = out / "images" / split
        ldir = out / "labels" / split
        idir.mkdir(parents=True, exist_ok=True)
        ldir.mkdir(parents=True, exist_ok=True)
        per_class = [0] * len(names)
        n_small = 0
        for i in range(count):
            rng = image_rng(seed, split, i)
            img, labels = make(rng, w, h)
            stem = f"{i:05d}"
            Image.fromarray(img, "RGB").save(idir / f"{stem}.jpg", quality=90)
            rows = []
            for cls, (x0, y0, x1, y1) in labels:
                bw, bh = x1 - x0, y1 - y0
                rows.append(f"{cls} {(x0 + bw / 2) / w:.6f} {(y0 + bh / 2) / h:.6f} {bw / w:.6f} {bh / h:.6f}")
                per_class[cls] += 1
                n_small += max(bw, bh) <= 30
            (ldir / f"{stem}.txt").write_text("\n".join(rows) + ("\n" if rows else ""))
        stats["splits"][split] = {"images": count, "objects": sum(per_class), "per_class": per_class,
                                  "objects_max_side_le_30px": n_small}
    write_yaml(out, names)
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", required=True, choices=["colour", "hard", "shapes"])
    ap.add_argument("--out", required=True, help="output folder (created; existing files are overwritten)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=None, help="default 810 (shapes: 256)")
    ap.add_argument("--height", type=int, default=None, help="default 1080 (shapes: 256)")
    ap.add_argument("--train", type=int, default=SPLITS["train"], help="training images (default 512)")
    ap.add_argument("--val", type=int, default=SPLITS["val"], help="validation images (default 128)")
    a = ap.parse_args(argv)
    classify = a.set == "shapes"
    a.width = a.width or (256 if classify else 810)
    a.height = a.height or (256 if classify else 1080)
    smallest = 64 if classify else 320
    if a.width < smallest or a.height < smallest:
        ap.error(f"width and height must be at least {smallest} px")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train": a.train, "val": a.val}
    stats = (generate_classify(out, a.seed, a.width, a.height, counts) if classify
             else generate(a.set, out, a.seed, a.width, a.height, counts))
    for split, s in stats["splits"].items():
        print(f"{a.set} {split}: {s['images']} images, {s['objects']} objects, per class {s['per_class']}, "
              f"{s['objects_max_side_le_30px']} with both sides <= 30 px", file=sys.stderr)
    print(str(out.resolve()) if classify else os.path.join(str(out.resolve()), "data.yaml"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
