#!/usr/bin/python3
"""Writes tests/onnx/sanitize_cases.txt, the suite sample that `make test-sanitize` runs under
AddressSanitizer and UndefinedBehaviorSanitizer (scripts/test_sanitize.sh): every op the suite's
passing cases use, each by its smallest case (fewest nodes, then the smallest model file; node/
cases first), then evenly spaced further cases up to 220 so that common ops are seen with several
dtypes and attributes. node/ is the ONNX 1.23 node suite (../shared/onnx-node-suite beside the
repository, as `make test` runs it), the other folders ONNX 1.12's. Cases in
tests/onnx/exclusions.txt are left out. Deterministic; run with Debian's python3 (python3-onnx).
The list is committed; rerun when the suite or the exclusions change."""
import os
import sys

import onnx

DATA = "/usr/share/libonnx-testdata/data"
HERE = os.path.dirname(os.path.abspath(__file__))
NODE_SUITE = os.path.join(HERE, "..", "..", "..", "shared", "onnx-node-suite")
TARGET = 220


def graph_ops(graph, ops):
    for node in graph.node:
        ops.add(f"{node.domain}:{node.op_type}" if node.domain else node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                graph_ops(attr.g, ops)
            for g in attr.graphs:
                graph_ops(g, ops)


def main():
    excluded = set()
    with open(os.path.join(HERE, "exclusions.txt")) as f:
        for line in f:
            name = line.split("#")[0].strip()
            if name:
                excluded.add(name)
    cases = {}
    for suite in ("node", "pytorch-converted", "pytorch-operator", "simple"):
        root = NODE_SUITE if suite == "node" else DATA
        for entry in sorted(os.listdir(os.path.join(root, suite))):
            name = f"{suite}/{entry}"
            path = os.path.join(root, suite, entry, "model.onnx")
            if name in excluded or not os.path.exists(path):
                continue
            model = onnx.load(path)
            ops = set()
            graph_ops(model.graph, ops)
            cases[name] = (ops, (suite != "node", len(model.graph.node), os.path.getsize(path), name))
    chosen, covered = [], set()
    every_op = sorted(set().union(*(ops for ops, _ in cases.values())))
    for op in every_op:
        if op in covered:
            continue
        best = min((c for c in cases if op in cases[c][0]), key=lambda c: cases[c][1])
        chosen.append(best)
        covered |= cases[best][0]
    rest = [c for c in sorted(cases) if c not in chosen]
    extra = TARGET - len(chosen)
    if extra > 0:
        step = len(rest) / extra
        chosen += [rest[int(i * step)] for i in range(extra)]
    with open(os.path.join(HERE, "sanitize_cases.txt"), "w") as f:
        f.write(f"# The suite sample of make test-sanitize ({len(chosen)} cases covering all "
                f"{len(every_op)} ops of the passing cases; tests/onnx/list_sanitize_cases.py)\n")
        for c in sorted(chosen):
            f.write(c + "\n")
    print(f"{len(chosen)} cases, {len(every_op)} ops", file=sys.stderr)


if __name__ == "__main__":
    main()
