"""Prints one line per tensor of a torch.save file: key, dtype, shape, float64 sum, first value."""
import sys

import torch

obj = torch.load(sys.argv[1], weights_only=True)
sd = obj["model"] if "model" in obj else obj
for key, t in sd.items():
    flat = t.reshape(-1).double()
    first = flat[0].item() if flat.numel() else 0.0
    print(f"{key}\t{str(t.dtype).replace('torch.', '')}\t{list(t.shape)}\t{flat.sum().item()!r}\t{first!r}")
