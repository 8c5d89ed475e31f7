#!/usr/bin/env python3
"""Kiln's and ONNX Runtime's time per layer of one model, side by side.

Usage: layers.py [--fastest] ORT_PROFILE.json KILN_PROFILE.json [KILN_PROFILE.json ...]

ORT_PROFILE is a trace of ort_bench.js --profile (every run; the first five are dropped as
warm-up), each KILN_PROFILE one run of `kiln bench MODEL.so --profile FILE`. Prints, in Kiln's
order, each Kiln kernel or library call (the median over the Kiln profiles), the ONNX Runtime
node it matches (the median over ORT's runs) and their ratio, then ORT's nodes that matched
none, and both totals. A Kiln call matches the ORT node named after one of the ONNX nodes the
call covers, its own op's first (ORT names a fused node after its last node, with "_nchwc" for
its blocked layout, or after its first, "matmul15/MatMulAddFusion"). Both profilers add time to each node, so the totals exceed the bench's p50s; the ratios
of large layers are what to read. Noisy machines: compare profiles taken one after the other,
and read --fastest, which takes each layer's fastest run on both sides instead of the median (on
a host whose speed moves by phases, a median of 7 runs can put a layer at 1.5x its usual time).
"""
import collections
import json
import re
import statistics
import sys


def kiln_layers(paths, stat):
    runs = []
    for path in paths:
        with open(path) as f:
            trace = json.load(f)
        events = trace['traceEvents'] if isinstance(trace, dict) else trace
        runs.append([(e['name'], e['dur'] / 1000) for e in events if e.get('ph') == 'X'])
    if any(len(r) != len(runs[0]) for r in runs):
        sys.exit('layers.py: the Kiln profiles are of different libraries')
    return [(runs[0][k][0], stat([r[k][1] for r in runs])) for k in range(len(runs[0]))]


def ort_layers(path, stat, warmup=5):
    with open(path) as f:
        events = json.load(f)
    times = collections.OrderedDict()
    for e in events:
        if e.get('cat') == 'Node' and e['name'].endswith('_kernel_time'):
            times.setdefault(e['name'][:-len('_kernel_time')], []).append(e['dur'] / 1000)
    return collections.OrderedDict(
        (name, stat(t[warmup:] if len(t) > warmup else t)) for name, t in times.items())


def main():
    args = sys.argv[1:]
    stat = statistics.median
    if args and args[0] == '--fastest':
        stat, args = min, args[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    ort = ort_layers(args[0], stat)
    kiln = kiln_layers(args[1:], stat)
    # ORT names some fusions after their first node: "matmul15/MatMulAddFusion".
    by_first_node = collections.defaultdict(tuple)
    for name in ort:
        if '/' in name:
            by_first_node[name.split('/', 1)[0]] += (name,)
    used = set()
    kiln_total = ort_total = 0.0
    print('%9s %9s %6s  %s' % ('Kiln ms', 'ORT ms', 'ratio', 'Kiln kernel or call'))
    for name, ms in kiln:
        # The call's own op first ("conv (...)": the Conv node), then the fused ones.
        kind = name.split(' ', 1)[0].lower()
        nodes = re.findall(r'([\w.:/-]+) \((\w+)\)', name)
        nodes.sort(key=lambda node: node[1].lower() not in (kind, 'matmul' if kind == 'gemm' else kind))
        match = None
        for node, _ in nodes:
            for candidate in (node, node + '_nchwc') + by_first_node.get(node, ()):
                if match is None and candidate in ort and candidate not in used:
                    match = candidate
        ort_ms = ort.get(match, 0.0)
        if match:
            used.add(match)
        kiln_total += ms
        ort_total += ort_ms
        ratio = '%.2f' % (ms / ort_ms) if ort_ms > 0 else ''
        print('%9.3f %9s %6s  %s' % (ms, '%.3f' % ort_ms if match else '', ratio, name[:90]))
    for node, ms in ort.items():
        if node not in used:
            ort_total += ms
            print('%9s %9.3f %6s  (ORT only) %s' % ('', ms, '', node))
    print('total: Kiln %.3f ms, ORT %.3f ms, Kiln / ORT %.2f' %
          (kiln_total, ort_total, kiln_total / ort_total if ort_total else float('nan')))


if __name__ == '__main__':
    main()
