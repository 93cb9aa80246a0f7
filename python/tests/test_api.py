"""The Python package over the C++ core, on the CPU: the API surface, predict, errors as Python
exceptions with their codes, a short training with an epoch callback, validation, and weights that
torch.load(weights_only=True) reads."""

import os

import pytest

import libreyolo_cpp as ly


def test_surface():
    for name in ("LibreYOLO", "Results", "SAMPLE_IMAGE", "LibreYOLOError", "UsageError", "DataError",
                 "ModelError", "TrainingError", "Interrupted", "version"):
        assert hasattr(ly, name), name
    assert ly.version()
    assert issubclass(ly.UsageError, ly.LibreYOLOError) and issubclass(ly.UsageError, ValueError)
    assert issubclass(ly.DataError, OSError)


def test_predict_sample_image():
    m = ly.LibreYOLO("yolo9t", device="cpu")
    info = m.info()
    assert (info["family"], info["size"], info["num_classes"]) == ("yolo9", "t", 80)
    results = m(ly.SAMPLE_IMAGE, imgsz=160, conf=0.0, max_det=7)
    assert len(results) == 1
    r = results[0]
    assert r.orig_shape == (480, 640)
    assert 0 < len(r.boxes) <= 7 and len(r.scores) == len(r.boxes) == len(r.classes)
    arrays = r.numpy()
    assert arrays["boxes"].shape == (len(r.boxes), 4)
    # Arrays, not Python objects per box: float32 boxes and scores, int64 classes, a name per box.
    import numpy as np
    assert (r.boxes.dtype, r.scores.dtype, r.classes.dtype) == (np.float32, np.float32, np.int64)
    assert len(r.names) == len(r.boxes) and all(isinstance(n, str) for n in r.names)
    t = r.torch()
    assert t["boxes"].shape == (len(r.boxes), 4) and t["boxes"].data_ptr() == r.boxes.ctypes.data
    assert "boxes" in repr(r)


def test_errors_keep_their_class_code_and_exit_code(tmp_path):
    m = ly.LibreYOLO("yolo9t", device="cpu")
    with pytest.raises(ly.UsageError) as e:
        m.predict(ly.SAMPLE_IMAGE, confidence=0.5)
    assert e.value.exit_code == 2
    assert "conf" in str(e.value) + e.value.suggestion
    with pytest.raises(ly.ModelError) as e:
        ly.LibreYOLO(str(tmp_path / "missing.pt"), device="cpu")
    assert e.value.exit_code == 4
    with pytest.raises(ly.DataError) as e:
        m.predict(str(tmp_path / "no_such_image.jpg"))
    assert e.value.exit_code == 3 and e.value.code


def test_train_val_and_weights_torch_reads(tmp_path):
    torch = pytest.importorskip("torch")
    m = ly.LibreYOLO("yolo9t", device="cpu")
    seen = []
    r = m.train(data="builtin", epochs=1, imgsz=64, batch=8, workers=0, project=str(tmp_path), name="run",
                verbose=False, on_train_start=lambda d: seen.append(("start", d)),
                on_epoch_end=lambda e: seen.append(e["epoch"]),
                on_train_end=lambda res: seen.append(("end", len(res["epochs"]))))
    assert seen == [("start", r["save_dir"]), 1, ("end", 1)]
    assert len(r["epochs"]) == 1 and r["epochs"][0]["loss"] > 0
    assert os.path.exists(r["last_checkpoint"])
    ckpt = torch.load(r["last_checkpoint"], map_location="cpu", weights_only=True)
    assert ckpt["model_family"] == "yolo9"
    metrics = m.val(data="builtin", imgsz=64, batch=8, project=str(tmp_path), name="val")
    assert 0.0 <= metrics["metrics"]["metrics/mAP50-95"] <= 1.0
    out = tmp_path / "lean.pt"
    m.save(out)
    lean = torch.load(out, map_location="cpu", weights_only=True)
    assert "model" in lean
    again = ly.LibreYOLO(out, device="cpu")
    assert again.info()["family"] == "yolo9"


def test_predict_images_in_memory(tmp_path):
    np = pytest.importorskip("numpy")
    Image = pytest.importorskip("PIL.Image")
    m = ly.LibreYOLO("yolo9t", device="cpu")
    opts = dict(imgsz=96, conf=0.000001)
    rgb = np.zeros((120, 160, 3), np.uint8)
    rgb[20:90, 30:120] = (250, 40, 40)
    rgb[:, :, 2] += np.arange(160, dtype=np.uint8)[None, :]
    path = str(tmp_path / "a.png")
    Image.fromarray(rgb).save(path)
    want = m(path, **opts)[0]
    assert len(want.boxes) > 0

    def same(r):
        assert r.orig_shape == (120, 160)
        assert np.array_equal(r.numpy()["classes"], want.numpy()["classes"])
        assert np.allclose(r.numpy()["scores"], want.numpy()["scores"], rtol=0, atol=0)

    same(m(rgb, color_format="rgb", **opts)[0])             # RGB numpy
    same(m(np.ascontiguousarray(rgb[..., ::-1]), **opts)[0])  # numpy is BGR by default (OpenCV)
    same(m(rgb.transpose(2, 0, 1).copy(), color_format="rgb", **opts)[0])  # CHW
    same(m(Image.open(path), **opts)[0])                     # PIL: RGB
    batch = m(np.stack([rgb, rgb]), color_format="rgb", **opts)  # a batch is several images
    assert [r.path for r in batch] == ["image0", "image1"]
    for r in batch:
        same(r)
    mixed = m([Image.open(path), rgb[..., ::-1]], **opts)
    assert len(mixed) == 2
    for r in mixed:
        same(r)
    with pytest.raises(ly.UsageError) as e:
        m(np.zeros((5, 5, 2), np.uint8))
    assert e.value.code == "source_invalid" and e.value.exit_code == 2
    with pytest.raises(ly.UsageError):
        m(rgb, color_format="hsv")
    with pytest.raises(ly.UsageError):
        m(object())


def test_a_callbacks_exception_ends_training_and_reaches_the_caller(tmp_path):
    m = ly.LibreYOLO("yolo9t", device="cpu")

    def stop(epoch):
        raise RuntimeError(f"stop after epoch {epoch['epoch']}")

    with pytest.raises(RuntimeError, match="stop after epoch 1"):
        m.train(data="builtin", epochs=3, imgsz=64, batch=8, workers=0, project=str(tmp_path), name="run",
                verbose=False, on_epoch_end=stop)
