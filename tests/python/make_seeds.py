"""Writes small torch.save seeds for fuzz_checkpoint into OUT_DIR (tests/data/pickle_corpus).

usage: make_seeds.py OUT_DIR
Each seed is written twice: as the torch.save zip (py_<name>.pt) and as a bare pickle in the
fuzz target's raw format (raw_<name>.bin: record count, 16-bit record sizes, data.pkl bytes).
"""
import collections
import io
import os
import struct
import sys
import zipfile

import torch

out = sys.argv[1]


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /nonexistent/libreyolo_fuzz_marker",))


def seeds():
    torch.manual_seed(0)
    sd = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.BatchNorm2d(1)).state_dict()
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    return {
        "dict": ({"a": 1, "b": "x"}, 2),
        "state_dict": (sd, 2),
        "nested": ({"l": [1, (2, 3.5), None, True, "x", b"b"], "d": {0: "a"}, "t": ()}, 2),
        "nested_p4": ({"l": [1, (2, 3.5), None, True, "x", b"b"], "d": {0: "a"}, "t": ()}, 4),
        "dtypes": ({str(dt): torch.ones(2, dtype=dt) for dt in (
            torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8, torch.int8,
            torch.float64, torch.complex64, torch.uint16)}, 2),
        "views": ({"base": base, "t": base.t(), "s": base[1:, ::2], "e": torch.zeros(0)}, 2),
        "misc": ({"p": torch.nn.Parameter(torch.ones(1)), "dev": torch.device("cuda", 0),
                  "size": torch.Size([1, 2]), "set": {1}, "ba": bytearray(b"z"), "big": 2**70 // 2**10,
                  "neg": -2**40, "f": -1.5}, 2),
        "lean": ({"model": collections.OrderedDict([("w", torch.ones(2, 2))]), "schema_version": "1.0",
                  "libreyolo_version": "1.0", "model_family": "yolo9", "size": "t", "task": "detect",
                  "nc": 2, "names": {0: "a", 1: "b"}, "imgsz": 64}, 2),
        "evil": ({"x": Evil()}, 2),
    }


for name, (obj, proto) in seeds().items():
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=proto)
    data = buf.getvalue()
    with open(os.path.join(out, f"py_{name}.pt"), "wb") as f:
        f.write(data)
    z = zipfile.ZipFile(io.BytesIO(data))
    root = z.namelist()[0].split("/")[0]
    pkl = z.read(f"{root}/data.pkl")
    records = sorted((n for n in z.namelist() if n.startswith(f"{root}/data/")), key=lambda n: int(n.rsplit("/", 1)[1]))
    assert [n.rsplit("/", 1)[1] for n in records] == [str(i) for i in range(len(records))]
    sizes = [len(z.read(n)) for n in records]
    assert len(sizes) <= 16 and all(s < 65536 for s in sizes)
    with open(os.path.join(out, f"raw_{name}.bin"), "wb") as f:
        f.write(bytes([len(sizes)]) + b"".join(struct.pack("<H", s) for s in sizes) + pkl)
