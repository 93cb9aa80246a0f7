#!/usr/bin/env python3
"""Merge the per-run JSONs of both implementations (run_ours.py, run_reference.py) over several
seeds into one JSON, print a short table, check the acceptance criteria, and optionally plot.

    python3 bench/convergence/compare.py RUN.json ... | DIR ... --out merged.json [--plot curves.png]
        [--no-aug-epochs 15] [--from-epoch 5] [--tol-curve 0.03] [--tol-final 0.005] [--max-jump 1.3]

Runs are grouped by (set, model); in each group, per epoch: each implementation's per-seed and
seed-mean score and train loss. The score is mAP50-95 for detection and top-1 accuracy for a
classification group (every row with a top-1 and no mAP; the group's "metric" says which; the
merged JSON keeps the key names map50_95* for both). The checks, for each group that has both:

  curve      from epoch --from-epoch on, ours' seed-mean mAP50-95 >= the reference's - 0.03
             at every epoch both validated;
  final      ours' seed-mean mAP50-95 at the last epoch >= the reference's - 0.005;
  no_aug     ours' train loss at the first no-augmentation epoch (epochs - no_aug + 1, 1-based)
             over the epoch before is <= 1.3, for every seed (skipped when the run has no
             switch: epochs <= no_aug).

The time ratio is the reference's seed-mean wall time over ours. Runs made concurrently on one
GPU (gpu_run.sh PARALLEL>1, recorded as "concurrent" in the run JSONs) share the GPU and the CPU
cores, so their times are not comparable; the merged JSON and the table say so.

Exit status: 0 when every check passes, 1 when one fails, 2 when there is nothing to compare.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

IMPLS = ("ours", "ref")


def load_runs(paths: list[str]) -> tuple[list[dict], list[dict]]:
    files: list[Path] = []
    for p in paths:
        q = Path(p)
        if q.is_dir():
            files += sorted(x for x in q.rglob("*.json") if x.name != "merged.json")
        else:
            files.append(q)
    runs, bad = [], []
    for f in files:
        try:
            r = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            bad.append({"file": str(f), "error": f"unreadable: {e}"})
            continue
        if not isinstance(r, dict) or r.get("impl") not in IMPLS or "per_epoch" not in r:
            continue  # not a run JSON (e.g. a merged file)
        r["_file"] = str(f)
        if not r.get("ok") or not r.get("per_epoch"):
            bad.append({"file": str(f), "impl": r.get("impl"), "set": r.get("set"), "model": r.get("model"),
                        "seed": r.get("seed"), "error": r.get("error", "no per-epoch rows")})
            if not r.get("per_epoch"):
                continue
        runs.append(r)
    return runs, bad


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def fmt(x, nd=4):
    return "-" if x is None else f"{x:.{nd}f}"


def score_key(runs: list[dict]) -> str:
    """'top1' when every validated row of the group is a classification row, else 'map50_95'."""
    rows = [row for r in runs for row in r["per_epoch"] if row.get("validated")]
    classify = bool(rows) and all(row.get("map50_95") is None and row.get("top1") is not None for row in rows)
    return "top1" if classify else "map50_95"


def merge_group(runs: list[dict], a) -> dict:
    key = score_key(runs)
    by_impl = {i: sorted((r for r in runs if r["impl"] == i), key=lambda r: r["seed"]) for i in IMPLS}
    epochs = sorted({row["epoch"] for r in runs for row in r["per_epoch"]})
    n_epochs = max([r.get("epochs") or 0 for r in runs] + [max(epochs) if epochs else 0])
    per_epoch = []
    for e in epochs:
        entry = {"epoch": e}
        for impl in IMPLS:
            maps, maps50, losses = {}, {}, {}
            for r in by_impl[impl]:
                row = next((x for x in r["per_epoch"] if x["epoch"] == e), None)
                if row is None:
                    continue
                s = str(r["seed"])
                maps[s] = row.get(key)
                maps50[s] = row.get("map50")
                losses[s] = row.get("loss")
            # A seed mean only where every seed reached the epoch: the mean of a subset is
            # another quantity (a run stopped early would otherwise shift the curve).
            whole = len(maps) == len(by_impl[impl])
            entry[impl] = {
                "map50_95": maps,
                "map50_95_mean": mean(maps.values()) if whole else None,
                "map50_mean": mean(maps50.values()) if whole else None,
                "loss": losses,
                "loss_mean": mean(losses.values()) if whole else None,
            }
        o, r = entry["ours"]["map50_95_mean"], entry["ref"]["map50_95_mean"]
        entry["diff_ours_minus_ref"] = None if o is None or r is None else o - r
        per_epoch.append(entry)

    # Whole-run times of the runs that finished (a stopped run's wall time is not a run's).
    walls = {impl: {str(r["seed"]): r.get("wall_s") for r in by_impl[impl] if r.get("ok", True)} for impl in IMPLS}
    wall_mean = {impl: mean(walls[impl].values()) for impl in IMPLS}
    concurrent = max([int(r.get("concurrent") or 1) for r in runs] + [1])
    g = {
        "set": runs[0].get("set"),
        "model": runs[0].get("model"),
        "metric": "top-1 accuracy" if key == "top1" else "mAP50-95",
        "epochs": n_epochs,
        "seeds": {impl: [r["seed"] for r in by_impl[impl]] for impl in IMPLS},
        "settings": {k: runs[0].get(k) for k in ("batch", "imgsz", "workers", "device")},
        "per_epoch": per_epoch,
        "wall_s": {impl: walls[impl] for impl in IMPLS},
        "wall_s_mean": wall_mean,
        "time_ratio_ref_over_ours": (wall_mean["ref"] / wall_mean["ours"]
                                     if wall_mean["ref"] and wall_mean["ours"] else None),
        "concurrent_runs": concurrent,
        "times_comparable": concurrent <= 1,
    }
    g["checks"] = checks(g, by_impl, a) if by_impl["ours"] and by_impl["ref"] else {}
    if by_impl["ours"] and not by_impl["ref"]:
        g["checks"] = {"no_aug": no_aug_check(g, by_impl, a)}
    g["pass"] = all(c.get("pass") is not False for c in g["checks"].values()) if g["checks"] else None
    return g


def checks(g: dict, by_impl: dict, a) -> dict:
    out = {}
    gaps = [(p["epoch"], p["diff_ours_minus_ref"]) for p in g["per_epoch"]
            if p["epoch"] >= a.from_epoch and p["diff_ours_minus_ref"] is not None]
    if gaps:
        worst = min(gaps, key=lambda t: t[1])
        out["curve"] = {"rule": f"from epoch {a.from_epoch}: mean(ours) >= mean(ref) - {a.tol_curve}",
                        "epochs_checked": len(gaps), "worst_epoch": worst[0], "worst_diff": worst[1],
                        "failing_epochs": [e for e, d in gaps if d < -a.tol_curve],
                        "pass": worst[1] >= -a.tol_curve}
    else:
        out["curve"] = {"rule": f"from epoch {a.from_epoch}", "pass": None, "note": "no epoch validated by both"}
    last = next((p for p in reversed(g["per_epoch"]) if p["diff_ours_minus_ref"] is not None), None)
    if last is not None and last["epoch"] == g["epochs"]:
        out["final"] = {"rule": f"final mean(ours) >= mean(ref) - {a.tol_final}", "epoch": last["epoch"],
                        "ours": last["ours"]["map50_95_mean"], "ref": last["ref"]["map50_95_mean"],
                        "diff": last["diff_ours_minus_ref"], "pass": last["diff_ours_minus_ref"] >= -a.tol_final}
    else:
        out["final"] = {"rule": f"final mean(ours) >= mean(ref) - {a.tol_final}", "pass": False,
                        "note": "the last epoch was not validated by both (a run ended early or failed)"}
    out["no_aug"] = no_aug_check(g, by_impl, a)
    return out


def no_aug_check(g: dict, by_impl: dict, a) -> dict:
    first = g["epochs"] - a.no_aug_epochs + 1
    rule = f"ours' loss at epoch {first} / epoch {first - 1} <= {a.max_jump}"
    if a.no_aug_epochs <= 0 or first < 2:
        return {"rule": "no-aug switch", "pass": None, "note": "no switch inside the run"}
    ratios = {}
    for r in by_impl["ours"]:
        rows = {x["epoch"]: x for x in r["per_epoch"]}
        before, at = rows.get(first - 1, {}).get("loss"), rows.get(first, {}).get("loss")
        ratios[str(r["seed"])] = at / before if at is not None and before else None
    known = [x for x in ratios.values() if x is not None]
    res = {"rule": rule, "first_no_aug_epoch": first, "ratio_per_seed": ratios,
           "ratio_max": max(known) if known else None}
    lb = next((p["ours"]["loss_mean"] for p in g["per_epoch"] if p["epoch"] == first - 1), None)
    la = next((p["ours"]["loss_mean"] for p in g["per_epoch"] if p["epoch"] == first), None)
    res["ratio_of_means"] = la / lb if la is not None and lb else None
    if len(known) < len(ratios) or not known:
        res["pass"] = False
        res["note"] = "a seed lacks the loss of one of the two epochs"
    else:
        res["pass"] = max(known) <= a.max_jump
    # The reference's ratio, for context (not a criterion).
    rr = []
    for r in by_impl.get("ref", []):
        rows = {x["epoch"]: x for x in r["per_epoch"]}
        before, at = rows.get(first - 1, {}).get("loss"), rows.get(first, {}).get("loss")
        if at is not None and before:
            rr.append(at / before)
    res["ref_ratio_max"] = max(rr) if rr else None
    return res


def print_table(g: dict, out=sys.stdout) -> None:
    p = lambda *s: print(*s, file=out)  # noqa: E731
    seeds = g["seeds"]
    p(f"\n== {g['set']} / {g['model']} ({g['metric']}): {g['epochs']} epochs, seeds ours {seeds['ours']} ref {seeds['ref']}, "
      f"{g['settings']}")
    p(f"{'epoch':>5} {'ours':>8} {'ref':>8} {'diff':>8} {'loss_o':>8} {'loss_r':>8}")
    for e in g["per_epoch"]:
        p(f"{e['epoch']:>5} {fmt(e['ours']['map50_95_mean']):>8} {fmt(e['ref']['map50_95_mean']):>8} "
          f"{fmt(e['diff_ours_minus_ref']):>8} {fmt(e['ours']['loss_mean'], 3):>8} {fmt(e['ref']['loss_mean'], 3):>8}")
    w = g["wall_s_mean"]
    ratio = g["time_ratio_ref_over_ours"]
    p(f"wall s (seed mean): ours {fmt(w['ours'], 1)}, ref {fmt(w['ref'], 1)}; ref/ours {fmt(ratio, 2)}"
      + ("" if g["times_comparable"] else f"  [{g['concurrent_runs']} runs shared the GPU: times not comparable]"))
    for name, c in g["checks"].items():
        status = {True: "PASS", False: "FAIL", None: "n/a"}[c.get("pass")]
        detail = ""
        if name == "curve" and "worst_diff" in c:
            detail = f"worst diff {c['worst_diff']:+.4f} at epoch {c['worst_epoch']}"
        elif name == "final" and "diff" in c:
            detail = f"ours {c['ours']:.4f} ref {c['ref']:.4f} diff {c['diff']:+.4f}"
        elif name == "no_aug" and c.get("ratio_max") is not None:
            detail = (f"max ratio {c['ratio_max']:.3f} at epoch {c['first_no_aug_epoch']}"
                      + (f" (ref {c['ref_ratio_max']:.3f})" if c.get("ref_ratio_max") is not None else ""))
        p(f"  {name:<7} {status:<5} {c.get('rule', '')}  {detail}{'  ' + c['note'] if 'note' in c else ''}")


def plot(groups: list[dict], path: str, no_aug_epochs: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n = len(groups)
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.4 * rows), squeeze=False)
    colours = {"ours": "tab:blue", "ref": "tab:orange"}
    labels = {"ours": "ours (C++)", "ref": "reference (LibreYOLO 1.6.0)"}
    for ax, g in zip(axes.flat, groups):
        for impl in IMPLS:
            for s in g["seeds"][impl]:
                pts = [(p["epoch"], p[impl]["map50_95"].get(str(s))) for p in g["per_epoch"]]
                pts = [(e, v) for e, v in pts if v is not None]
                if pts:
                    ax.plot(*zip(*pts), color=colours[impl], lw=0.8, alpha=0.5)
            pts = [(p["epoch"], p[impl]["map50_95_mean"]) for p in g["per_epoch"]]
            pts = [(e, v) for e, v in pts if v is not None]
            if pts:
                k = len(g["seeds"][impl])
                ax.plot(*zip(*pts), color=colours[impl], lw=2.2,
                        label=f"{labels[impl]}, mean of {k} seed{'s' if k != 1 else ''}")
        first = g["epochs"] - no_aug_epochs + 1
        if no_aug_epochs > 0 and first >= 2:
            ax.axvline(first - 0.5, color="grey", ls=":", lw=1)
            ax.text(first - 0.3, 0.97, "no-aug epochs", color="grey", fontsize=8, va="top",
                    transform=ax.get_xaxis_transform())
        ratio = g["time_ratio_ref_over_ours"]
        sub = ""
        if ratio is not None:
            sub = f"\ntime ref/ours {ratio:.2f}" + ("" if g["times_comparable"] else " (concurrent runs: not comparable)")
        verdict = {True: "checks pass", False: "a check fails", None: ""}[g.get("pass")]
        ax.set_title(f"{g['set']} / {g['model']} {('- ' + verdict) if verdict else ''}{sub}", fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"{g.get('metric', 'mAP50-95')} (val)")
        ax.set_xlim(1, max(g["epochs"], 2))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Merge and check convergence runs of ours vs the reference.")
    ap.add_argument("inputs", nargs="+", help="run JSON files, or folders searched for *.json")
    ap.add_argument("--out", default=None, help="the merged JSON to write")
    ap.add_argument("--plot", default=None, help="PNG of the per-epoch mAP50-95 curves")
    ap.add_argument("--no-aug-epochs", type=int, default=15)
    ap.add_argument("--from-epoch", type=int, default=5)
    ap.add_argument("--tol-curve", type=float, default=0.03)
    ap.add_argument("--tol-final", type=float, default=0.005)
    ap.add_argument("--max-jump", type=float, default=1.3)
    ap.add_argument("--as-ours", nargs="+", default=[], metavar="RUN",
                    help="run JSONs (or folders of them) to put in the 'ours' column whatever their impl: "
                         "the reference's runs of other seeds against its own, the checks' noise floor")
    a = ap.parse_args(argv)

    runs, bad = load_runs(a.inputs)
    if a.as_ours:
        relabel, _ = load_runs(a.as_ours)
        for r in relabel:
            r["impl"] = "ours"
        runs += relabel
    if not runs:
        print("no run JSONs with per-epoch rows found", file=sys.stderr)
        for b in bad:
            print(f"  {b}", file=sys.stderr)
        if a.out:
            Path(a.out).write_text(json.dumps({"groups": [], "failed_runs": bad, "all_pass": None}, indent=2) + "\n")
        return 2
    grouped = defaultdict(list)
    for r in runs:
        grouped[(str(r.get("set")), str(r.get("model")))].append(r)
    groups = [merge_group(grouped[k], a) for k in sorted(grouped)]
    verdicts = [g["pass"] for g in groups if g["pass"] is not None]
    merged = {
        "criteria": {"from_epoch": a.from_epoch, "tol_curve": a.tol_curve, "tol_final": a.tol_final,
                     "no_aug_epochs": a.no_aug_epochs, "max_loss_jump": a.max_jump},
        "groups": groups,
        "failed_runs": bad,
        "all_pass": (all(verdicts) and not bad) if verdicts else None,
    }
    for g in groups:
        print_table(g)
    if bad:
        print("\nfailed or unreadable runs:")
        for b in bad:
            print(f"  {b}")
    print(f"\nall checks pass: {merged['all_pass']}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(merged, indent=2) + "\n")
    if a.plot:
        plot(groups, a.plot, a.no_aug_epochs)
        print(f"plot: {a.plot}")
    return 0 if merged["all_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
