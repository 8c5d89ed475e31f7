"""Times one ONNX model with ONNX Runtime's Python API (CPU execution provider), printing the
JSON object bench/ort/ort_bench.js prints (model, threads, iters, warmup, min_ms, p50_ms, p90_ms,
p99_ms, mean_ms; nearest-rank percentiles, as kiln bench): bench/load/run.sh's ONNX Runtime on a
host with onnxruntime for Python but no Node.js.

Usage: ort_bench.py MODEL.onnx --threads N --iters N --warmup N [--wait-ms MS] --input NAME=FILE.npy
(--wait-ms: an untimed sleep before each run, as `kiln bench --wait-ms`)
"""
import argparse
import json
import math
import time

import numpy as np
import onnxruntime as ort


def percentile(sorted_ms, p):
    return sorted_ms[max(0, math.ceil(p / 100 * len(sorted_ms)) - 1)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--wait-ms", type=float, default=0.0)
    parser.add_argument("--input", action="append", default=[])
    args = parser.parse_args()
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    feeds = {}
    for item in args.input:
        name, path = item.split("=", 1)
        feeds[name] = np.load(path)
    for _ in range(args.warmup):
        time.sleep(args.wait_ms / 1e3)
        session.run(None, feeds)
    ms = []
    for _ in range(args.iters):
        time.sleep(args.wait_ms / 1e3)
        start = time.perf_counter()
        session.run(None, feeds)
        ms.append((time.perf_counter() - start) * 1e3)
    ms.sort()
    print(json.dumps({"model": args.model, "threads": args.threads, "iters": args.iters,
                      "warmup": args.warmup, "wait_ms": args.wait_ms,
                      "min_ms": ms[0], "p50_ms": percentile(ms, 50),
                      "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
                      "mean_ms": sum(ms) / len(ms)}))


if __name__ == "__main__":
    main()
