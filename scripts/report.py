#!/usr/bin/env python3
"""Summarises a demo run directory (train.json, val.json, predict.json, results.csv)."""
import csv
import json
import os
import sys

runs = sys.argv[1]
train = json.load(open(os.path.join(runs, "train.json")))
val = json.load(open(os.path.join(runs, "val.json")))
preds = [json.load(open(os.path.join(runs, f))) for f in ("predict.json", "predict_sample.json")
         if os.path.exists(os.path.join(runs, f))]
rows = list(csv.DictReader(open(os.path.join(train["save_dir"], "results.csv"))))
print(f"model            {train['model']} ({train['model_family']}) on {train['data']}, device {train['device']}")
print(f"epochs           {train['epochs_completed']} in {float(rows and sum(float(r['time']) for r in rows) or 0):.1f} s of training")
if rows:
    first, last = rows[0], rows[-1]
    print(f"train loss       {float(first['train/loss']):.3f} (epoch 1) -> {float(last['train/loss']):.3f} (epoch {last['epoch']})")
m = val["metrics"]
print(f"val mAP50        {m.get('metrics/mAP50', 0):.4f}")
print(f"val mAP50-95     {m.get('metrics/mAP50-95', 0):.4f}")
print(f"best weights     {train.get('best_weights') or train.get('last_weights')}")
for r in [r for p in preds for r in p["results"]]:
    print(f"predict          {r['source']}: {len(r['detections'])} detections, "
          f"{r['speed_ms']['inference']:.1f} ms inference -> {r.get('saved_path', '(not saved)')}")
    for d in r["detections"][:8]:
        print(f"                 {d['class_name']:<10} {d['score']:.2f}  {[round(v) for v in d['box']]}")
