"""pycocotools' COCOeval (bbox) on data sets written by tests/test_eval_coco.cpp.

Input JSON: {"sets": [{"images": [id...], "categories": [id...],
                       "gt": [[image_id, category, x, y, w, h, area]...],
                       "dt": [[image_id, category, x, y, w, h, score]...],
                       "img_ids": [id...] or null}]}
Output JSON on stdout: {"results": [{"stats": [12 floats], "precision": float, "recall": float}]}
where precision / recall are the means of the valid entries of eval["precision"] and
eval["recall"] at area "all", maxDets 100.
"""
import contextlib
import json
import sys

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval


def evaluate(data):
    gt = COCO()
    gt.dataset = {
        "images": [{"id": i} for i in data["images"]],
        "categories": [{"id": c} for c in data["categories"]],
        # Annotation ids start at 1: COCOeval treats a match id of 0 as "unmatched".
        "annotations": [
            {"id": n + 1, "image_id": g[0], "category_id": g[1], "bbox": g[2:6],
             "area": g[6], "iscrowd": 0}
            for n, g in enumerate(data["gt"])
        ],
    }
    gt.createIndex()
    dt = gt.loadRes([
        {"image_id": d[0], "category_id": d[1], "bbox": d[2:6], "score": d[6]}
        for d in data["dt"]
    ])
    ev = COCOeval(gt, dt, "bbox")
    if data.get("img_ids") is not None:
        ev.params.imgIds = data["img_ids"]
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    p = ev.eval["precision"][:, :, :, 0, -1]
    r = ev.eval["recall"][:, :, 0, -1]
    return {
        "stats": [float(s) for s in ev.stats],
        "precision": float(np.mean(p[p > -1])) if (p > -1).any() else -1.0,
        "recall": float(np.mean(r[r > -1])) if (r > -1).any() else -1.0,
    }


def main():
    with open(sys.argv[1]) as f:
        sets = json.load(f)["sets"]
    # pycocotools prints progress on stdout; keep stdout for the answer.
    with contextlib.redirect_stdout(sys.stderr):
        results = [evaluate(s) for s in sets]
    json.dump({"results": results}, sys.stdout)


if __name__ == "__main__":
    main()
