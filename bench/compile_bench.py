#!/usr/bin/python3
"""Compile time of long elementwise chains and of a transformer encoder stack (make bench-compile).

Usage: /usr/bin/python3 compile_bench.py KILN SCRATCH_DIR [--quick]
Run with Debian's python3 (python3-onnx, python3-numpy).

Each model is compiled cold: `kiln run MODEL` with a fresh, empty code cache and autotune cache,
so every kernel goes through the C++ compiler. Printed per model:
  compile  the compile time `kiln run` reports: the wall time of driver::compile (lowering,
           scheduling, code generation and the C++ compiler, whose translation units compile in
           parallel on the machine's cores; the ONNX import is excluded)
  wall     the whole `kiln run` process: import, compile, load and one run
  cpu      user + system CPU time of that process and its children (the C++ compiler): what
           the machine spent, steadier than wall times on a loaded machine
  kernels  the generated kernels and library calls
  per 1k   compile time per 1,000 nodes (chains) or per layer (the stack): about constant when
           compile time grows linearly
Models:
  chains   N Relu nodes on one float32 tensor (tests/chains/make_chain.py), N = 1,000, 4,000 and
           16,000, at shapes [2, 3] (below the vector width), [1, 64] and [64, 1024]; the
           stretches of a Relu chain generate identical kernels, which Kiln compiles once, so
           the same lengths are also timed as "distinct" chains (Add of a different scalar per
           node, alternating with Relu) whose kernels all differ
  encoder  a BERT-shaped encoder stack (bench/ort/make_models.py's layer: QKV projections,
           4 heads, Softmax attention, LayerNormalization, GELU FFN) with hidden 256, FFN 1024,
           sequence 128, at 1, 4 and 16 layers
A run over 600 s is stopped and printed as such. --quick runs the 1k and 4k chains at [2, 3] only
and the 1- and 4-layer stacks. Prints; asserts nothing.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "chains"))
sys.path.insert(0, os.path.join(HERE, "ort"))

import make_chain  # noqa: E402
import make_models  # noqa: E402
import onnx  # noqa: E402

TIMEOUT_S = 600
COMPILED = re.compile(r"^compiled .*: (\d+) kernels, (\d+) library calls, (built|from the code "
                      r"cache) \(([0-9.]+) s\)", re.M)


def compile_cold(kiln, model, scratch):
    """(compile s, wall s, cpu s, kernels, library calls) of a cold `kiln run`, or None on a
    timeout."""
    cache = os.path.join(scratch, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, KILN_AUTOTUNE_CACHE=os.path.join(cache, "autotune.json"))
    start = time.monotonic()
    before = os.times()
    try:
        proc = subprocess.run([kiln, "run", model, "--cache-dir", cache, "--output-dir",
                               os.path.join(scratch, "out")], env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    wall = time.monotonic() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system -
                                                           before.children_system)
    match = COMPILED.search(proc.stdout)
    if proc.returncode != 0 or match is None:
        sys.exit(f"kiln run {model} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return float(match.group(4)), wall, cpu, int(match.group(1)), int(match.group(2))


def report(label, result, units):
    if result is None:
        print(f"{label:<34} {'> ' + str(TIMEOUT_S) + ' s (stopped)':>10}", flush=True)
        return
    compile_s, wall, cpu, kernels, calls = result
    print(f"{label:<34} {compile_s:>8.2f} s {wall:>8.2f} s {cpu:>8.2f} s {kernels:>7} + {calls:<4} "
          f"{compile_s / units:>8.3f} s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kiln")
    parser.add_argument("scratch")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.scratch, exist_ok=True)
    models = os.path.join(args.scratch, "models")
    os.makedirs(models, exist_ok=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown CPU")
    print(f"cold compiles on {cpu}, {os.cpu_count()} cores")
    print(f"{'model':<34} {'compile':>10} {'wall':>10} {'cpu':>10} {'kernels + calls':>14} "
          f"{'compile per 1k nodes / layer':>10}")

    shapes = [[2, 3]] if args.quick else [[2, 3], [1, 64], [64, 1024]]
    lengths = [1000, 4000] if args.quick else [1000, 4000, 16000]
    chains = [("relu", shape) for shape in shapes]
    chains += [("distinct", shape) for shape in dict.fromkeys(map(tuple, [shapes[0], shapes[-1]]))]
    for ops, shape in chains:
        for nodes in lengths:
            path = os.path.join(models, f"{ops}{nodes}_{'x'.join(map(str, shape))}.onnx")
            model = make_chain.chain_model(nodes, list(shape), ops)
            make_chain.save_atomic(path, lambda p: onnx.save(model, p))
            label = f"{ops} chain {nodes:>5} x {list(shape)}"
            report(label, compile_cold(args.kiln, path, args.scratch), nodes / 1000)

    for layers in ([1, 4] if args.quick else [1, 4, 16]):
        path = os.path.join(models, f"encoder{layers}.onnx")
        model = make_models.bert(layers, seq=128, hidden=256, heads=4, ffn=1024)
        make_models.save(model, path)
        label = f"encoder stack {layers:>2} layer(s)"
        report(label, compile_cold(args.kiln, path, args.scratch), layers)


if __name__ == "__main__":
    main()
