#!/usr/bin/python3
"""Writes tests/onnx/core_cases.txt: every ONNX backend-suite case whose ops all belong to the
compiler-core op list (issue 3), less those with string tensors: node/ from the ONNX 1.23 node
suite (../shared/onnx-node-suite beside the repository, the one `make test` runs), the other
folders from ONNX 1.12's. Run with Debian's python3 (python3-onnx). The list is committed; rerun
when the op list changes."""
import os
import sys

import onnx

DATA = "/usr/share/libonnx-testdata/data"
NODE_SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared",
                          "onnx-node-suite")
CORE_OPS = set("""
Add Sub Mul Div Pow Neg Abs Exp Log Sqrt Reciprocal Tanh Sigmoid Relu LeakyRelu Elu Selu
HardSigmoid Softplus Erf Clip Min Max Sum Mean Where Equal Less Greater LessOrEqual
GreaterOrEqual Not And Or Cast Identity Constant Shape Size Reshape Flatten Transpose Squeeze
Unsqueeze Slice Expand Concat Split Gather ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd
ArgMax ArgMin Softmax LogSoftmax LayerNormalization BatchNormalization MatMul Gemm Conv MaxPool
AveragePool GlobalAveragePool
""".split())

# Cases listed but not run, each with its reason (written as comments into the list).
NOT_RUN = {
    "node/test_averagepool_2d_ceil_last_window_starts_on_pad":
        "its expected outputs are written with 4 significant digits (0.1511 for 0.151056), "
        "outside the core tolerance; it runs at the suite's rtol 1e-3",
}


def graph_ops(graph, ops):
    for node in graph.node:
        ops.add((node.domain or "", node.op_type))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                graph_ops(attr.g, ops)
            for g in attr.graphs:
                graph_ops(g, ops)


def has_string(graph):
    def is_string(vi):
        t = vi.type
        return t.HasField("tensor_type") and t.tensor_type.elem_type == onnx.TensorProto.STRING
    values = list(graph.input) + list(graph.output) + list(graph.value_info)
    if any(is_string(v) for v in values):
        return True
    if any(init.data_type == onnx.TensorProto.STRING for init in graph.initializer):
        return True
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == onnx.TensorProto.STRING:
                return True
            if attr.type == onnx.AttributeProto.STRINGS and node.op_type == "Cast":
                return True
        if node.op_type == "Cast":
            for attr in node.attribute:
                if attr.name == "to" and attr.i == onnx.TensorProto.STRING:
                    return True
    return False


def main():
    cases = []
    for suite in ("node", "pytorch-converted", "pytorch-operator", "simple"):
        root = os.path.join(NODE_SUITE if suite == "node" else DATA, suite)
        for case in sorted(os.listdir(root)):
            path = os.path.join(root, case, "model.onnx")
            if not os.path.exists(path):
                continue
            model = onnx.load(path)
            ops = set()
            graph_ops(model.graph, ops)
            if not ops or any(d not in ("", "ai.onnx") or op not in CORE_OPS for d, op in ops):
                continue
            if has_string(model.graph):
                continue
            cases.append(f"{suite}/{case}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "core_cases.txt")
    with open(out, "w") as f:
        f.write("# Suite cases whose ops all belong to the compiler core (tests/onnx/list_core_cases.py)\n")
        for c in cases:
            if c in NOT_RUN:
                f.write(f"# {c}: {NOT_RUN[c]}\n")
            else:
                f.write(c + "\n")
    print(f"{len(cases)} cases -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
