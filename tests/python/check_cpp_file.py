"""Checks a C++-written torch.save file with torch.load(weights_only=True).

usage: check_cpp_file.py varied FILE        FILE holds the content built by test_io_pickle_write.cpp
       check_cpp_file.py lean FILE          FILE is a lean LibreYOLO checkpoint (test_io_checkpoint.cpp)
       check_cpp_file.py same FILE ORIGINAL FILE equals ORIGINAL (types, order, dtypes, values)
Prints OK, or fails with an AssertionError saying what differs.
"""
import collections
import math
import sys

import torch


def same(a, b, where="root"):
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{where}: keys differ"
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def check_varied(d):
    assert type(d) is dict
    m = d["model"]
    assert type(m) is collections.OrderedDict, type(m)
    assert list(m.keys()) == ["conv.weight", "bn.running_var", "bn.num_batches_tracked"]
    assert torch.equal(m["conv.weight"], torch.arange(8, dtype=torch.float32).reshape(2, 1, 2, 2))
    assert torch.equal(m["bn.running_var"], torch.full((2,), 0.5))
    nbt = m["bn.num_batches_tracked"]
    assert nbt.dtype == torch.int64 and nbt.dim() == 0 and nbt.item() == 7

    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert torch.equal(d["f32"], base)
    t, s = d["t"], d["slice"]
    assert torch.equal(t, base.t()) and t.stride() == (1, 4)
    assert torch.equal(s, base[1:, ::2]) and s.storage_offset() == 4 and s.stride() == (4, 2)
    ptr = d["f32"].untyped_storage().data_ptr()
    assert t.untyped_storage().data_ptr() == ptr and s.untyped_storage().data_ptr() == ptr, "views lost their storage"
    d["f32"][1, 2] = -1.0
    assert t[2, 1].item() == -1.0, "views do not share memory"

    expect = {
        "f64": torch.arange(4, dtype=torch.float64) / 8,
        "f16": torch.tensor([0.5, -2.0, 65504.0], dtype=torch.float16),
        "bf16": torch.tensor([1.0, -3.5, 256.0], dtype=torch.bfloat16),
        "i64": torch.tensor([-(2**62), 0, 2**62], dtype=torch.int64),
        "i32": torch.arange(-3, 3, dtype=torch.int32),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64),
        "conj": torch.tensor([1 - 2j, -3 + 4j], dtype=torch.complex64),
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
        "zero": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5),
    }
    for k, v in expect.items():
        got = d[k]
        assert got.dtype == v.dtype and got.shape == v.shape, f"{k}: {got.dtype}{list(got.shape)}"
        if v.dtype in (torch.uint16, torch.float8_e4m3fn):
            got, v = got.float(), v.float()
        assert torch.equal(got, v), f"{k}: {got} vs {v}"
        assert not got.is_conj()

    assert type(d["names"]) is dict and d["names"] == {0: "person", 1: "car"}
    n = d["nested"]
    assert n["a"] == [1, (2, 3.5), None, True, False, "s\u00e9", b"\x00\xff"], n["a"]
    assert type(n["a"][1]) is tuple and type(n["a"][6]) is bytes and n["a"][3] is True
    assert n["t"] == () and n["t1"] == (1,) and n["t4"] == (1, 2, 3, 4)
    assert d["ints"] == [0, 255, 256, 65535, 65536, -1, -2**31, 2**31 - 1, 2**31, -2**31 - 1, 2**40,
                         -2**63, 2**63 - 1], d["ints"]
    f = d["floats"]
    assert f[0] == 1.25 and f[1] == 0.0 and math.copysign(1, f[1]) < 0 and f[2] == math.inf and math.isnan(f[3])
    assert d["long_list"] == list(range(2500))
    assert d["big_dict"] == {f"k{i}": i for i in range(1200)} and list(d["big_dict"]) == [f"k{i}" for i in range(1200)]
    assert type(d["od_empty"]) is collections.OrderedDict and len(d["od_empty"]) == 0
    assert d["empty_list"] == [] and d["empty_dict"] == {}


def check_lean(d):
    keys = ["model", "schema_version", "libreyolo_version", "model_family", "size", "task", "nc", "names", "imgsz"]
    assert type(d) is dict and list(d) == keys, list(d)
    assert type(d["model"]) is collections.OrderedDict
    assert list(d["model"]) == ["backbone.conv.weight", "head.bias"]
    assert torch.equal(d["model"]["backbone.conv.weight"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(d["model"]["head.bias"], torch.zeros(3, dtype=torch.float16))
    assert d["schema_version"] == "1.0" and isinstance(d["libreyolo_version"], str) and d["libreyolo_version"]
    assert (d["model_family"], d["size"], d["task"], d["nc"], d["imgsz"]) == ("yolo9", "t", "detect", 3, 640)
    assert type(d["names"]) is dict and d["names"] == {0: "cat", 1: "dog", 2: "b\u00e4r"}


mode, path = sys.argv[1], sys.argv[2]
loaded = torch.load(path, weights_only=True)
if mode == "varied":
    check_varied(loaded)
elif mode == "lean":
    check_lean(loaded)
else:
    same(loaded, torch.load(sys.argv[3], weights_only=True))
print("OK")
