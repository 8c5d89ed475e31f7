#!/usr/bin/python3
"""Writes small models with seeded random weights and inputs, and their expected outputs computed
here in plain numpy (float64, then rounded to float32), for tests/models/test_models.sh. The
reference never comes from Kiln or from ONNX Runtime: convolution, batch normalization, pooling,
Gemm and Softmax are written out below.

Usage: /usr/bin/python3 make_models.py OUT_DIR

Writes, each into its own folder under OUT_DIR:
  mlp/      x: float32[4, 16] -> y: float32[4, 10]. MatMul + Add + Relu, Gemm (transB) + Relu,
            Gemm + Softmax. Files: model.onnx, x.npy, y.npy.
  mlp_dyn/  the same MLP with x: float32[batch, 16]. Files: model.onnx, x_b{1,3,8,0}.npy,
            y_b{1,3,8,0}.npy.
  residual_mlp/  x: float32[5, 24] -> y: float32[5, 10]. r = Relu(x), h = Relu(MatMul(r) + b),
            y = MatMul(MatMul(h) + r): a GEMM whose epilogue adds a residual (as a transformer
            block's projection does). Files: model.onnx, x.npy, y.npy.
  control/  x: float32[n] -> y: float32[n], z: float32[trips]. Control flow decided by the data: an
            If on sum(x) > 0 (then 2x, else x - 1), then a Loop of floor(clip(max(x), 0, 6))
            trips whose body holds a nested If on the parity of the iteration (acc + i, else
            acc - x, reading x two graphs up) and scans sum(acc). Files: model.onnx,
            x_{pos,neg,zero}.npy, y_*.npy, z_*.npy (zero: a loop that runs no iteration).
  computed/ shapes computed from data (float inputs cast to int64, never known when compiling):
            Reshape(x, s) with a -1, Expand and Tile of x[:3] by e, ConstantOfShape(e),
            TopK(x, k), Range(r[0], r[1], r[2]). Inputs x: float32[12], s, e: float32[2],
            k: float32[], r: float32[3]; outputs reshaped, expanded, tiled, zeros, top_v, top_i,
            ranged. Two sets of inputs (set{1,2}/) with their outputs, run by one compile.
  cnn/      x: float32[2, 3, 16, 16] -> y: float32[2, 10]. Conv (bias, pads 1, stride 2),
            BatchNormalization, Relu, MaxPool 2x2, Conv (bias, pads 1), Relu, GlobalAveragePool,
            Flatten, Gemm (transB). Files: model.onnx, x.npy, y.npy.
  winograd/ x: float32[2, 32, 28, 30] -> y: float32[2, 32, 28, 30]. A residual block whose two 3x3
            stride-1 convolutions are large enough for the Winograd template to be the heuristic
            choice: Conv (32 -> 40, bias, pads 1), BatchNormalization, Relu, Conv (40 -> 32, pads
            1), Add(x), Relu; 30 columns leave partial tiles. Files: model.onnx, x.npy, y.npy.
  atrous/   x: float32[2, 16, 6, 14] -> y: float32[2, 8, 6, 14]. Three dilated 3x3 convolutions
            (16 -> 8, bias) with taps that read only padding, as DeepLab's atrous pyramid has on
            small feature maps: dilation 24 (only the centre tap reads x), dilations (4, 2) with
            8 rows of padding above and none below (the top row of taps reads none of x), and
            dilation 12 (the top and bottom rows read none of it); the first followed by a
            BatchNormalization and Relu, the three summed. Files: model.onnx, x.npy, y.npy.
  mobilenet/ x: float32[2, 3, 15, 13] -> y: float32[2, 40, 8, 7]. MobileNetV2's blocks at awkward
            sizes, which Kiln runs channels-last (lower/nn.cpp): a 3x3 stride-2 stem, a depthwise
            3x3 (19 channels), a 1x1 projection, a ResNeXt-style grouped 3x3 (21 channels in 3
            groups of 7), an inverted residual block (1x1 expand to 37, depthwise 3x3, 1x1
            project, Add), a 1x1 to 40, a grouped 3x3 in 10 groups of 4 channels; each Conv
            followed by a BatchNormalization and most by ReLU6 as Clip(0, 6). Files:
            model.onnx, x.npy, y.npy.
  squeeze/  x: float32[2, 3, 17, 19] -> y: float32[2, 24, 3, 3]. SqueezeNet's pattern, run
            channels-last (4 convolutions): a 3x3 stride-2 Conv + Relu (16 channels, 9 x 10), a
            MaxPool 3x3 stride 2 with ceil_mode (the last column of windows reaches one column
            past the input), a Fire module (1x1 squeeze to 6 + Relu, 1x1 and 3x3 expands to 11 and 13 +
            Relu, Concat), a BatchNormalization of the Concat (DenseNet's order: it cannot fold
            into a convolution), a MaxPool 3x3 stride 2 pads 1 with ceil_mode (its last windows
            reach past the end pad). Files: model.onnx, x.npy, y.npy.
  squeeze_dyn/ the same network with x: float32[batch, 3, 17, 19]. Files: model.onnx,
            x_b{1,3}.npy, y_b{1,3}.npy.
  se/       x: float32[2, 3, 15, 13] -> y: float32[2, 70]. EfficientNet's MBConv pattern with SiLU
            as Sigmoid and Mul: a 3x3 stride-2 stem (16 channels), a depthwise 3x3, a
            squeeze-excitation (ReduceMean over H and W with keepdims, 1x1 to 4 + SiLU, 1x1 to 16,
            Sigmoid, Mul into the depthwise output), a 1x1 projection to 24, a 1x1 head to 70 +
            SiLU (70: one block of 64 channels and a part), ReduceMean with keepdims, Flatten.
            Files: model.onnx, x.npy, y.npy.
  se_b1/    the same network at batch 1 on a larger image (16 x 14 after the stem, 9 pixels per
            output channel of the projection): x float32[1, 3, 31, 27] -> y float32[1, 70].
  mobilenet_dyn/ the same network with x: float32[batch, 3, 15, 13], ending in
            GlobalAveragePool and Flatten: y float32[batch, 40]. Files: model.onnx,
            x_b{1,2}.npy, y_b{1,2}.npy.
  inverted/ x: float32[2, 16, 45, 39] -> y: float32[2, 24, 23, 20]. Two of MobileNetV2's inverted
            residual blocks whose expanded activations (1.3 MiB) are large enough for the
            expansion to be fused into the depthwise convolution: 1x1 expand to 96, depthwise
            3x3 stride 1, 1x1 project to 16, Add(x); then 1x1 expand to 96, depthwise 3x3 stride
            2 (odd sizes), 1x1 project to 24; each Conv followed by a BatchNormalization, the
            expansions and depthwise ones by ReLU6 as Clip(0, 6). x holds two NaNs, an inf and a
            -inf, so y has NaNs where they reach. Files: model.onnx, x.npy, y.npy.
  conv_act/ x: float32[2, 4, 11, 9] -> y: float32[2, 4, 11, 9]. A chain of eleven grouped 3x3
            convolutions (4 channels in 2 groups, bias, pads 1: Kiln runs them through oneDNN),
            each followed by an activation: Relu, Clip(0, 6), Clip with only a min,
            Sigmoid, Tanh, LeakyRelu (0.1), Elu (0.7), Gelu (erf) and Gelu (tanh) at opset 20,
            SiLU as x * Sigmoid(x), and HardSigmoid (which oneDNN does not apply: a kernel of its
            own). Files: model.onnx, x.npy, y.npy.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240611
BATCHES = (1, 3, 8, 0)  # 0: an empty batch, which the MLP can take


# --- numpy references ----------------------------------------------------------------------------

def conv2d(x, w, b, pads, strides, group=1):
    """x: [N, C, H, W], w: [M, C / group, KH, KW], b: [M]; pads (top, left, bottom, right). Each
    group's output channels come from its own input channels (depthwise: one each)."""
    if group > 1:
        cg, mg = x.shape[1] // group, w.shape[0] // group
        return np.concatenate([conv2d(x[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg],
                                      b[g * mg:(g + 1) * mg], pads, strides)
                               for g in range(group)], axis=1)
    n, c, h, wd = x.shape
    m, c2, kh, kw = w.shape
    assert c == c2
    top, left, bottom, right = pads
    sh, sw = strides
    xp = np.zeros((n, c, h + top + bottom, wd + left + right), dtype=x.dtype)
    xp[:, :, top:top + h, left:left + wd] = x
    oh = (h + top + bottom - kh) // sh + 1
    ow = (wd + left + right - kw) // sw + 1
    y = np.zeros((n, m, oh, ow), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]  # [N, C, KH, KW]
            y[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return y + b.reshape(1, m, 1, 1)


def he_weight(rng, cin, cout, k, group=1):
    """A float32 convolution weight [cout, cin / group, k, k], normal with variance 2 / fan-in."""
    fan_in = cin // group * k * k
    return (np.sqrt(2 / fan_in) *
            rng.standard_normal((cout, cin // group, k, k))).astype(np.float32)


def batch_norm(x, scale, bias, mean, var, eps):
    shape = (1, -1, 1, 1)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) \
        + bias.reshape(shape)


def max_pool(x, kernel, stride, pad=0, ceil_mode=False):
    """MaxPool with `pad` on every side. With ceil_mode the output size rounds up, and a window
    that would start in the end padding is dropped (ONNX's rule, as PyTorch's); padding and the
    overhang never win."""
    n, c, h, w = x.shape

    def out_size(size):
        span = size + 2 * pad - kernel
        if not ceil_mode:
            return span // stride + 1
        out = -(-span // stride) + 1
        return out - 1 if (out - 1) * stride >= size + pad else out
    oh, ow = out_size(h), out_size(w)
    xp = np.full((n, c, max(h + 2 * pad, (oh - 1) * stride + kernel),
                  max(w + 2 * pad, (ow - 1) * stride + kernel)), -np.inf)
    xp[:, :, pad:pad + h, pad:pad + w] = x
    y = np.empty((n, c, oh, ow), dtype=x.dtype)
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = xp[:, :, i * stride:i * stride + kernel,
                               j * stride:j * stride + kernel].max(axis=(2, 3))
    return y


def relu(x):
    return np.maximum(x, 0)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def f64(*arrays):
    return [a.astype(np.float64) for a in arrays]


# --- models ---------------------------------------------------------------------------------------

def save(model, folder):
    onnx.checker.check_model(model, full_check=True)
    os.makedirs(folder, exist_ok=True)
    onnx.save_model(model, os.path.join(folder, "model.onnx"))


def finish(nodes, name, x_shape, y_shape, params):
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, producer_name="kiln-tests",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def mlp_params(rng):
    def normal(*shape, scale):
        return (scale * rng.standard_normal(shape)).astype(np.float32)
    return {
        "w1": normal(16, 32, scale=0.25), "b1": normal(32, scale=0.1),
        "w2t": normal(24, 32, scale=0.2), "b2": normal(24, scale=0.1),  # Gemm, transB=1
        "w3": normal(24, 10, scale=0.3), "b3": normal(10, scale=0.1),
    }


def mlp_model(params, batch):
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["mm1"], name="fc1_matmul"),
        helper.make_node("Add", ["mm1", "b1"], ["a1"], name="fc1_add"),
        helper.make_node("Relu", ["a1"], ["h1"], name="fc1_relu"),
        helper.make_node("Gemm", ["h1", "w2t", "b2"], ["a2"], transB=1, name="fc2_gemm"),
        helper.make_node("Relu", ["a2"], ["h2"], name="fc2_relu"),
        helper.make_node("Gemm", ["h2", "w3", "b3"], ["a3"], alpha=1.5, beta=0.5,
                         name="fc3_gemm"),
        helper.make_node("Softmax", ["a3"], ["y"], axis=-1, name="softmax"),
    ]
    return finish(nodes, "mlp", [batch, 16], [batch, 10], params)


def residual_mlp_model(params):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu_in"),
        helper.make_node("MatMul", ["r", "w1"], ["mm1"], name="fc1_matmul"),
        helper.make_node("Add", ["mm1", "b1"], ["a1"], name="fc1_add"),
        helper.make_node("Relu", ["a1"], ["h"], name="fc1_relu"),
        helper.make_node("MatMul", ["h", "w2"], ["mm2"], name="fc2_matmul"),
        helper.make_node("Add", ["mm2", "r"], ["s"], name="residual"),
        helper.make_node("MatMul", ["s", "w3"], ["y"], name="fc3_matmul"),
    ]
    return finish(nodes, "residual_mlp", [5, 24], [5, 10], params)


def residual_mlp_reference(p, x):
    w1, b1, w2, w3, x = f64(p["w1"], p["b1"], p["w2"], p["w3"], x)
    r = relu(x)
    return (relu(r @ w1 + b1) @ w2 + r) @ w3


def mlp_reference(p, x):
    x, w1, b1, w2t, b2, w3, b3 = f64(x, p["w1"], p["b1"], p["w2t"], p["b2"], p["w3"], p["b3"])
    h1 = relu(x @ w1 + b1)
    h2 = relu(h1 @ w2t.T + b2)
    return softmax(1.5 * (h2 @ w3) + 0.5 * b3)


def cnn_params(rng):
    def normal(*shape, scale):
        return (scale * rng.standard_normal(shape)).astype(np.float32)
    return {
        "conv1.w": normal(8, 3, 3, 3, scale=0.3), "conv1.b": normal(8, scale=0.1),
        "bn.scale": (1 + 0.2 * rng.standard_normal(8)).astype(np.float32),
        "bn.bias": normal(8, scale=0.1),
        "bn.mean": normal(8, scale=0.1),
        "bn.var": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "conv2.w": normal(16, 8, 3, 3, scale=0.2), "conv2.b": normal(16, scale=0.1),
        "fc.w": normal(10, 16, scale=0.3), "fc.b": normal(10, scale=0.1),
    }


def cnn_model(params, batch):
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[2, 2], name="conv1"),
        helper.make_node("BatchNormalization",
                         ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["n1"],
                         epsilon=1e-3, name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool1"),
        helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1, name="fc"),
    ]
    return finish(nodes, "cnn", [batch, 3, 16, 16], [batch, 10], params)


def cnn_reference(p, x):
    x = x.astype(np.float64)
    p = {k: v.astype(np.float64) for k, v in p.items()}
    c1 = conv2d(x, p["conv1.w"], p["conv1.b"], pads=(1, 1, 1, 1), strides=(2, 2))  # [N, 8, 8, 8]
    n1 = batch_norm(c1, p["bn.scale"], p["bn.bias"], p["bn.mean"], p["bn.var"], 1e-3)
    p1 = max_pool(relu(n1), kernel=2, stride=2)  # [N, 8, 4, 4]
    c2 = conv2d(p1, p["conv2.w"], p["conv2.b"], pads=(1, 1, 1, 1), strides=(1, 1))
    g = relu(c2).mean(axis=(2, 3))  # GlobalAveragePool + Flatten: [N, 16]
    return g @ p["fc.w"].T + p["fc.b"]


def winograd_params(rng):
    def normal(*shape, scale):
        return (scale * rng.standard_normal(shape)).astype(np.float32)
    return {
        "conv1.w": normal(40, 32, 3, 3, scale=np.sqrt(2 / 288)), "conv1.b": normal(40, scale=0.1),
        "bn.scale": (1 + 0.2 * rng.standard_normal(40)).astype(np.float32),
        "bn.bias": normal(40, scale=0.1),
        "bn.mean": normal(40, scale=0.1),
        "bn.var": rng.uniform(0.5, 1.5, 40).astype(np.float32),
        "conv2.w": normal(32, 40, 3, 3, scale=np.sqrt(2 / 360)),
    }


def winograd_model(params):
    shape = [2, 32, 28, 30]
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization",
                         ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["n1"],
                         epsilon=1e-5, name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2.w"], ["c2"], kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "x"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["y"], name="relu2"),
    ]
    return finish(nodes, "winograd", shape, shape, params)


def winograd_reference(p, x):
    x = x.astype(np.float64)
    p = {k: v.astype(np.float64) for k, v in p.items()}
    c1 = conv2d(x, p["conv1.w"], p["conv1.b"], pads=(1, 1, 1, 1), strides=(1, 1))
    r1 = relu(batch_norm(c1, p["bn.scale"], p["bn.bias"], p["bn.mean"], p["bn.var"], 1e-5))
    c2 = conv2d(r1, p["conv2.w"], np.zeros(32), pads=(1, 1, 1, 1), strides=(1, 1))
    return relu(c2 + x)


MOBILENET_CONVS = (  # name, input channels, output channels, kernel, stride, group
    ("stem", 3, 19, 3, 2, 1), ("dw1", 19, 19, 3, 1, 19), ("pw1", 19, 21, 1, 1, 1),
    ("grouped", 21, 21, 3, 1, 3), ("expand", 21, 37, 1, 1, 1), ("dw2", 37, 37, 3, 1, 37), ("project", 37, 21, 1, 1, 1),
    ("head", 21, 40, 1, 1, 1), ("grouped4", 40, 40, 3, 1, 10))


INVERTED_CONVS = (  # MobileNetV2's inverted residual blocks with expansions of 1.3 MiB
    ("expand1", 16, 96, 1, 1, 1), ("dw1", 96, 96, 3, 1, 96), ("project1", 96, 16, 1, 1, 1),
    ("expand2", 16, 96, 1, 1, 1), ("dw2", 96, 96, 3, 2, 96), ("project2", 96, 24, 1, 1, 1))


def conv_bn_params(rng, convs):
    params = {}
    for name, cin, cout, k, _, group in convs:
        params[name + ".w"] = he_weight(rng, cin, cout, k, group)
        params[name + ".scale"] = (1 + 0.2 * rng.standard_normal(cout)).astype(np.float32)
        params[name + ".bias"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        params[name + ".mean"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        params[name + ".var"] = rng.uniform(0.5, 1.5, cout).astype(np.float32)
    params["zero"] = np.array(0, dtype=np.float32)
    params["six"] = np.array(6, dtype=np.float32)
    return params


def conv_bn_nodes(nodes, convs):
    """conv_bn(name, x, clip=True): appends Conv `name` of `convs` (pads k // 2), its
    BatchNormalization and (with clip) ReLU6 as Clip(0, 6) to `nodes`; returns the output name."""
    convs = {c[0]: c for c in convs}

    def conv_bn(name, x, clip=True):
        _, _, _, k, stride, group = convs[name]
        nodes.append(helper.make_node("Conv", [x, name + ".w"], [name + ".c"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4, group=group,
                                      name=name))
        nodes.append(helper.make_node(
            "BatchNormalization", [name + ".c"] + [name + s for s in (".scale", ".bias", ".mean",
                                                                    ".var")],
            [name + ".n"], epsilon=1e-5, name=name + "_bn"))
        if not clip:
            return name + ".n"
        nodes.append(helper.make_node("Clip", [name + ".n", "zero", "six"], [name + ".r"],
                                      name=name + "_clip"))
        return name + ".r"
    return conv_bn


def conv_bn_reference(p, convs):
    """The numpy (float64) counterpart of conv_bn_nodes over the parameters `p`."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    convs = {c[0]: c for c in convs}

    def conv_bn(name, x, clip=True):
        _, _, cout, k, stride, group = convs[name]
        c = conv2d(x, p[name + ".w"], np.zeros(cout), pads=(k // 2,) * 4, strides=(stride, stride),
                   group=group)
        n = batch_norm(c, p[name + ".scale"], p[name + ".bias"], p[name + ".mean"],
                       p[name + ".var"], 1e-5)
        return np.clip(n, 0, 6) if clip else n
    return conv_bn


def mobilenet_model(params, batch, pool):
    nodes = []
    conv_bn = conv_bn_nodes(nodes, MOBILENET_CONVS)
    y = conv_bn("pw1", conv_bn("dw1", conv_bn("stem", "x")), clip=False)
    y = conv_bn("grouped", y, clip=False)
    block = conv_bn("project", conv_bn("dw2", conv_bn("expand", y)), clip=False)
    nodes.append(helper.make_node("Add", [block, y], ["res"], name="residual"))
    head = conv_bn("grouped4", conv_bn("head", "res"))
    if pool:
        nodes.append(helper.make_node("GlobalAveragePool", [head], ["pooled"], name="pool"))
        nodes.append(helper.make_node("Flatten", ["pooled"], ["y"], name="flatten"))
        return finish(nodes, "mobilenet_dyn", [batch, 3, 15, 13], [batch, 40], params)
    nodes.append(helper.make_node("Identity", [head], ["y"], name="out"))
    return finish(nodes, "mobilenet", [batch, 3, 15, 13], [batch, 40, 8, 7], params)


def mobilenet_reference(p, x, pool):
    conv_bn = conv_bn_reference(p, MOBILENET_CONVS)
    y = conv_bn("pw1", conv_bn("dw1", conv_bn("stem", x.astype(np.float64))), clip=False)
    y = conv_bn("grouped", y, clip=False)
    head = conv_bn("head", conv_bn("project", conv_bn("dw2", conv_bn("expand", y)), clip=False) + y)
    head = conv_bn("grouped4", head)
    return head.mean(axis=(2, 3)) if pool else head


def inverted_model(params):
    nodes = []
    conv_bn = conv_bn_nodes(nodes, INVERTED_CONVS)
    block = conv_bn("project1", conv_bn("dw1", conv_bn("expand1", "x")), clip=False)
    nodes.append(helper.make_node("Add", [block, "x"], ["res"], name="residual"))
    y = conv_bn("project2", conv_bn("dw2", conv_bn("expand2", "res")), clip=False)
    nodes.append(helper.make_node("Identity", [y], ["y"], name="out"))
    return finish(nodes, "inverted", [2, 16, 45, 39], [2, 24, 23, 20], params)


def inverted_reference(p, x):
    conv_bn = conv_bn_reference(p, INVERTED_CONVS)
    x = x.astype(np.float64)
    res = conv_bn("project1", conv_bn("dw1", conv_bn("expand1", x)), clip=False) + x
    return conv_bn("project2", conv_bn("dw2", conv_bn("expand2", res)), clip=False)


SQUEEZE_CONVS = (  # name, input channels, output channels, kernel, stride
    ("stem", 3, 16, 3, 2), ("squeeze", 16, 6, 1, 1), ("expand1", 6, 11, 1, 1),
    ("expand3", 6, 13, 3, 1))


def squeeze_params(rng):
    params = {}
    for name, cin, cout, k, _ in SQUEEZE_CONVS:
        params[name + ".w"] = he_weight(rng, cin, cout, k)
        params[name + ".b"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    params["bn.scale"] = (1 + 0.2 * rng.standard_normal(24)).astype(np.float32)
    params["bn.bias"] = (0.1 * rng.standard_normal(24)).astype(np.float32)
    params["bn.mean"] = (0.1 * rng.standard_normal(24)).astype(np.float32)
    params["bn.var"] = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    return params


def squeeze_model(params, batch):
    nodes = []
    convs = {c[0]: c for c in SQUEEZE_CONVS}

    def conv_relu(name, x):
        _, _, _, k, stride = convs[name]
        nodes.append(helper.make_node("Conv", [x, name + ".w", name + ".b"], [name + ".c"],
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4, name=name))
        nodes.append(helper.make_node("Relu", [name + ".c"], [name + ".r"], name=name + "_relu"))
        return name + ".r"

    nodes.append(helper.make_node("MaxPool", [conv_relu("stem", "x")], ["pool1"],
                                  kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, name="pool1"))
    squeezed = conv_relu("squeeze", "pool1")
    nodes.append(helper.make_node("Concat", [conv_relu("expand1", squeezed),
                                             conv_relu("expand3", squeezed)], ["fire"], axis=1,
                                  name="fire"))
    nodes.append(helper.make_node("BatchNormalization", ["fire", "bn.scale", "bn.bias", "bn.mean",
                                                         "bn.var"], ["fire_bn"], epsilon=1e-3,
                                  name="fire_bn"))
    nodes.append(helper.make_node("MaxPool", ["fire_bn"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1], ceil_mode=1, name="pool2"))
    return finish(nodes, "squeeze", [batch, 3, 17, 19], [batch, 24, 3, 3], params)


def squeeze_reference(p, x):
    p = {k: v.astype(np.float64) for k, v in p.items()}
    convs = {c[0]: c for c in SQUEEZE_CONVS}

    def conv_relu(name, x):
        _, _, _, k, stride = convs[name]
        return relu(conv2d(x, p[name + ".w"], p[name + ".b"], pads=(k // 2,) * 4,
                           strides=(stride, stride)))

    pool1 = max_pool(conv_relu("stem", x.astype(np.float64)), 3, 2, ceil_mode=True)  # [N, 16, 4, 5]
    squeezed = conv_relu("squeeze", pool1)
    fire = np.concatenate([conv_relu("expand1", squeezed), conv_relu("expand3", squeezed)], axis=1)
    fire = batch_norm(fire, p["bn.scale"], p["bn.bias"], p["bn.mean"], p["bn.var"], 1e-3)
    return max_pool(fire, 3, 2, pad=1, ceil_mode=True)  # [N, 24, 3, 3]


SE_CONVS = (  # name, input channels, output channels, kernel, stride, group
    ("stem", 3, 16, 3, 2, 1), ("dw", 16, 16, 3, 1, 16), ("se_reduce", 16, 4, 1, 1, 1),
    ("se_expand", 4, 16, 1, 1, 1), ("project", 16, 24, 1, 1, 1), ("head", 24, 70, 1, 1, 1))


def se_params(rng):
    params = {}
    for name, cin, cout, k, _, group in SE_CONVS:
        params[name + ".w"] = he_weight(rng, cin, cout, k, group)
        params[name + ".b"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    return params


def se_model(params, batch=2, size=(15, 13)):
    nodes = []
    convs = {c[0]: c for c in SE_CONVS}

    def conv(name, x):
        _, _, _, k, stride, group = convs[name]
        nodes.append(helper.make_node("Conv", [x, name + ".w", name + ".b"], [name + ".c"],
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4, group=group, name=name))
        return name + ".c"

    def silu(x):
        nodes.append(helper.make_node("Sigmoid", [x], [x + ".sig"], name=x + "_sigmoid"))
        nodes.append(helper.make_node("Mul", [x, x + ".sig"], [x + ".silu"], name=x + "_silu"))
        return x + ".silu"

    def mean(x, out):
        nodes.append(helper.make_node("ReduceMean", [x], [out], axes=[2, 3], keepdims=1,
                                      name=out))
        return out

    d = silu(conv("dw", silu(conv("stem", "x"))))
    scale = conv("se_expand", silu(conv("se_reduce", mean(d, "se_mean"))))
    nodes.append(helper.make_node("Sigmoid", [scale], ["se_gate"], name="se_gate"))
    nodes.append(helper.make_node("Mul", [d, "se_gate"], ["se_out"], name="se_scale"))
    pooled = mean(silu(conv("head", conv("project", "se_out"))), "head_mean")
    nodes.append(helper.make_node("Flatten", [pooled], ["y"], name="flatten"))
    return finish(nodes, "se", [batch, 3, *size], [batch, 70], params)


def se_reference(p, x):
    p = {k: v.astype(np.float64) for k, v in p.items()}
    convs = {c[0]: c for c in SE_CONVS}

    def conv(name, x):
        _, _, _, k, stride, group = convs[name]
        return conv2d(x, p[name + ".w"], p[name + ".b"], pads=(k // 2,) * 4,
                      strides=(stride, stride), group=group)

    def silu(x):
        return x / (1 + np.exp(-x))

    d = silu(conv("dw", silu(conv("stem", x.astype(np.float64)))))
    gate = 1 / (1 + np.exp(-conv("se_expand", silu(conv("se_reduce",
                                                          d.mean(axis=(2, 3), keepdims=True))))))
    head = silu(conv("head", conv("project", d * gate)))
    return head.mean(axis=(2, 3))


ATROUS_CONVS = (  # name, dilations (h, w), pads (top, left, bottom, right); 3x3, 16 -> 8
    ("wide", (24, 24), (24, 24, 24, 24)),  # every tap but the centre reads padding: a 1x1
    ("top", (4, 2), (8, 2, 0, 2)),         # the top row of taps reads padding: 2x3
    ("rows", (12, 12), (12, 12, 12, 12)),  # the top and bottom rows read padding: 1x3
)


def atrous_params(rng):
    params = {}
    for name, _, _ in ATROUS_CONVS:
        params[name + ".w"] = (0.2 * rng.standard_normal((8, 16, 3, 3))).astype(np.float32)
        params[name + ".b"] = (0.1 * rng.standard_normal(8)).astype(np.float32)
    params["bn.scale"] = (1 + 0.2 * rng.standard_normal(8)).astype(np.float32)
    params["bn.bias"] = (0.1 * rng.standard_normal(8)).astype(np.float32)
    params["bn.mean"] = (0.1 * rng.standard_normal(8)).astype(np.float32)
    params["bn.var"] = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    return params


def atrous_model(params):
    nodes = []
    for name, dilations, pads in ATROUS_CONVS:
        nodes.append(helper.make_node("Conv", ["x", name + ".w", name + ".b"], [name],
                                      kernel_shape=[3, 3], dilations=list(dilations),
                                      pads=list(pads), name=name))
    nodes.append(helper.make_node("BatchNormalization",
                                  ["wide", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["wide.n"],
                                  epsilon=1e-5, name="wide_bn"))
    nodes.append(helper.make_node("Relu", ["wide.n"], ["wide.r"], name="wide_relu"))
    nodes.append(helper.make_node("Add", ["wide.r", "top"], ["sum1"], name="add1"))
    nodes.append(helper.make_node("Add", ["sum1", "rows"], ["y"], name="add2"))
    return finish(nodes, "atrous", [2, 16, 6, 14], [2, 8, 6, 14], params)


def atrous_reference(p, x):
    p = {k: v.astype(np.float64) for k, v in p.items()}
    x = x.astype(np.float64)
    out = {}
    for name, (dh, dw), pads in ATROUS_CONVS:
        w = p[name + ".w"]
        # The dilated kernel: the taps spread dh and dw apart, zeros between them.
        wd = np.zeros((8, 16, 2 * dh + 1, 2 * dw + 1))
        wd[:, :, ::dh, ::dw] = w
        out[name] = conv2d(x, wd, p[name + ".b"], pads=pads, strides=(1, 1))
    wide = relu(batch_norm(out["wide"], p["bn.scale"], p["bn.bias"], p["bn.mean"], p["bn.var"],
                           1e-5))
    return wide + out["top"] + out["rows"]


def control_model():
    f = TensorProto.FLOAT
    scalar = lambda name, t: helper.make_tensor_value_info(name, t, [])
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t_out"])], "then",
        [], [helper.make_tensor_value_info("t_out", f, ["n"])])
    else_branch = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["e_out"])], "else",
        [], [helper.make_tensor_value_info("e_out", f, ["n"])])
    even = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "i_float"], ["even_out"])], "even",
        [], [helper.make_tensor_value_info("even_out", f, ["n"])])
    odd = helper.make_graph(
        [helper.make_node("Sub", ["acc_in", "x"], ["odd_out"])], "odd",
        [], [helper.make_tensor_value_info("odd_out", f, ["n"])])
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_float"], to=f),
         helper.make_node("Mod", ["i", "two_i"], ["parity"]),
         helper.make_node("Equal", ["parity", "zero_i"], ["is_even"]),
         helper.make_node("If", ["is_even"], ["acc_out"], then_branch=even, else_branch=odd),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0)],
        "body",
        [scalar("i", TensorProto.INT64), scalar("cond_in", TensorProto.BOOL),
         helper.make_tensor_value_info("acc_in", f, ["n"])],
        [scalar("cond_out", TensorProto.BOOL), helper.make_tensor_value_info("acc_out", f, ["n"]),
         scalar("total", f)])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
        helper.make_node("Greater", ["sum", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["start"], then_branch=then_branch,
                         else_branch=else_branch),
        helper.make_node("ReduceMax", ["x"], ["max"], keepdims=0),
        helper.make_node("Clip", ["max", "zero", "six"], ["clipped"]),
        helper.make_node("Floor", ["clipped"], ["floored"]),
        helper.make_node("Cast", ["floored"], ["trips"], to=TensorProto.INT64),
        helper.make_node("Loop", ["trips", "", "start"], ["y", "z"], body=body),
    ]
    consts = {"zero": np.float32(0), "one": np.float32(1), "two": np.float32(2),
              "six": np.float32(6), "two_i": np.int64(2), "zero_i": np.int64(0)}
    graph = helper.make_graph(
        nodes, "control", [helper.make_tensor_value_info("x", f, ["n"])],
        [helper.make_tensor_value_info("y", f, ["n"]),
         helper.make_tensor_value_info("z", f, ["trips"])],
        initializer=[numpy_helper.from_array(np.array(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, producer_name="kiln-tests",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def control_reference(x):
    x = x.astype(np.float64)
    acc = 2 * x if x.sum() > 0 else x - 1
    totals = []
    for i in range(int(np.floor(np.clip(x.max(), 0, 6)))):
        acc = acc + i if i % 2 == 0 else acc - x
        totals.append(acc.sum())
    return acc, np.array(totals)


COMPUTED_OUTPUTS = ("reshaped", "expanded", "tiled", "zeros", "top_v", "top_i", "ranged")


def computed_model():
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    node = helper.make_node
    nodes = [
        node("Cast", ["s"], ["s_i"], to=i64),
        node("Reshape", ["x", "s_i"], ["reshaped"]),
        node("Cast", ["e"], ["e_i"], to=i64),
        node("Slice", ["x", "zero1", "three1"], ["x3"]),
        node("Reshape", ["x3", "one_three"], ["x13"]),
        node("Expand", ["x13", "e_i"], ["expanded"]),
        node("Tile", ["x13", "e_i"], ["tiled"]),
        node("ConstantOfShape", ["e_i"], ["zeros"]),
        node("Cast", ["k"], ["k_i"], to=i64),
        node("Reshape", ["k_i", "one1"], ["k1"]),
        node("TopK", ["x", "k1"], ["top_v", "top_i"]),
        node("Cast", ["r"], ["r_i"], to=i64),
        node("Split", ["r_i"], ["r0", "r1", "r2"], axis=0),
        node("Squeeze", ["r0", "zero1"], ["start"]),
        node("Squeeze", ["r1", "zero1"], ["limit"]),
        node("Squeeze", ["r2", "zero1"], ["delta"]),
        node("Range", ["start", "limit", "delta"], ["ranged"]),
    ]
    consts = {"zero1": [0], "three1": [3], "one_three": [1, 3], "one1": [1]}
    shapes = {"reshaped": ["r0", "r1"], "expanded": ["e0", "e1"], "tiled": ["t0", "t1"],
              "zeros": ["z0", "z1"], "top_v": ["kk"], "top_i": ["kk"], "ranged": ["n"]}
    ints = ("top_i", "ranged")
    graph = helper.make_graph(
        nodes, "computed",
        [helper.make_tensor_value_info(n, f, s) for n, s in
         (("x", [12]), ("s", [2]), ("e", [2]), ("k", []), ("r", [3]))],
        [helper.make_tensor_value_info(n, i64 if n in ints else f, shapes[n])
         for n in COMPUTED_OUTPUTS],
        initializer=[numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()])
    model = helper.make_model(graph, producer_name="kiln-tests",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def computed_reference(x, s, e, k, r):
    x13 = x[:3].reshape(1, 3)
    e = e.astype(np.int64)
    order = np.argsort(-x, kind="stable")[:int(k)]
    return {"reshaped": x.reshape(s.astype(np.int64)), "expanded": x13 * np.ones(e),
            "tiled": np.tile(x13, e), "zeros": np.zeros(e), "top_v": x[order],
            "top_i": order.astype(np.int64), "ranged": np.arange(*r.astype(np.int64))}


# The activations of conv_act/, in its order: ONNX op, attributes, numpy (float64) reference.
def _gelu_erf(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


CONV_ACTIVATIONS = (
    ("Relu", {}, relu),
    ("Clip", {"bounds": (0.0, 6.0)}, lambda x: np.clip(x, 0, 6)),
    ("Clip", {"bounds": (-0.5,)}, lambda x: np.maximum(x, -0.5)),
    ("Sigmoid", {}, lambda x: 1 / (1 + np.exp(-x))),
    ("Tanh", {}, np.tanh),
    ("LeakyRelu", {"alpha": 0.1}, lambda x: np.where(x < 0, 0.1 * x, x)),
    ("Elu", {"alpha": 0.7}, lambda x: np.where(x < 0, 0.7 * np.expm1(x), x)),
    ("Gelu", {}, _gelu_erf),
    ("Gelu", {"approximate": "tanh"},
     lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    ("SiLU", {}, lambda x: x / (1 + np.exp(-x))),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
)


def conv_act_params(rng):
    p = {}
    for i in range(len(CONV_ACTIVATIONS)):
        p[f"w{i}"] = (0.6 * rng.standard_normal((4, 2, 3, 3))).astype(np.float32)
        p[f"b{i}"] = (0.2 * rng.standard_normal(4)).astype(np.float32)
    return p


def conv_act_model(params):
    nodes, inits, value = [], dict(params), "x"
    for i, (op, attrs, _) in enumerate(CONV_ACTIVATIONS):
        nodes.append(helper.make_node("Conv", [value, f"w{i}", f"b{i}"], [f"c{i}"],
                                      name=f"conv{i}", group=2, pads=[1, 1, 1, 1]))
        value = "y" if i == len(CONV_ACTIVATIONS) - 1 else f"a{i}"
        if op == "Clip":
            names = []
            for k, bound in enumerate(attrs["bounds"]):
                inits[f"bound{i}_{k}"] = np.array(bound, dtype=np.float32)
                names.append(f"bound{i}_{k}")
            nodes.append(helper.make_node("Clip", [f"c{i}"] + names, [value], name=f"act{i}"))
        elif op == "SiLU":
            nodes.append(helper.make_node("Sigmoid", [f"c{i}"], [f"s{i}"], name=f"sig{i}"))
            nodes.append(helper.make_node("Mul", [f"c{i}", f"s{i}"], [value], name=f"act{i}"))
        else:
            nodes.append(helper.make_node(op, [f"c{i}"], [value], name=f"act{i}", **attrs))
    graph = helper.make_graph(
        nodes, "conv_act", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 11, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 11, 9])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, producer_name="kiln-tests",
                              opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


def conv_act_reference(p, x):
    y = x.astype(np.float64)
    for i, (_, _, act) in enumerate(CONV_ACTIVATIONS):
        y = act(conv2d(y, *f64(p[f"w{i}"], p[f"b{i}"]), (1, 1, 1, 1), (1, 1), group=2))
    return y

def write(folder, name, array):
    np.save(os.path.join(folder, name), array.astype(np.float32))


def main(out):
    rng = np.random.default_rng(SEED)

    params = mlp_params(rng)
    folder = os.path.join(out, "mlp")
    save(mlp_model(params, 4), folder)
    x = rng.uniform(-2, 2, (4, 16)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", mlp_reference(params, x))

    folder = os.path.join(out, "mlp_dyn")
    save(mlp_model(params, "batch"), folder)
    for batch in BATCHES:
        x = rng.uniform(-2, 2, (batch, 16)).astype(np.float32)
        write(folder, f"x_b{batch}.npy", x)
        write(folder, f"y_b{batch}.npy", mlp_reference(params, x))

    folder = os.path.join(out, "control")
    save(control_model(), folder)
    for case, x in (("pos", rng.uniform(-1, 5, 7)), ("neg", np.array([-4.5, 2.5, -3.25, 1.2, -0.5])),
                    ("zero", -rng.uniform(0.5, 1, 6))):
        y, z = control_reference(x.astype(np.float32))
        write(folder, f"x_{case}.npy", x)
        write(folder, f"y_{case}.npy", y)
        write(folder, f"z_{case}.npy", z)

    folder = os.path.join(out, "computed")
    save(computed_model(), folder)
    for case, (s, e, k, r) in (("set1", ([3, -1], [2, 3], 5, [10, -2, -3])),
                               ("set2", ([2, 6], [4, 1], 0, [1, 4, 1]))):
        os.makedirs(os.path.join(folder, case), exist_ok=True)
        inputs = {"x": rng.uniform(-1, 1, 12), "s": np.array(s), "e": np.array(e),
                  "k": np.array(k), "r": np.array(r)}
        for name, value in inputs.items():
            write(folder, f"{case}/{name}.npy", value)
        outputs = computed_reference(*(inputs[n].astype(np.float32) for n in "xsekr"))
        for name, value in outputs.items():
            path = os.path.join(folder, case, name + ".npy")
            np.save(path, value if name in ("top_i", "ranged") else value.astype(np.float32))

    params = cnn_params(rng)
    folder = os.path.join(out, "cnn")
    save(cnn_model(params, 2), folder)
    x = rng.uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", cnn_reference(params, x))

    params = winograd_params(rng)
    folder = os.path.join(out, "winograd")
    save(winograd_model(params), folder)
    x = rng.uniform(-1, 1, (2, 32, 28, 30)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", winograd_reference(params, x))

    params = atrous_params(rng)
    folder = os.path.join(out, "atrous")
    save(atrous_model(params), folder)
    x = rng.uniform(-1, 1, (2, 16, 6, 14)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", atrous_reference(params, x))

    params = conv_bn_params(rng, MOBILENET_CONVS)
    folder = os.path.join(out, "mobilenet")
    save(mobilenet_model(params, 2, pool=False), folder)
    x = rng.uniform(-1, 1, (2, 3, 15, 13)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", mobilenet_reference(params, x, pool=False))
    folder = os.path.join(out, "mobilenet_dyn")
    save(mobilenet_model(params, "batch", pool=True), folder)
    for batch in (1, 2):
        x = rng.uniform(-1, 1, (batch, 3, 15, 13)).astype(np.float32)
        write(folder, f"x_b{batch}.npy", x)
        write(folder, f"y_b{batch}.npy", mobilenet_reference(params, x, pool=True))

    params = squeeze_params(np.random.default_rng(SEED + 2))
    folder = os.path.join(out, "squeeze")
    save(squeeze_model(params, 2), folder)
    x_rng = np.random.default_rng(SEED + 3)
    x = x_rng.uniform(-1, 1, (2, 3, 17, 19)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", squeeze_reference(params, x))
    folder = os.path.join(out, "squeeze_dyn")
    save(squeeze_model(params, "batch"), folder)
    for batch in (1, 3):
        x = x_rng.uniform(-1, 1, (batch, 3, 17, 19)).astype(np.float32)
        write(folder, f"x_b{batch}.npy", x)
        write(folder, f"y_b{batch}.npy", squeeze_reference(params, x))

    params = conv_bn_params(np.random.default_rng(SEED + 6), INVERTED_CONVS)
    folder = os.path.join(out, "inverted")
    save(inverted_model(params), folder)
    x = np.random.default_rng(SEED + 7).uniform(-1, 1, (2, 16, 45, 39)).astype(np.float32)
    # NaN stays NaN through every Clip, an infinity is clipped (the ReLU6s take the one-instruction
    # form for a bound that is a number); a corner, an edge column and inner pixels.
    for index, value in (((0, 3, 10, 7), np.nan), ((0, 15, 44, 0), np.nan),
                         ((1, 5, 30, 20), np.inf), ((1, 9, 2, 38), -np.inf)):
        x[index] = value
    write(folder, "x.npy", x)
    write(folder, "y.npy", inverted_reference(params, x))

    params = se_params(np.random.default_rng(SEED + 4))
    folder = os.path.join(out, "se")
    save(se_model(params), folder)
    x = np.random.default_rng(SEED + 5).uniform(-1, 1, (2, 3, 15, 13)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", se_reference(params, x))
    folder = os.path.join(out, "se_b1")
    save(se_model(params, 1, (31, 27)), folder)
    x = np.random.default_rng(SEED + 8).uniform(-1, 1, (1, 3, 31, 27)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", se_reference(params, x))

    params = conv_act_params(np.random.default_rng(SEED + 9))
    folder = os.path.join(out, "conv_act")
    # Opset 20 (Gelu): newer than Debian's onnx checker knows, so saved unchecked.
    os.makedirs(folder, exist_ok=True)
    onnx.save_model(conv_act_model(params), os.path.join(folder, "model.onnx"))
    x = np.random.default_rng(SEED + 10).uniform(-1, 1, (2, 4, 11, 9)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", conv_act_reference(params, x))

    rng = np.random.default_rng(SEED + 1)
    params = {"w1": (0.3 * rng.standard_normal((24, 40))).astype(np.float32),
              "b1": (0.1 * rng.standard_normal(40)).astype(np.float32),
              "w2": (0.2 * rng.standard_normal((40, 24))).astype(np.float32),
              "w3": (0.3 * rng.standard_normal((24, 10))).astype(np.float32)}
    folder = os.path.join(out, "residual_mlp")
    save(residual_mlp_model(params), folder)
    x = rng.uniform(-2, 2, (5, 24)).astype(np.float32)
    write(folder, "x.npy", x)
    write(folder, "y.npy", residual_mlp_reference(params, x))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
