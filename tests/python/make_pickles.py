"""Writes torch.save files of varied content for the C++ reader tests.

usage: make_pickles.py OUT_DIR MARKER_DIR
Every value is built from simple rules (arange, fixed constants) that the C++ tests restate.
The hostile files would create files in MARKER_DIR if anything executed them.
"""
import collections
import os
import pickle
import subprocess
import sys

import torch

out, marker_dir = sys.argv[1], sys.argv[2]


def varied():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2)).state_dict()
    with torch.no_grad():
        for k, v in sd.items():
            if v.is_floating_point():
                v.copy_(torch.arange(v.numel(), dtype=v.dtype).reshape(v.shape) + 0.5)
    return {
        "ints": [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**31, 2**40, -2**63, 2**63 - 1],
        "floats": (0.0, -0.0, 1.5, -2.25e-300, float("inf"), 1e300),
        "nan": float("nan"),
        "text": "h\u00e9llo \u2713 \U0001F40D",
        "empty": "",
        "raw": b"\x00\x01\xfe\xffabc",
        "flags": [True, False, None],
        "nested": {"a": [1, (2, 3), {"b": [[], {}, ()]}], "t1": (7,)},
        "names": {0: "person", 1: "bicycle", 2: "car"},
        "od": collections.OrderedDict([("z", 1), ("y", 2)]),
        "sd": sd,
        "f32": base,
        "f64": torch.arange(5, dtype=torch.float64) / 4,
        "f16": torch.tensor([0.5, -2.0, 65504.0], dtype=torch.float16),
        "bf16": torch.tensor([1.0, -3.5, 256.0], dtype=torch.bfloat16),
        "i64": torch.tensor([-(2**62), 0, 2**62], dtype=torch.int64),
        "i32": torch.arange(-3, 3, dtype=torch.int32),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "b": torch.tensor([True, False, True]),
        "c64": torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64),
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "scalar": torch.tensor(3.25),
        "zero_size": torch.zeros(0, 3),
        "transposed": base.t(),
        "strided": base[1:, ::2],
        "same_as_f32": base,
        "param": torch.nn.Parameter(torch.full((2, 2), 7.0)),
        "device": torch.device("cuda", 1),
        "size": torch.Size([2, 3]),
        "set": {5},
        "barray": bytearray(b"xy"),
    }


def save_raw_pickle(path, obj, location):
    """A torch.save-like zip whose storages claim `location` (e.g. cuda:0)."""
    import io
    storages = {}
    keys = {}

    class P(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, torch.storage.TypedStorage):
                ptr = o.data_ptr()
                if ptr not in keys:
                    keys[ptr] = str(len(storages))
                    storages[keys[ptr]] = o
                return ("storage", torch.FloatStorage, keys[ptr], location, o.size())
            return None

    buf = io.BytesIO()
    P(buf, protocol=2).dump(obj)
    w = torch._C.PyTorchFileWriter(path)
    w.write_record("data.pkl", buf.getvalue(), len(buf.getvalue()))
    w.write_record("byteorder", "little", len("little"))
    for key, st in storages.items():
        data = bytes(st.untyped())
        w.write_record("data/" + key, data, len(data))
    w.write_end_of_file()


class Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


def main():
    v = varied()
    for proto in (2, 4, 5):
        torch.save(v, os.path.join(out, f"varied_p{proto}.pt"), pickle_protocol=proto)
    # More than 256 memo entries (LONG_BINPUT / LONG_BINGET) and a 1500-item dict (SETITEMS batches).
    torch.save({f"k{i}": torch.full((1,), float(i)) for i in range(1500)}, os.path.join(out, "many.pt"))
    t = torch.arange(6, dtype=torch.float32)
    save_raw_pickle(os.path.join(out, "cuda_location.pt"), {"w": t.view(2, 3), "v": t[2:]}, "cuda:0")
    save_raw_pickle(os.path.join(out, "mps_location.pt"), {"w": t}, "mps")
    torch.save({"a": torch.ones(2)}, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save({"x": Evil(os.system, "touch " + os.path.join(marker_dir, "system"))},
               os.path.join(out, "evil_system.pt"))
    torch.save([Evil(eval, f"open({os.path.join(marker_dir, 'eval')!r}, 'w')")],
               os.path.join(out, "evil_eval.pt"))
    torch.save(Evil(subprocess.Popen, ["touch", os.path.join(marker_dir, "popen")]),
               os.path.join(out, "evil_popen.pt"))


main()
