#!/usr/bin/python3
"""Builds the models of the Kiln-versus-ONNX-Runtime benchmark (bench/ort/run.sh) as ONNX
(opset 17) with seeded random weights, and one seeded input for each.

Usage: /usr/bin/python3 make_models.py OUT_DIR [--bert-layers N]
Run with Debian's python3 (python3-onnx, python3-numpy).

Writes into OUT_DIR:
  resnet18.onnx     a ResNet-18-shaped CNN: a 7x7/2 stem, 3x3/2 MaxPool, basic blocks [2, 2, 2, 2]
                    (two 3x3 convolutions, the first strided between stages, 1x1 projection
                    shortcuts), GlobalAveragePool, Flatten, Gemm; Conv + BatchNormalization +
                    Relu as in resnet50: input float32[1, 3, 224, 224] -> logits [1, 1000].
  resnet18.input.npy  the input: uniform [-1, 1)
  resnet50.onnx     ResNet-50 v1.5 shape: input float32[1, 3, 224, 224] -> logits float32[1, 1000].
                    A 7x7/2 stem, 3x3/2 MaxPool, bottleneck stages of [3, 4, 6, 3] blocks (widths
                    64..512, expansion 4, stride on the 3x3 convolution, 1x1 projection shortcuts),
                    GlobalAveragePool, Flatten, Gemm. Every Conv is followed by a
                    BatchNormalization (as an export without folding writes it); Relu after it
                    and after each residual Add.
  resnet50.input.npy  the input: uniform [-1, 1)
  resnext50.onnx    ResNeXt-50 32x4d: resnet50's stages with 32 groups in each 3x3 convolution
                    and twice its widths (128..1024, 4..32 channels a group), blocks ending at
                    256..2048 channels; input and logits as resnet50.
  resnext50.input.npy  the input: uniform [-1, 1)
  mobilenet_v2.onnx MobileNetV2 (width 1.0): input float32[1, 3, 224, 224] -> logits [1, 1000]. A
                    3x3/2 stem, 17 inverted residual blocks (1x1 expansion by 6 but in the first,
                    3x3 depthwise convolution, 1x1 projection, residual Add where the shapes
                    match), a 1x1 convolution to 1280, GlobalAveragePool, Flatten, Gemm. Every
                    Conv is followed by a BatchNormalization; ReLU6 is Clip(0, 6), as torchvision
                    exports it.
  mobilenet_v2.input.npy  the input: uniform [-1, 1)
  bert.onnx         a BERT-base encoder layer stack: hidden float32[1, 128, 768] -> float32[1, 128,
                    768]. Per layer: Q, K and V projections (MatMul + Add), 12 heads of 64
                    (Reshape, Transpose), scores Q K^T / 8, Softmax, context, output projection,
                    residual Add and LayerNormalization, then the FFN 768 -> 3072 -> 768 with
                    GELU written as 0.5 x (1 + Erf(x / sqrt 2)), residual Add and
                    LayerNormalization. No attention mask.
  bert.input.npy    the input: standard normal (embeddings after their LayerNormalization)
  encoder.onnx      the encoder of issue 17's table: bert's layers at hidden 256, 4 heads of 64,
                    FFN 1024, 4 layers, seq 128 (post-norm, GELU through Erf): hidden float32[1,
                    128, 256] -> float32[1, 128, 256].
  encoder.input.npy the input: standard normal
  decoder.onnx      a GPT-2-style causal decoder: token ids int64[1, 128] -> logits float32[1, 128,
                    8192]. Token embedding (vocab 8192, width 256) plus a learned position
                    embedding (Gather of constant position ids), 4 pre-norm blocks (LayerNorm, Q,
                    K and V from one fused [256, 768] projection split in three, 4 heads of 64,
                    scores Q K^T * 1/8, causal mask as Where(tril, scores, -1e9), Softmax,
                    context, output projection, residual Add; LayerNorm, FFN 256 -> 1024 -> 256
                    with GELU's tanh form as GPT-2 writes it, residual Add), a final LayerNorm and
                    the head, tied to the token embedding: MatMul with Transpose(wte).
  decoder.input.npy the input: uniform token ids in [0, 8192)
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.count = 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, prefix, data):
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(data), name))
        return name

    def normal(self, prefix, shape, scale, mean=0.0):
        return self.const(prefix, (mean + self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op, inputs, prefix, **attrs):
        out = self.name(prefix)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def model(self, name, inputs, outputs):
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(graph, producer_name="kiln-bench-ort",
                              opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        onnx.checker.check_model(m, full_check=True)
        return m


# --- ResNet-50 -----------------------------------------------------------------------------------

def conv_bn(b, x, cin, cout, k, stride, relu=True, group=1):
    w = b.normal("w", (cout, cin // group, k, k), np.sqrt(2.0 / (cin // group * k * k)))
    y = b.node("Conv", [x, w], "conv", kernel_shape=[k, k], strides=[stride, stride],
               pads=[k // 2] * 4, group=group)
    scale = b.normal("gamma", (cout,), 0.1, mean=1.0)
    bias = b.normal("beta", (cout,), 0.1)
    mean = b.normal("mean", (cout,), 0.1)
    var = b.const("var", (1.0 + np.abs(b.rng.standard_normal(cout)) * 0.1).astype(np.float32))
    y = b.node("BatchNormalization", [y, scale, bias, mean, var], "bn", epsilon=1e-5)
    return b.node("Relu", [y], "relu") if relu else y


def bottleneck(b, x, cin, width, stride, cout=None, group=1):
    cout = cout or width * 4
    y = conv_bn(b, x, cin, width, 1, 1)
    y = conv_bn(b, y, width, width, 3, stride, group=group)
    y = conv_bn(b, y, width, cout, 1, 1, relu=False)
    shortcut = x if stride == 1 and cin == cout else conv_bn(b, x, cin, cout, 1, stride, relu=False)
    return b.node("Relu", [b.node("Add", [y, shortcut], "add")], "relu")


def basic_block(b, x, cin, cout, stride):
    y = conv_bn(b, x, cin, cout, 3, stride)
    y = conv_bn(b, y, cout, cout, 3, 1, relu=False)
    shortcut = x if stride == 1 and cin == cout else conv_bn(b, x, cin, cout, 1, stride, relu=False)
    return b.node("Relu", [b.node("Add", [y, shortcut], "add")], "relu")


def resnet18(classes=1000, image=224):
    b = Builder(seed=18)
    x = conv_bn(b, "input", 3, 64, 7, 2)
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage in range(4):
        cout = 64 * 2 ** stage
        for i in range(2):
            x = basic_block(b, x, cin, cout, 2 if i == 0 and stage > 0 else 1)
            cin = cout
    x = b.node("GlobalAveragePool", [x], "gap")
    x = b.node("Flatten", [x], "flatten", axis=1)
    w = b.normal("fc_w", (classes, cin), 1.0 / np.sqrt(cin))
    fc_b = b.normal("fc_b", (classes,), 0.01)
    b.nodes.append(helper.make_node("Gemm", [x, w, fc_b], ["logits"], name="fc", transB=1))
    return b.model(
        "resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])])


def bottleneck_net(name, seed, base_width, group, classes=1000, image=224):
    """A 7x7/2 stem, 3x3/2 MaxPool, bottleneck stages of [3, 4, 6, 3] blocks ending at 256..2048
    channels, the 3x3 convolutions base_width..8 * base_width wide in `group` groups,
    GlobalAveragePool, Flatten, Gemm."""
    b = Builder(seed=seed)
    x = conv_bn(b, "input", 3, 64, 7, 2)
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, blocks in enumerate([3, 4, 6, 3]):
        width, cout = base_width * 2 ** stage, 256 * 2 ** stage
        for i in range(blocks):
            x = bottleneck(b, x, cin, width, 2 if i == 0 and stage > 0 else 1, cout, group)
            cin = cout
    x = b.node("GlobalAveragePool", [x], "gap")
    x = b.node("Flatten", [x], "flatten", axis=1)
    w = b.normal("fc_w", (classes, cin), 1.0 / np.sqrt(cin))
    fc_b = b.normal("fc_b", (classes,), 0.01)
    b.nodes.append(helper.make_node("Gemm", [x, w, fc_b], ["logits"], name="fc", transB=1))
    return b.model(
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])])


def resnet50():
    return bottleneck_net("resnet50", 50, 64, 1)


def resnext50():
    """ResNeXt-50 32x4d: ResNet-50's stages with the 3x3 convolutions in 32 groups, twice as
    wide (4, 8, 16 and 32 channels a group)."""
    return bottleneck_net("resnext50", 5032, 128, 32)


# --- MobileNetV2 ---------------------------------------------------------------------------------

def relu6(b, x):
    # As torchvision's export writes ReLU6: Clip with min and max inputs.
    return b.node("Clip", [x, b.const("zero", np.float32(0)), b.const("six", np.float32(6))], "clip")


def inverted_residual(b, x, cin, cout, stride, expand):
    hidden = cin * expand
    y = x
    if expand != 1:
        y = relu6(b, conv_bn(b, y, cin, hidden, 1, 1, relu=False))
    y = relu6(b, conv_bn(b, y, hidden, hidden, 3, stride, relu=False, group=hidden))
    y = conv_bn(b, y, hidden, cout, 1, 1, relu=False)
    return b.node("Add", [y, x], "add") if stride == 1 and cin == cout else y


def mobilenet_v2(classes=1000, image=224):
    b = Builder(seed=2)
    x = relu6(b, conv_bn(b, "input", 3, 32, 3, 2, relu=False))
    cin = 32
    # (expansion, output channels, blocks, first stride), as in the MobileNetV2 paper.
    for expand, cout, blocks, stride in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2),
                                         (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                                         (6, 320, 1, 1)]:
        for i in range(blocks):
            x = inverted_residual(b, x, cin, cout, stride if i == 0 else 1, expand)
            cin = cout
    x = relu6(b, conv_bn(b, x, cin, 1280, 1, 1, relu=False))
    x = b.node("GlobalAveragePool", [x], "gap")
    x = b.node("Flatten", [x], "flatten", axis=1)
    w = b.normal("fc_w", (classes, 1280), 1.0 / np.sqrt(1280))
    fc_b = b.normal("fc_b", (classes,), 0.01)
    b.nodes.append(helper.make_node("Gemm", [x, w, fc_b], ["logits"], name="fc", transB=1))
    return b.model(
        "mobilenet_v2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])])


# --- BERT-base encoder ---------------------------------------------------------------------------

def linear(b, x, cin, cout):
    w = b.normal("w", (cin, cout), 0.02)
    bias = b.normal("b", (cout,), 0.02)
    return b.node("Add", [b.node("MatMul", [x, w], "matmul"), bias], "add")


def layer_norm(b, x, hidden):
    scale = b.normal("ln_scale", (hidden,), 0.05, mean=1.0)
    bias = b.normal("ln_bias", (hidden,), 0.05)
    return b.node("LayerNormalization", [x, scale, bias], "ln", axis=-1, epsilon=1e-12)


def encoder_layer(b, x, seq, hidden, heads, ffn, shapes):
    head = hidden // heads

    def split_heads(t, perm):  # [1, seq, hidden] -> [1, heads, seq, head] (or K^T)
        return b.node("Transpose", [b.node("Reshape", [t, shapes["heads"]], "reshape")],
                      "transpose", perm=perm)

    q = split_heads(linear(b, x, hidden, hidden), [0, 2, 1, 3])
    k = split_heads(linear(b, x, hidden, hidden), [0, 2, 3, 1])
    v = split_heads(linear(b, x, hidden, hidden), [0, 2, 1, 3])
    scores = b.node("Div", [b.node("MatMul", [q, k], "matmul"), shapes["sqrt_head"]], "div")
    probs = b.node("Softmax", [scores], "softmax", axis=-1)
    context = b.node("MatMul", [probs, v], "matmul")
    context = b.node("Transpose", [context], "transpose", perm=[0, 2, 1, 3])
    context = b.node("Reshape", [context, shapes["hidden"]], "reshape")
    x = layer_norm(b, b.node("Add", [x, linear(b, context, hidden, hidden)], "add"), hidden)
    h = linear(b, x, hidden, ffn)
    erf = b.node("Erf", [b.node("Div", [h, shapes["sqrt2"]], "div")], "erf")
    gelu = b.node("Mul", [b.node("Mul", [h, shapes["half"]], "mul"),
                          b.node("Add", [erf, shapes["one"]], "add")], "mul")
    y = linear(b, gelu, ffn, hidden)
    return layer_norm(b, b.node("Add", [x, y], "add"), hidden)


def bert(layers, seq=128, hidden=768, heads=12, ffn=3072):
    b = Builder(seed=768)
    shapes = {
        "heads": b.const("shape_heads", np.array([1, seq, heads, hidden // heads], np.int64)),
        "hidden": b.const("shape_hidden", np.array([1, seq, hidden], np.int64)),
        "sqrt_head": b.const("sqrt_head", np.array(np.sqrt(hidden // heads), np.float32)),
        "sqrt2": b.const("sqrt2", np.array(np.sqrt(2.0), np.float32)),
        "half": b.const("half", np.array(0.5, np.float32)),
        "one": b.const("one", np.array(1.0, np.float32)),
    }
    x = "hidden"
    for _ in range(layers):
        x = encoder_layer(b, x, seq, hidden, heads, ffn, shapes)
    b.nodes.append(helper.make_node("Identity", [x], ["output"], name="output"))
    return b.model(
        "bert_encoder",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, seq, hidden])])


# --- GPT-style decoder ---------------------------------------------------------------------------

def gelu_tanh(b, x, consts):
    # GPT-2's gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), node by node.
    cube = b.node("Mul", [b.node("Mul", [x, x], "mul"), x], "mul")
    inner = b.node("Add", [x, b.node("Mul", [cube, consts["c044"]], "mul")], "add")
    t = b.node("Tanh", [b.node("Mul", [inner, consts["sqrt_2_pi"]], "mul")], "tanh")
    return b.node("Mul", [b.node("Mul", [x, consts["half"]], "mul"),
                          b.node("Add", [t, consts["one"]], "add")], "mul")


def decoder_block(b, x, hidden, heads, ffn, consts):
    head = hidden // heads
    h = layer_norm(b, x, hidden)
    qkv = linear(b, h, hidden, 3 * hidden)
    q, k, v = (b.name("split") for _ in range(3))
    b.nodes.append(helper.make_node("Split", [qkv, consts["split3"]], [q, k, v], name=b.name("split"),
                                    axis=-1))

    def split_heads(t, perm):  # [1, seq, hidden] -> [1, heads, seq, head] (or K^T)
        return b.node("Transpose", [b.node("Reshape", [t, consts["heads"]], "reshape")],
                      "transpose", perm=perm)

    scores = b.node("Mul", [b.node("MatMul", [split_heads(q, [0, 2, 1, 3]),
                                              split_heads(k, [0, 2, 3, 1])], "matmul"),
                            consts["inv_sqrt_head"]], "mul")
    scores = b.node("Where", [consts["causal"], scores, consts["neg"]], "where")
    probs = b.node("Softmax", [scores], "softmax", axis=-1)
    context = b.node("MatMul", [probs, split_heads(v, [0, 2, 1, 3])], "matmul")
    context = b.node("Transpose", [context], "transpose", perm=[0, 2, 1, 3])
    context = b.node("Reshape", [context, consts["hidden"]], "reshape")
    x = b.node("Add", [x, linear(b, context, hidden, hidden)], "add")
    h = linear(b, layer_norm(b, x, hidden), hidden, ffn)
    return b.node("Add", [x, linear(b, gelu_tanh(b, h, consts), ffn, hidden)], "add")


def decoder(blocks=4, seq=128, hidden=256, heads=4, ffn=1024, vocab=8192):
    b = Builder(seed=8192)
    consts = {
        "heads": b.const("shape_heads", np.array([1, seq, heads, hidden // heads], np.int64)),
        "hidden": b.const("shape_hidden", np.array([1, seq, hidden], np.int64)),
        "split3": b.const("split3", np.array([hidden] * 3, np.int64)),
        "inv_sqrt_head": b.const("inv_sqrt_head",
                                 np.array(1.0 / np.sqrt(hidden // heads), np.float32)),
        "causal": b.const("causal", np.tril(np.ones((1, 1, seq, seq), bool))),
        "neg": b.const("neg", np.array(-1e9, np.float32)),
        "c044": b.const("c044", np.array(0.044715, np.float32)),
        "sqrt_2_pi": b.const("sqrt_2_pi", np.array(np.sqrt(2.0 / np.pi), np.float32)),
        "half": b.const("half", np.array(0.5, np.float32)),
        "one": b.const("one", np.array(1.0, np.float32)),
    }
    wte = b.normal("wte", (vocab, hidden), 0.02)
    wpe = b.normal("wpe", (seq, hidden), 0.01)
    positions = b.const("positions", np.arange(seq, dtype=np.int64).reshape(1, seq))
    x = b.node("Add", [b.node("Gather", [wte, "tokens"], "gather", axis=0),
                       b.node("Gather", [wpe, positions], "gather", axis=0)], "add")
    for _ in range(blocks):
        x = decoder_block(b, x, hidden, heads, ffn, consts)
    x = layer_norm(b, x, hidden)
    # The head shares the token embedding (tied weights), as GPT-2's export writes it.
    head_w = b.node("Transpose", [wte], "transpose", perm=[1, 0])
    b.nodes.append(helper.make_node("MatMul", [x, head_w], ["logits"], name="head"))
    return b.model(
        "gpt_decoder",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])])


def save(model, path):
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--bert-layers", type=int, default=12)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(2026)
    save(resnet50(), os.path.join(args.out_dir, "resnet50.onnx"))
    np.save(os.path.join(args.out_dir, "resnet50.input.npy"),
            rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32))
    save(mobilenet_v2(), os.path.join(args.out_dir, "mobilenet_v2.onnx"))
    np.save(os.path.join(args.out_dir, "mobilenet_v2.input.npy"),
            rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32))
    save(bert(args.bert_layers), os.path.join(args.out_dir, "bert.onnx"))
    np.save(os.path.join(args.out_dir, "bert.input.npy"),
            rng.standard_normal((1, 128, 768)).astype(np.float32))
    save(bert(4, hidden=256, heads=4, ffn=1024), os.path.join(args.out_dir, "encoder.onnx"))
    np.save(os.path.join(args.out_dir, "encoder.input.npy"),
            rng.standard_normal((1, 128, 256)).astype(np.float32))
    save(decoder(), os.path.join(args.out_dir, "decoder.onnx"))
    np.save(os.path.join(args.out_dir, "decoder.input.npy"),
            rng.integers(0, 8192, (1, 128)).astype(np.int64))
    save(resnext50(), os.path.join(args.out_dir, "resnext50.onnx"))
    np.save(os.path.join(args.out_dir, "resnext50.input.npy"),
            rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32))
    save(resnet18(), os.path.join(args.out_dir, "resnet18.onnx"))
    np.save(os.path.join(args.out_dir, "resnet18.input.npy"),
            rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32))
