#!/usr/bin/env python3
"""Train OUR implementation (the `libreyolo` CLI of this repository) from scratch on a data.yaml
and write the benchmark's per-run JSON (see common.py).

    python3 bench/convergence/run_ours.py --data DIR/data.yaml --out ours.json \
        [--bin build/libreyolo] [--model yolo9t|yolox-s] [--epochs 30] [--batch 16] \
        [--imgsz 320] [--workers 8] [--seed 0] [--device 0] [--project runs/conv] \
        [--name ours_yolo9t_s0] [--set colour] [--opt key=value ...]

It runs

    LIBREYOLO_BIN train model=<model> data=<yaml> epochs=.. batch=.. imgsz=.. workers=.. seed=..
        device=.. project=.. name=.. exist_ok=true eval_interval=1 --json

A model name without a file (`yolo9t`, `yolox-s`) is a fresh, untrained model; nothing is
downloaded. `eval_interval=1` (validate after every epoch) is already our YOLOv9 default; our
YOLOX default is 10, so it is passed explicitly, as it is to the reference. Everything else is
our own default for the family.

`wall_s` is the whole command, process start to exit (model construction, dataset scan,
training, per-epoch validation, checkpoints, plots). The per-epoch rows come from the run's
`results.csv` (columns `train/loss`, `train/<term>_loss`, `metrics/mAP50`, `metrics/mAP50-95`,
`validated`, `time`); the run directory is the `save_dir` of the `--json` answer, else
project/name. The binary comes from --bin, else $LIBREYOLO_BIN, else build/libreyolo. The CLI's
log (stderr) goes to <out>.log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train our libreyolo CLI from scratch; write per-epoch mAP JSON.")
    common.add_run_arguments(ap, "ours", "one more key=value option for the CLI")
    ap.add_argument("--bin", default=None, help="the libreyolo binary (default $LIBREYOLO_BIN, else build/libreyolo)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds before the run is killed")
    a = ap.parse_args(argv)

    binary = a.bin or os.environ.get("LIBREYOLO_BIN") or str(ROOT / "build" / "libreyolo")
    name = a.name or f"ours_{a.model}_s{a.seed}"
    data = str(Path(a.data).resolve())
    project = str(Path(a.project).resolve())
    out = Path(a.out)
    log_path = out.with_suffix(".log")
    for o in a.opt:
        if "=" not in o:
            raise SystemExit(f"--opt takes key=value, got '{o}'")
    # --init: the weights file is the model (its family and size come from it; pretrained=true,
    # our default, keeps its weights).
    model = str(Path(a.init).resolve()) if a.init else a.model
    cmd = [binary, "train", f"model={model}", f"data={data}", f"epochs={a.epochs}", f"batch={a.batch}",
           f"imgsz={a.imgsz}", f"workers={a.workers}", f"seed={a.seed}", f"device={a.device}",
           f"project={project}", f"name={name}", "exist_ok=true", f"eval_interval={a.eval_interval}",
           *a.opt, "--json"]
    record = {
        **common.run_record("ours", a, data, a.opt),
        "command": cmd,
        "log": str(log_path),
        "wall_s": None,
        "run_dir": None,
        "source": None,
        "ok": False,
        "per_epoch": [],
    }
    try:
        ver = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
        record["versions"] = {"libreyolo_cpp": (ver.stdout or ver.stderr).strip()[:200]}
    except Exception as e:  # the version is informative only
        record["versions"] = {"libreyolo_cpp": f"unknown ({type(e).__name__}: {e})"}

    print("[run_ours] " + " ".join(cmd), file=sys.stderr, flush=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rc = None
    stdout = ""
    stopped = []
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        except OSError as e:
            proc = None
            record["error"] = f"cannot run {binary}: {e}"
        if proc is not None:
            # SIGTERM (gpu_run.sh's deadline, `timeout`): pass it on; the CLI stops after the
            # current step (a second one ends it at once) and the epochs done are in results.csv.
            def on_term(signum, _frame):
                stopped.append(signum)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_term)
            try:
                stdout, _ = proc.communicate(timeout=a.timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    stdout, _ = proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    stdout, _ = proc.communicate()
                stopped.append("timeout")
            rc = proc.returncode
        record["wall_s"] = time.perf_counter() - t0
    record["returncode"] = rc
    stdout = stdout or ""

    answer = None
    for line in reversed(stdout.strip().splitlines()):
        try:
            answer = json.loads(line)
            break
        except ValueError:
            continue
    if answer is None and stdout.strip().startswith("{"):
        try:
            answer = json.loads(stdout)
        except ValueError:
            pass
    run_dir = Path(answer["save_dir"]) if isinstance(answer, dict) and answer.get("save_dir") else Path(project) / name
    record["run_dir"] = str(run_dir)
    if isinstance(answer, dict):
        record["cli_answer"] = answer
    rows, source = common.read_run_dir(run_dir, prefer=("results.csv",))
    record["per_epoch"] = rows
    record["source"] = source
    record["ok"] = rc == 0 and not stopped and len(rows) > 0 and rows[-1]["epoch"] >= a.epochs
    if stopped and "error" not in record:
        record["error"] = f"stopped ({stopped[0]}) after epoch {rows[-1]['epoch'] if rows else 0} of {a.epochs}"
    elif rc not in (0, None) and "error" not in record:
        record["error"] = f"exit status {rc}; see {log_path}"
    elif not rows and "error" not in record:
        record["error"] = f"no results.csv rows in {run_dir}"
    elif not record["ok"] and "error" not in record:
        record["error"] = f"stopped after epoch {rows[-1]['epoch']} of {a.epochs}"
    common.write_json(out, record)
    last = rows[-1] if rows else {}
    print(f"[run_ours] {a.model} seed {a.seed}: rc {rc}, {len(rows)} epochs, final "
          f"{common.score_text(last)}, wall {record['wall_s']:.1f} s -> {out}", file=sys.stderr)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
