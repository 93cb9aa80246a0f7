"""LibreYOLO C++ from Python: LibreYOLO's calls over the C++ core.

    from libreyolo_cpp import LibreYOLO, SAMPLE_IMAGE
    model = LibreYOLO("yolo9t")                   # a fresh model by name, or a checkpoint path
    results = model(SAMPLE_IMAGE)                 # predict: a list of Results, one per image
    model.train(data="my.yaml", epochs=10, batch=16, imgsz=640, device="0")
    metrics = model.val(data="my.yaml")

Options are the C++ library's (the command line's names, values and checks): keyword arguments
are passed as key=value, so an unknown key is an error naming the closest valid one. Errors are
LibreYOLOError subclasses (UsageError, DataError, ModelError, TrainingError, Interrupted) with
`code`, `suggestion` and `exit_code`. Training, validation and prediction run without holding the
GIL; `on_epoch_end` is called with each epoch's summary (a dict).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch  # noqa: F401  (LibTorch's libraries, which _core links against, loaded first)

from ._core import (  # noqa: F401  (re-exported)
    SAMPLE_IMAGE,
    DataError,
    Interrupted,
    LibreYOLOError,
    ModelError,
    TrainingError,
    UsageError,
    version,
)
from ._core import Model as _Model

__all__ = ["LibreYOLO", "Results", "SAMPLE_IMAGE", "LibreYOLOError", "UsageError", "DataError", "ModelError",
           "TrainingError", "Interrupted", "version"]


def _text(value: Any) -> str:
    """One option value as the command line writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return str(value)


def _options(kwargs: dict) -> list[tuple[str, str]]:
    return [(str(k), _text(v)) for k, v in kwargs.items() if v is not None]


class Results:
    """One image's prediction. A detector's: `boxes` (numpy float32 [N, 4], x1, y1, x2, y2 in the
    original image's pixels), `scores` (float32 [N]), `classes` (int64 [N]) and `names` (N class
    names); a classifier's: `top` (class id, name, probability) and `probs`."""

    def __init__(self, raw: dict):
        self._raw = raw
        self.path = raw["source"]
        self.orig_shape = (raw["height"], raw["width"])
        self.boxes = raw["boxes"]
        self.scores = raw["scores"]
        self.classes = raw["classes"]
        self.names = raw["names"]
        self.top = [(t["class_id"], t["class_name"], t["score"]) for t in raw["top"]]
        self.probs = raw["probs"]
        self.saved_path = raw["saved_path"] or None
        self.speed = raw["speed"]

    def __len__(self) -> int:
        return len(self.boxes) if len(self.boxes) or not self.top else len(self.top)

    def numpy(self) -> dict:
        """boxes [N, 4], scores [N], classes [N] as numpy arrays (the results' own, not copies)."""
        return {"boxes": self.boxes, "scores": self.scores, "classes": self.classes}

    def torch(self) -> dict:
        """The same as CPU torch tensors sharing the arrays' memory."""
        import torch

        return {k: torch.from_numpy(v) for k, v in self.numpy().items()}

    def __repr__(self) -> str:
        if self.top:
            best = ", ".join(f"{name} {score:.2f}" for _, name, score in self.top)
            return f"Results({self.path}: {best})"
        shown = ", ".join(f"{n} {s:.2f}" for n, s in zip(self.names[:5], self.scores[:5]))
        more = f", ... {len(self.boxes) - 5} more" if len(self.boxes) > 5 else ""
        return f"Results({self.path} {self.orig_shape[1]}x{self.orig_shape[0]}: {len(self.boxes)} boxes{': ' if shown else ''}{shown}{more})"


def _usage_error(message: str, code: str = "source_invalid") -> UsageError:
    """A UsageError raised on the Python side, with the attributes the C++ side's carry."""
    e = UsageError(message)
    e.code, e.suggestion, e.exit_code = code, "", 2
    return e


def _hwc_uint8(a):
    """A numpy image as uint8 [H, W, C] with packed pixels: CHW turned to HWC, grey given a channel,
    floats in [0, 1] scaled to [0, 255], everything else clipped to [0, 255]."""
    import numpy as np

    if a.ndim == 2:
        a = a[:, :, None]
    elif a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[0] < a.shape[2]:
        a = a.transpose(1, 2, 0)
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4):
        raise _usage_error(f"an image array must be [H, W], [H, W, C] or [C, H, W] with C 1, 3 or 4, got shape {a.shape}")
    if a.dtype != np.uint8:
        if a.dtype.kind == "f" and a.size and float(a.max()) <= 1.0:
            a = a * 255
        a = np.clip(a, 0, 255).astype(np.uint8)
    if a.strides[2] != 1 or a.strides[1] != a.shape[2]:
        a = np.ascontiguousarray(a)
    return a


def _images_of(item):
    """(uint8 [H, W, C] array, whether it came as numpy) for each image an input holds."""
    import numpy as np

    if type(item).__module__.startswith("PIL."):
        return [(np.asarray(item.convert("RGB")), False)]
    if type(item).__module__.startswith("torch"):
        t = item.detach().cpu()
        batch = [t[i] for i in range(t.shape[0])] if t.dim() == 4 else [t]
        return [(_hwc_uint8(x.numpy()), False) for x in batch]
    if isinstance(item, np.ndarray):
        batch = list(item) if item.ndim == 4 else [item]
        return [(_hwc_uint8(x), True) for x in batch]
    raise _usage_error(f"cannot predict on a {type(item).__name__}: give a path, a numpy array, a PIL image or a tensor")


class LibreYOLO:
    """A model: LibreYOLO("yolo9t"), LibreYOLO("runs/train/exp/weights/best.pt", device="0")."""

    def __init__(self, model: str | os.PathLike = "yolo9t", device: str = "auto", *, _core: Any = None):
        self._m = _core if _core is not None else _Model(os.fspath(model), device)

    @classmethod
    def create(cls, family: str, size: str, num_classes: int = 80, device: str = "auto") -> "LibreYOLO":
        """A fresh model of a family and size with num_classes classes."""
        return cls(_core=_Model.create(family, size, num_classes, device))

    def predict(self, source: Any = SAMPLE_IMAGE, color_format: str = "auto", **kwargs) -> list[Results]:
        """Predict on an image file, a folder or glob of images, SAMPLE_IMAGE, or images in memory:
        a numpy array (HWC or CHW, grey, colour or with alpha; a batch [N, ...] is N images), a PIL
        image, a torch tensor (CHW or NCHW), or a list of these. numpy arrays are BGR (OpenCV's
        order) unless color_format="rgb"; PIL images and tensors are RGB."""
        if isinstance(source, (str, os.PathLike)):
            return [Results(r) for r in self._m.predict(os.fspath(source), _options(kwargs))]
        fmt = str(color_format).lower()
        if fmt not in ("auto", "rgb", "bgr"):
            raise _usage_error(f"color_format must be 'auto', 'rgb' or 'bgr', got '{color_format}'", "config_range_error")
        images, bgr = [], []
        for item in source if isinstance(source, (list, tuple)) else [source]:
            for image, is_numpy in _images_of(item):
                images.append(image)
                bgr.append(is_numpy and fmt != "rgb" and image.shape[2] >= 3)
        return [Results(r) for r in self._m.predict_images(images, [], bgr, _options(kwargs))]

    __call__ = predict

    def train(self, on_epoch_end: Callable[[dict], None] | None = None,
              on_train_start: Callable[[str], None] | None = None,
              on_train_end: Callable[[dict], None] | None = None, **kwargs) -> dict:
        """Train with the library's options (data=..., epochs=..., batch=..., device=...).
        Callbacks: on_train_start(save_dir), on_epoch_end(epoch dict), on_train_end(result dict);
        an exception one raises ends the training and is raised here."""
        return self._m.train(_options(kwargs), on_epoch_end, on_train_start, on_train_end)

    def check_train(self, **kwargs) -> None:
        """Every check train() makes before its first step; raises what it would raise."""
        self._m.check_train(_options(kwargs))

    def val(self, **kwargs) -> dict:
        """Validate (data=..., split, conf, iou, ...): metrics, per-class rows, the table."""
        return self._m.val(_options(kwargs))

    def info(self) -> dict:
        return self._m.info()

    def save(self, path: str | os.PathLike) -> None:
        """Lean inference weights (LibreYOLO's schema, readable by torch.load(weights_only=True))."""
        self._m.save(os.fspath(path))

    def __repr__(self) -> str:
        i = self.info()
        return f"LibreYOLO({i['family']}-{i['size']}, {i['num_classes']} classes, {i['device']})"
