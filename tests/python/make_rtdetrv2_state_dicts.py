"""Write tests/data/rtdetrv2_state_dict_<size>_nc80.tsv for every RT-DETRv2 size of the reference
implementation (LibreYOLO 1.6.0): each state_dict entry of the network its LibreRTDETRv2 builds
(the default, non-scratch build at 640, no download), in order, with its shape and dtype; and print
the parameter counts of the default and the from-scratch builds.

Run on the CPU with the reference package importable:
    PYTHONPATH=<dir holding libreyolo 1.6.0> python tests/python/make_rtdetrv2_state_dicts.py
"""

import os
import sys

import torch

from libreyolo.models.rtdetrv2.model import LibreRTDETRv2

SIZES = ["r18", "r34", "r50", "r50m", "r101"]
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def build(size: str, scratch: bool) -> torch.nn.Module:
    # The wrapper's own network factory without its constructor (which would look for weights).
    wrapper = object.__new__(LibreRTDETRv2)
    wrapper.size = size
    wrapper.nb_classes = 80
    wrapper.input_size = LibreRTDETRv2.INPUT_SIZES[size]
    wrapper.task = "detect"
    wrapper._is_scratch_build = lambda: scratch
    return wrapper._init_model()


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def main() -> int:
    torch.manual_seed(0)
    for size in SIZES:
        net = build(size, scratch=False)
        sd = net.state_dict()
        path = os.path.join(OUT, f"rtdetrv2_state_dict_{size}_nc80.tsv")
        with open(path, "w") as f:
            f.write(
                f"# LibreRTDETRv2 size={size} nc=80 state_dict (as produced by libreyolo/models/rtdetrv2/nn.py "
                "RTDETRv2Model via LibreRTDETRv2._init_model, default non-scratch build, eval_spatial_size 640, "
                "no pretrained download; LibreYOLO 1.6.0 wheel, torch 2.11.0); columns: key, shape, dtype\n"
            )
            for k, v in sd.items():
                f.write(f"{k}\t{list(v.shape)}\t{dtype_name(v)}\n")
        params = sum(p.numel() for p in net.parameters())
        scratch = build(size, scratch=True)
        sparams = sum(p.numel() for p in scratch.parameters())
        print(f"{size}: {len(sd)} entries, {params} parameters; scratch build {len(scratch.state_dict())} entries, "
              f"{sparams} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
