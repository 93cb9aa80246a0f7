"""Write tests/data/deimv2_state_dict_<size>_nc80.tsv for every DEIMv2 size of the reference
implementation (LibreYOLO 1.6.0): each state_dict entry of the network its LibreDEIMv2Model builds, in
order, with its shape and dtype. This build has no DEIMv2 family: the listings let the tests check
that such weights are refused with a clear message, not taken for another family's.

    PYTHONPATH=<dir holding libreyolo 1.6.0> python tests/python/make_deimv2_state_dicts.py
"""

import os
import sys

import torch

from libreyolo.models.deimv2.nn import SIZE_CONFIGS, LibreDEIMv2Model

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def main() -> int:
    torch.manual_seed(0)
    for size in SIZE_CONFIGS:
        sd = LibreDEIMv2Model(size, nb_classes=80).state_dict()
        with open(os.path.join(OUT, f"deimv2_state_dict_{size}_nc80.tsv"), "w") as f:
            f.write(f"# LibreDEIMv2Model size={size} nc=80 state_dict (libreyolo/models/deimv2/nn.py; LibreYOLO "
                    "1.6.0); columns: key, shape, dtype\n")
            for k, v in sd.items():
                f.write(f"{k}\t{list(v.shape)}\t{str(v.dtype).replace('torch.', '')}\n")
        print(f"{size}: {len(sd)} entries, {sum(v.numel() for v in sd.values())} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
