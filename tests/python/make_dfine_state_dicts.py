"""Write tests/data/dfine_state_dict_<size>_nc80.tsv for every D-FINE size of the reference
implementation (LibreYOLO 1.6.0): each state_dict entry of the network LibreDFINE builds (the
default, non-scratch build at 640), in order, with its shape and dtype; and print the parameter
counts of the default and the from-scratch builds.

    PYTHONPATH=<dir holding libreyolo 1.6.0> python tests/python/make_dfine_state_dicts.py
"""

import os
import sys

import torch

from libreyolo.models.dfine.model import LibreDFINE

SIZES = ["n", "s", "m", "l", "x"]
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def build(size: str, scratch: bool) -> torch.nn.Module:
    # The wrapper's own network factory, without the constructor's weight lookup.
    wrapper = object.__new__(LibreDFINE)
    wrapper.size = size
    wrapper.nb_classes = 80
    wrapper.input_size = LibreDFINE.INPUT_SIZES[size]
    wrapper.task = "detect"
    wrapper._is_scratch_build = lambda: scratch
    return wrapper._init_model()


def main() -> int:
    torch.manual_seed(0)
    for size in SIZES:
        net = build(size, scratch=False)
        sd = net.state_dict()
        with open(os.path.join(OUT, f"dfine_state_dict_{size}_nc80.tsv"), "w") as f:
            f.write(
                f"# LibreDFINE size={size} nc=80 state_dict (libreyolo/models/dfine/nn.py LibreDFINEModel via "
                "LibreDFINE._init_model, default non-scratch build, eval_spatial_size 640; LibreYOLO 1.6.0); "
                "columns: key, shape, dtype\n"
            )
            for k, v in sd.items():
                f.write(f"{k}\t{list(v.shape)}\t{str(v.dtype).replace('torch.', '')}\n")
        params = sum(p.numel() for p in net.parameters())
        scratch = build(size, scratch=True)
        print(f"{size}: {len(sd)} entries, {params} parameters; scratch build {len(scratch.state_dict())} entries, "
              f"{sum(p.numel() for p in scratch.parameters())} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
