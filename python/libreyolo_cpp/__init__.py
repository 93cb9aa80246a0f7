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
    """One image's prediction: boxes (x1, y1, x2, y2, original pixels), scores, class ids and names
    for a detector; `top` (class id, name, probability) and `probs` for a classifier."""

    def __init__(self, raw: dict):
        self._raw = raw
        self.path = raw["source"]
        self.orig_shape = (raw["height"], raw["width"])
        dets = raw["detections"]
        self.boxes = [d["box"] for d in dets]
        self.scores = [d["score"] for d in dets]
        self.classes = [d["class_id"] for d in dets]
        self.names = [d["class_name"] for d in dets]
        self.top = [(t["class_id"], t["class_name"], t["score"]) for t in raw["top"]]
        self.probs = raw["probs"]
        self.saved_path = raw["saved_path"] or None
        self.speed = raw["speed"]

    def __len__(self) -> int:
        return len(self.boxes) if self.boxes or not self.top else len(self.top)

    def numpy(self) -> dict:
        """boxes [N, 4], scores [N], classes [N] as numpy arrays."""
        import numpy as np

        return {"boxes": np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4),
                "scores": np.asarray(self.scores, dtype=np.float32),
                "classes": np.asarray(self.classes, dtype=np.int64)}

    def __repr__(self) -> str:
        if self.top:
            best = ", ".join(f"{name} {score:.2f}" for _, name, score in self.top)
            return f"Results({self.path}: {best})"
        shown = ", ".join(f"{n} {s:.2f}" for n, s in zip(self.names[:5], self.scores[:5]))
        more = f", ... {len(self.boxes) - 5} more" if len(self.boxes) > 5 else ""
        return f"Results({self.path} {self.orig_shape[1]}x{self.orig_shape[0]}: {len(self.boxes)} boxes{': ' if shown else ''}{shown}{more})"


class LibreYOLO:
    """A model: LibreYOLO("yolo9t"), LibreYOLO("runs/train/exp/weights/best.pt", device="0")."""

    def __init__(self, model: str | os.PathLike = "yolo9t", device: str = "auto", *, _core: Any = None):
        self._m = _core if _core is not None else _Model(os.fspath(model), device)

    @classmethod
    def create(cls, family: str, size: str, num_classes: int = 80, device: str = "auto") -> "LibreYOLO":
        """A fresh model of a family and size with num_classes classes."""
        return cls(_core=_Model.create(family, size, num_classes, device))

    def predict(self, source: str | os.PathLike = SAMPLE_IMAGE, **kwargs) -> list[Results]:
        """Predict on an image file, a folder or glob of images, or SAMPLE_IMAGE."""
        return [Results(r) for r in self._m.predict(os.fspath(source), _options(kwargs))]

    __call__ = predict

    def train(self, on_epoch_end: Callable[[dict], None] | None = None, **kwargs) -> dict:
        """Train with the library's options (data=..., epochs=..., batch=..., device=...)."""
        return self._m.train(_options(kwargs), on_epoch_end)

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
