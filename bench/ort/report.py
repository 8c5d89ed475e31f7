#!/usr/bin/python3
"""The Python side of bench/ort/run.sh: tags and prints result lines, compares outputs, prints the
summary.

  report.py tag ENGINE MODEL PHASE     reads one JSON line on stdin, writes it with the fields
                                       engine, name and phase added
  report.py row                        reads a tagged JSON line on stdin, prints it as one row
  report.py compare MODEL OUT_DIR      compares OUT_DIR/kiln/*.npy with OUT_DIR/ort/*.npy
  report.py summary RESULTS MODELS...  per model: both p50s (the median over the rounds of each
                                       round's p50), ORT / Kiln, both mins, Kiln's cold and warm
                                       compile times; then Kiln / ORT of those medians and their
                                       geometric mean, and the same from each round's own pair
                                       (Kiln's p50 over ORT's in that round, median over rounds)
"""
import json
import math
import os
import statistics
import sys

import numpy as np


def tag(engine, model, phase):
    j = json.loads(sys.stdin.read())
    j.update(engine=engine, name=model, phase=phase)
    print(json.dumps(j))


def row():
    j = json.loads(sys.stdin.read())
    print(f"   {j['name']:8} {j['engine']:4}  p50 {j['p50_ms']:9.2f} ms  min {j['min_ms']:9.2f} ms"
          f"  p90 {j['p90_ms']:9.2f} ms")


def compare(model, out):
    for file in sorted(os.listdir(os.path.join(out, "ort"))):
        ort = np.load(os.path.join(out, "ort", file)).astype(np.float64)
        kiln_file = os.path.join(out, "kiln", file)
        if not os.path.exists(kiln_file):
            print(f"   {model} {file}: Kiln wrote no such output")
            continue
        kiln = np.load(kiln_file).astype(np.float64)
        if kiln.shape != ort.shape:
            print(f"   {model} {file}: shapes differ, Kiln {kiln.shape}, ORT {ort.shape}")
            continue
        scale = max(np.abs(ort).max(), 1e-30)
        diff = np.abs(kiln - ort).max()
        same = np.allclose(kiln, ort, rtol=1e-3, atol=1e-4 * scale)
        print(f"   {model} {file[:-4]}{list(ort.shape)}: max |Kiln - ORT| = {diff:.3g}"
              f" ({diff / scale:.2g} of max |ORT| = {scale:.3g}):"
              f" {'agree' if same else 'DIFFER'} (rtol 1e-3, atol 1e-4 x max |ORT|)")


def summary(results, models):
    rows = [json.loads(line) for line in open(results)]

    def pick(model, engine, phase=None):
        return [r for r in rows if r["name"] == model and r["engine"] == engine and
                (r["phase"] == phase if phase else r["phase"].startswith("round"))]

    print(f"   {'model':12}  {'Kiln p50':>10}  {'ORT p50':>10}  {'ORT/Kiln':>8}  {'Kiln min':>10}"
          f"  {'ORT min':>10}  {'cold compile':>12}  {'warm compile':>12}")
    ratios, paired = [], []
    for model in models:
        kiln, ort = pick(model, "kiln"), pick(model, "ort")
        kiln_p50 = statistics.median(r["p50_ms"] for r in kiln)
        ort_p50 = statistics.median(r["p50_ms"] for r in ort)
        ratios.append(kiln_p50 / ort_p50)
        # The engines alternate within a round, so a round's two p50s saw about the same machine;
        # where a slow phase of the machine spans a round, its ratio stays fair while the medians
        # above may each take a different round's.
        ort_by_round = {r["phase"]: r["p50_ms"] for r in ort}
        paired.append(statistics.median(r["p50_ms"] / ort_by_round[r["phase"]] for r in kiln))
        cold, warm = pick(model, "kiln", "cold")[0], pick(model, "kiln", "warm")[0]
        note = "" if not cold["cache_hit"] and warm["cache_hit"] else "  (unexpected cache hits)"
        print(f"   {model:12}  {kiln_p50:7.2f} ms  {ort_p50:7.2f} ms  {ort_p50 / kiln_p50:8.2f}"
              f"  {min(r['min_ms'] for r in kiln):7.2f} ms  {min(r['min_ms'] for r in ort):7.2f} ms"
              f"  {cold['compile_s']:10.2f} s  {warm['compile_s']:10.2f} s{note}")
    print("   ORT/Kiln above 1: Kiln is faster. Compile times: driver::compile (import excluded)")
    # Issue 17's goal is over its five model kinds; BERT-base and ResNeXt-50 (grouped
    # convolutions) are timed beside them.
    aside = [m for m in models if m in ("bert", "resnext50")]

    def line(title, values):
        goal = [r for m, r in zip(models, values) if m not in aside] or values
        geomean = math.exp(sum(math.log(r) for r in goal) / len(goal))
        print(f"   {title}: " + ", ".join(f"{m} {r:.2f}" for m, r in zip(models, values)) +
              f"; geomean {geomean:.2f}" +
              (f" ({', '.join(aside)} aside)" if len(goal) < len(values) else "") +
              " (goal <= 0.85)")

    line("Kiln p50 / ORT p50 per model", ratios)
    line("the same per round (median of the rounds' ratios)", paired)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "tag":
        tag(*args)
    elif command == "row":
        row()
    elif command == "compare":
        compare(*args)
    elif command == "summary":
        summary(args[0], args[1:])
    else:
        raise SystemExit(__doc__)
