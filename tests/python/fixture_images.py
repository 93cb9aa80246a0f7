"""Test images for the parity fixture makers: letterboxed pictures whose maps have structure at every
level, drawn from a seeded generator (the same draws give the same fixture)."""
import torch


def letterboxed_blocks(originals, imgsz, g):
    """[len(originals), 3, imgsz, imgsz] uint8: each (w, h) original scaled to fit imgsz, top-left,
    grey (114) elsewhere; its content 8 x 8 blocks of random colour with fine noise."""
    x = torch.full((len(originals), 3, imgsz, imgsz), 114, dtype=torch.uint8)
    for i, (w, h) in enumerate(originals):
        r = min(imgsz / w, imgsz / h)
        cw, ch = int(w * r), int(h * r)
        coarse = torch.randint(0, 256, (3, (ch + 7) // 8, (cw + 7) // 8), generator=g)
        coarse = coarse.repeat_interleave(8, 1).repeat_interleave(8, 2)[:, :ch, :cw]
        noise = torch.randint(-24, 25, (3, ch, cw), generator=g)
        x[i, :, :ch, :cw] = (coarse + noise).clamp(0, 255).to(torch.uint8)
    return x
