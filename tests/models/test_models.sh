#!/usr/bin/env bash
# End-to-end models against numpy: make_models.py writes an MLP (MatMul/Add/Relu, Gemm, Softmax),
# the same MLP with a dynamic batch (run at batch 1, 3, 8 and 0), an MLP whose GEMM adds a residual
# in place, a small CNN (Conv with
# bias, pads and stride, BatchNormalization, Relu, MaxPool, Conv, GlobalAveragePool, Flatten,
# Gemm), a residual block whose 3x3 convolutions run as the Winograd template (NCHW and
# channels-last; checked at atol 1e-4), MobileNetV2's and ResNet's blocks channels-last (static and dynamic batch),
# SqueezeNet's Fire module between MaxPools with ceil_mode (channels-last), MobileNetV2's
# inverted residual blocks with the expansions fused into the depthwise convolutions, a chain of
# grouped convolutions with every activation oneDNN applies as their post-ops, a model with data-dependent If and Loop (nested), and one whose shapes are computed from
# data (Reshape, Expand, Tile, ConstantOfShape, TopK, Range; with a bad shape: a clear error),
# with seeded weights, inputs and expected outputs computed in numpy; and a transformer block
# at opset 20 with a model-local function (make_transformer.py), a causal attention block at
# awkward sizes (make_attention.py), and float8 / int4 casts and a
# float8 quantization inside one graph (make_small_types.py). Each is compiled and run
# with `kiln run` into a fresh code cache, and compare.py checks the output's dtype, shape and
# values (float32 tolerance rtol 1e-4, atol 1e-5: |actual - expected| <= 1e-5 + 1e-4 * |expected|).
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=/usr/bin/python3  # Debian's python3 with python3-onnx and numpy, not a pyenv one
CACHE="$SCRATCH/cache"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$PYTHON" "$HERE/make_models.py" "$SCRATCH/models" || fail "make_models.py failed"

# run_kiln NAME MODEL INPUT [ARG...]: `kiln run` of MODEL on x=INPUT with the extra arguments,
# its outputs, stdout and stderr in $SCRATCH/out/NAME, which it sets `out` to; fails when the
# run does. An environment assignment before it (KILN_LOG=...) reaches kiln.
run_kiln() {
  local name="$1" model="$2" input="$3"
  shift 3
  out="$SCRATCH/out/$name"
  mkdir -p "$out"
  echo "== $name"
  "$KILN" run "$model" --input "x=$input" --output-dir "$out" --cache-dir "$CACHE" "$@" \
    >"$out/stdout" 2>"$out/stderr" || { cat "$out/stderr"; fail "$name: kiln run failed"; }
}

# run_case NAME MODEL INPUT EXPECTED: runs kiln on one input and compares output y.
run_case() {
  local name="$1" model="$2" input="$3" expected="$4"
  local out
  run_kiln "$name" "$model" "$input"
  cat "$out/stdout" "$out/stderr"
  [ -f "$out/y.npy" ] || fail "$name: no output y.npy"
  "$PYTHON" "$HERE/compare.py" "$expected" "$out/y.npy" || fail "$name: output differs from numpy"
}

M="$SCRATCH/models"
run_case mlp "$M/mlp/model.onnx" "$M/mlp/x.npy" "$M/mlp/y.npy"
run_case cnn "$M/cnn/model.onnx" "$M/cnn/x.npy" "$M/cnn/y.npy"
# The second GEMM's epilogue adds the residual r, read where it stores: the call writes y into
# r's storage.
KILN_LOG=memory run_kiln residual_mlp "$M/residual_mlp/model.onnx" "$M/residual_mlp/x.npy" \
  --autotune off
grep -q "(gemm call) reuses .* in place: its epilogue reads it" "$out/stderr" ||
  { cat "$out/stderr"; fail "residual_mlp: the residual GEMM did not write in place"; }
"$PYTHON" "$HERE/compare.py" "$M/residual_mlp/y.npy" "$out/y.npy" ||
  fail "residual_mlp: output differs from numpy"
# Both convolutions of the residual block run as the Winograd template (the heuristic at 28 x 28 x
# 32), the second with the residual Add and Relu fused; atol 1e-4 (compare.py says why).
KILN_LOG=autotune run_kiln winograd "$M/winograd/model.onnx" "$M/winograd/x.npy" --autotune off
[ "$(grep -c "runs as 'winograd" "$out/stderr")" -eq 2 ] ||
  { cat "$out/stderr"; fail "winograd: the two convolutions did not run as Winograd"; }
"$PYTHON" "$HERE/compare.py" "$M/winograd/y.npy" "$out/y.npy" 1e-4 ||
  fail "winograd: output differs from numpy"
# The same block channels-last (--conv-layout nhwc): both convolutions run as the channels-last
# Winograd template, reading and writing [N, H, W, C] buffers, the residual Add and Relu fused.
echo "== winograd_nhwc"
out="$SCRATCH/out/winograd_nhwc"
mkdir -p "$out"
KILN_LOG=autotune "$KILN" compile "$M/winograd/model.onnx" -o "$out/model.so" \
  --cache-dir "$CACHE" --autotune off --conv-layout nhwc >"$out/stdout" 2>"$out/stderr" ||
  { cat "$out/stderr"; fail "winograd_nhwc: kiln compile failed"; }
# Each convolution is selected once per variant of the library (x86-64-v4 and -v3).
[ "$(grep -c "nhwc) runs as 'winograd-nhwc" "$out/stderr")" -eq 4 ] ||
  { cat "$out/stderr"; fail "winograd_nhwc: the two convolutions did not run as Winograd"; }
"$KILN" run "$out/model.so" --input "x=$M/winograd/x.npy" --output-dir "$out" >>"$out/stdout" \
  2>>"$out/stderr" || { cat "$out/stderr"; fail "winograd_nhwc: kiln run failed"; }
"$PYTHON" "$HERE/compare.py" "$M/winograd/y.npy" "$out/y.npy" 1e-4 ||
  fail "winograd_nhwc: output differs from numpy"
# Dilated convolutions whose outer taps read only padding run on the taps that read x: 3x3 cut
# to 1x1 (then the pointwise template), 2x3 and 1x3, the BatchNormalization folded into the cut
# weight.
KILN_LOG=fusion,autotune run_kiln atrous "$M/atrous/model.onnx" "$M/atrous/x.npy" --autotune off
grep -q "3x3 convolution kernel cut to the 1x1 taps" "$out/stderr" &&
  grep -q "3x3 convolution kernel cut to the 2x3 taps" "$out/stderr" &&
  grep -q "3x3 convolution kernel cut to the 1x3 taps" "$out/stderr" &&
  grep -q "16x1x1, s1, nhwc) runs as 'pointwise-nhwc" "$out/stderr" ||
  { cat "$out/stderr"; fail "atrous: the convolutions were not cut to their live taps"; }
"$PYTHON" "$HERE/compare.py" "$M/atrous/y.npy" "$out/y.npy" ||
  fail "atrous: output differs from numpy"
# MobileNetV2's blocks at awkward sizes run channels-last (the model has depthwise layers): the
# 1x1, depthwise and stem convolutions as the channels-last templates, the grouped one of 4
# channels a group as the direct template (groups merged in pairs), the one of 7 on oneDNN
# channels-last; with a dynamic batch they run on oneDNN's nhwc convolutions.
KILN_LOG=autotune run_kiln mobilenet "$M/mobilenet/model.onnx" "$M/mobilenet/x.npy" \
  --autotune off --dump "$SCRATCH/out/mobilenet/dump"
[ "$(grep -c "nhwc) runs as 'pointwise-nhwc" "$out/stderr")" -eq 4 ] &&
  [ "$(grep -c "nhwc) runs as 'depthwise-nhwc" "$out/stderr")" -eq 2 ] &&
  [ "$(grep -c "nhwc) runs as 'direct-nhwc" "$out/stderr")" -eq 2 ] &&
  grep -q "g10, nhwc) runs as 'direct-nhwc" "$out/stderr" &&
  grep -q "extern float32 \[2, 8, 7, 21\] .*# from grouped_bn" "$out/dump/1_ir.txt" ||
  { cat "$out/stderr"; fail "mobilenet: the 1x1, depthwise and grouped convolutions did not run channels-last"; }
# Their bias, Clip and residual epilogues have a vector form: each 1x1 kernel applies it in
# registers.
[ "$(grep -l "kv_load(kiln_bias + n0)" "$out"/dump/5_*.cpp | wc -l)" -eq 4 ] ||
  fail "mobilenet: the 1x1 convolutions' epilogues were not applied in registers"
"$PYTHON" "$HERE/compare.py" "$M/mobilenet/y.npy" "$out/y.npy" ||
  fail "mobilenet: output differs from numpy"
# SqueezeNet's MaxPools with ceil_mode, channels-last: each is one pointwise kernel over the
# output, its window's taps unrolled (a tap past the input reads the nearest element of the same
# window), not a reduction loop over the window inside every channel. The Fire module's Concat,
# with the BatchNormalization after it, runs one loop per part along the channels.
run_kiln squeeze "$M/squeeze/model.onnx" "$M/squeeze/x.npy" --dump "$SCRATCH/out/squeeze/dump"
[ "$(grep -A1 "# from pool[12](MaxPool)" "$out/dump/1_ir.txt" | grep "^  loops \[" | grep -vc "reduce")" -eq 2 ] ||
  { grep -A1 "(MaxPool)" "$out/dump/1_ir.txt"; fail "squeeze: the MaxPools did not run channels-last with their taps unrolled"; }
grep -q "for (int64_t x[0-9]* = 11; x[0-9]* < 24; ++x[0-9]*)" "$out"/dump/5_kernels*.cpp ||
  fail "squeeze: the Concat did not run one loop per part"
"$PYTHON" "$HERE/compare.py" "$M/squeeze/y.npy" "$out/y.npy" || fail "squeeze: output differs from numpy"
# EfficientNet's squeeze-excitation and head: each ReduceMean over H and W (keepdims: outputs
# [N, C, 1, 1]) runs blocks of channels across C (kiln_block), not a loop per channel striding
# by C; the head's SiLU, inside its mean's loop, calls the vector-callable exp.
run_kiln se "$M/se/model.onnx" "$M/se/x.npy" --dump "$SCRATCH/out/se/dump"
read -r means across < <(awk '/^extern "C" void cpp_fused_/ { k++; mean[k] = /reduce_mean/ }
  /kiln_block_lo = kiln_block/ { if (mean[k]) blocked[k] = 1 }
  END { n = 0; b = 0; for (i in mean) if (mean[i]) { n++; b += blocked[i] } print n, b }' \
  "$out"/dump/5_kernels*.cpp)
[ "$means" -eq 2 ] && [ "$across" -eq 2 ] ||
  fail "se: $across of $means ReduceMean kernels (2 expected) run across channels"
grep -q "kiln_simd_exp(" "$out"/dump/5_kernels*.cpp || fail "se: the head's SiLU calls libm's exp"
"$PYTHON" "$HERE/compare.py" "$M/se/y.npy" "$out/y.npy" || fail "se: output differs from numpy"
# At batch 1 the squeeze-excitation gate's multiply is folded into the projection after it: the
# projection scales its weight by the gate in its call, and no kernel multiplies the depthwise
# output.
KILN_LOG=fusion run_kiln se_b1 "$M/se_b1/model.onnx" "$M/se_b1/x.npy" --dump "$SCRATCH/out/se_b1/dump"
kernels() { grep -o "[0-9]* kernels" "$1" | cut -d' ' -f1; }
[ "$(kernels "$out/stdout")" -eq "$(($(kernels "$SCRATCH/out/se/stdout") - 1))" ] &&
  grep -q "fused into convolution .* as its prologue" "$out/stderr" &&
  grep -q "scaled per channel by" "$out/dump/5_wrapper.cpp" ||
  { cat "$out/stderr"; fail "se_b1: the gate's multiply was not folded into the projection"; }
"$PYTHON" "$HERE/compare.py" "$M/se_b1/y.npy" "$out/y.npy" || fail "se_b1: output differs from numpy"
# MobileNetV2's inverted residual blocks with expanded activations of 1.3 MiB: each expansion
# (1x1, its BatchNormalization folded, Clip) is fused into the depthwise convolution after it (at
# stride 1 and at stride 2), one call that never stores the expanded activation. Its input holds
# NaNs and infinities: a NaN stays NaN through each Clip, which the expansion's GEMM applies with
# one max and one min per vector (kv_max_num, kv_min_num: the bounds are numbers).
KILN_LOG=fusion run_kiln inverted "$M/inverted/model.onnx" "$M/inverted/x.npy" \
  --dump "$SCRATCH/out/inverted/dump"
[ "$(grep -c "fused into .* as its prologue" "$out/stderr")" -eq 2 ] &&
  [ "$(grep -c ", into conv(2x96x45x39, 96x1x3x3, s[12], p1, g96, nhwc)" "$out/dump/5_wrapper.cpp")" -eq 2 ] ||
  { cat "$out/stderr"; fail "inverted: the expansions were not fused into the depthwise convolutions"; }
grep -rq "kv_max_num(" "$out/dump" && grep -rq "kv_min_num(" "$out/dump" ||
  fail "inverted: the expansions' Clip is not the vector max and min of a number bound"
"$PYTHON" "$HERE/compare.py" "$M/inverted/y.npy" "$out/y.npy" ||
  fail "inverted: output differs from numpy"
# A chain of grouped convolutions (oneDNN library calls), each followed by an activation: every
# one oneDNN has (Relu, both Clips, Sigmoid, Tanh, LeakyRelu, Elu, both Gelus, SiLU) is its
# convolution's post-op, so no kernel of its own; HardSigmoid is not.
run_kiln conv_act "$M/conv_act/model.onnx" "$M/conv_act/x.npy" --dump "$SCRATCH/out/conv_act/dump"
[ "$(grep -c "kiln_rt::ConvActivation{" "$out/dump/5_wrapper.cpp")" -eq 10 ] &&
  grep -q "cpp_fused_hard_sigmoid" "$out/dump/5_wrapper.cpp" ||
  { grep "state.conv" "$out/dump/5_wrapper.cpp"; fail "conv_act: the activations were not the convolutions' post-ops"; }
"$PYTHON" "$HERE/compare.py" "$M/conv_act/y.npy" "$out/y.npy" ||
  fail "conv_act: output differs from numpy"
for b in 1 3; do
  run_case "squeeze_dyn_b$b" "$M/squeeze_dyn/model.onnx" "$M/squeeze_dyn/x_b$b.npy" \
    "$M/squeeze_dyn/y_b$b.npy"
done
for b in 1 2; do
  run_case "mobilenet_dyn_b$b" "$M/mobilenet_dyn/model.onnx" "$M/mobilenet_dyn/x_b$b.npy" \
    "$M/mobilenet_dyn/y_b$b.npy"
done
# `kiln compile --threads N` chooses the algorithms for runs on N threads whatever the compiling
# machine has: the pointwise convolutions split their rows into other blocks at 1 and 4 threads,
# and the library compiled for 4 threads gives numpy's output when run on this machine's threads.
for t in 1 4; do
  echo "== mobilenet_threads$t"
  out="$SCRATCH/out/mobilenet_threads$t"
  mkdir -p "$out"
  KILN_LOG=autotune "$KILN" compile "$M/mobilenet/model.onnx" -o "$out/model.so" --threads "$t" \
    --cache-dir "$CACHE" --autotune off >"$out/stdout" 2>"$out/stderr" ||
    { cat "$out/stderr"; fail "mobilenet_threads$t: kiln compile failed"; }
  grep -q "threads: algorithms chosen for runs on $t thread" "$out/stdout" ||
    { cat "$out/stdout"; fail "mobilenet_threads$t: compile did not report $t threads"; }
  grep -o "runs as 'pointwise-nhwc [^']*'" "$out/stderr" >"$out/pointwise"
  [ "$(wc -l <"$out/pointwise")" -eq 8 ] ||
    { cat "$out/stderr"; fail "mobilenet_threads$t: expected 8 pointwise selections"; }
done
! cmp -s "$SCRATCH/out/mobilenet_threads1/pointwise" "$SCRATCH/out/mobilenet_threads4/pointwise" ||
  fail "mobilenet_threads: --threads 1 and --threads 4 chose the same pointwise blocks"
"$KILN" run "$SCRATCH/out/mobilenet_threads4/model.so" --input "x=$M/mobilenet/x.npy" \
  --output-dir "$SCRATCH/out/mobilenet_threads4" >/dev/null ||
  fail "mobilenet_threads4: kiln run failed"
"$PYTHON" "$HERE/compare.py" "$M/mobilenet/y.npy" "$SCRATCH/out/mobilenet_threads4/y.npy" ||
  fail "mobilenet_threads4: output differs from numpy"
# ResNet's blocks at awkward sizes (make_resnet.py) run channels-last end to end: at a static
# batch of 2, every convolution is a channels-last template call (the two stride-1 1x1 ones as
# the pointwise template, the other seven as the direct one), with MaxPool, the residual Adds and
# GlobalAveragePool between them. The three convolutions with a residual Add in their epilogue
# (a 3x3 and a 1x1 stride-2 shortcut's sum on the direct template, a 1x1 on the pointwise one)
# write their output into the residual's storage.
"$PYTHON" "$HERE/make_resnet.py" "$M/resnet" || fail "make_resnet.py failed"
KILN_LOG=autotune,memory run_kiln resnet_b2 "$M/resnet/model_b2.onnx" "$M/resnet/x_b2.npy" \
  --autotune off --dump "$SCRATCH/out/resnet_b2/dump"
[ "$(grep -c "nhwc) runs as 'pointwise-nhwc" "$out/stderr")" -eq 2 ] &&
  [ "$(grep -c "nhwc) runs as 'direct-nhwc" "$out/stderr")" -eq 7 ] ||
  { cat "$out/stderr"; fail "resnet_b2: the nine convolutions did not run channels-last"; }
[ "$(grep -c "(conv call) reuses .* in place: its epilogue reads it" "$out/stderr")" -eq 3 ] ||
  { cat "$out/stderr"; fail "resnet_b2: the residual convolutions did not write in place"; }
for name in y z; do
  "$PYTHON" "$HERE/compare.py" "$M/resnet/${name}_b2.npy" "$out/$name.npy" ||
    fail "resnet_b2: output $name differs from numpy"
done
for b in 1 3 8 0; do
  run_case "mlp_dyn_b$b" "$M/mlp_dyn/model.onnx" "$M/mlp_dyn/x_b$b.npy" "$M/mlp_dyn/y_b$b.npy"
done

# Control flow decided by the data (If, then a Loop with a nested If): one compile serves the
# three inputs, whose If takes either branch and whose Loop runs 4, 2 and 0 times.
for c in pos neg zero; do
  run_case "control_$c" "$M/control/model.onnx" "$M/control/x_$c.npy" "$M/control/y_$c.npy"
  "$PYTHON" "$HERE/compare.py" "$M/control/z_$c.npy" "$SCRATCH/out/control_$c/z.npy" ||
    fail "control_$c: output z differs from numpy"
done
for c in neg zero; do
  grep -q "from the code cache" "$SCRATCH/out/control_$c/stdout" ||
    fail "control_$c: expected the control-flow model to come from the code cache"
done

# Shapes computed from data (Reshape, Expand, Tile, ConstantOfShape, TopK's k, Range): one
# compile serves both input sets, whose shapes differ.
for set in set1 set2; do
  out="$SCRATCH/out/computed_$set"
  mkdir -p "$out"
  echo "== computed_$set"
  args=()
  for name in x s e k r; do args+=(--input "$name=$M/computed/$set/$name.npy"); done
  "$KILN" run "$M/computed/model.onnx" "${args[@]}" --output-dir "$out" --cache-dir "$CACHE" \
    >"$out/stdout" 2>"$out/stderr" || { cat "$out/stderr"; fail "computed_$set: kiln run failed"; }
  for name in reshaped expanded tiled zeros top_v top_i ranged; do
    "$PYTHON" "$HERE/compare.py" "$M/computed/$set/$name.npy" "$out/$name.npy" ||
      fail "computed_$set: output $name differs from numpy"
  done
done
grep -q "from the code cache" "$SCRATCH/out/computed_set2/stdout" ||
  fail "computed_set2: expected the model with computed shapes to come from the code cache"
# A computed shape that does not fit is a clear run-time error (exit 2) naming the node.
"$PYTHON" -c "import numpy as np, sys; np.save(sys.argv[1], np.array([5, -1], np.float32))" \
  "$SCRATCH/bad_s.npy" || fail "could not write bad_s.npy"
args=()
for name in x e k r; do args+=(--input "$name=$M/computed/set1/$name.npy"); done
"$KILN" run "$M/computed/model.onnx" "${args[@]}" --input "s=$SCRATCH/bad_s.npy" \
  --output-dir "$SCRATCH/out/bad" --cache-dir "$CACHE" >/dev/null 2>"$SCRATCH/bad.stderr"
status=$?
cat "$SCRATCH/bad.stderr"
[ "$status" -eq 2 ] || fail "a bad computed shape: expected exit status 2, got $status"
grep -q "(Reshape).*cannot infer the -1" "$SCRATCH/bad.stderr" ||
  fail "a bad computed shape: expected an error naming the Reshape"

# A transformer block written at opset 20 (make_transformer.py): LayerNormalization, Split-18
# with num_outputs, Gelu-20, ReduceMean-18 and ReduceMax-18 with axes inputs, and a model-local
# function with an attribute reference and a default, inlined at import.
"$PYTHON" "$HERE/make_transformer.py" "$M/transformer" || fail "make_transformer.py failed"
run_case transformer "$M/transformer/model.onnx" "$M/transformer/x.npy" "$M/transformer/y.npy"
"$PYTHON" "$HERE/compare.py" "$M/transformer/m.npy" "$SCRATCH/out/transformer/m.npy" ||
  fail "transformer: output m differs from numpy"

# A causal attention block at awkward sizes (make_attention.py: 3 heads of 20, sequence 67,
# dynamic batch): the small batched products of Q K^T and P V, the Where mask in a vector loop,
# tanh/erf/exp/log/sigmoid in GEMM epilogues and a head tied through Transpose. One compile
# serves batches 2, 1 and 0. model_separate.onnx has Q, K and V as three projections, which
# must run as one product (the fusion log says so).
"$PYTHON" "$HERE/make_attention.py" "$M/attention" || fail "make_attention.py failed"
for model in model model_separate; do
  for b in 2 1 0; do
    out="$SCRATCH/out/attention_${model}_b$b"
    mkdir -p "$out"
    echo "== attention $model b$b"
    KILN_LOG=fusion "$KILN" run "$M/attention/$model.onnx" --input "x=$M/attention/x_b$b.npy" \
      --output-dir "$out" --cache-dir "$CACHE" >"$out/stdout" 2>"$out/stderr" ||
      { cat "$out/stderr"; fail "attention $model b$b: kiln run failed"; }
    for name in y z; do
      "$PYTHON" "$HERE/compare.py" "$M/attention/${name}_b$b.npy" "$out/$name.npy" ||
        fail "attention $model b$b: output $name differs from numpy"
    done
    if [ "$model" = model_separate ]; then
      grep -q "3 projections of one input as one product" "$out/stderr" ||
        { cat "$out/stderr"; fail "attention $model b$b: Q, K and V did not run as one product"; }
    fi
  done
done

# Attention in the forms lower/attention_fusion.h fuses into one kernel (make_fused_attention.py:
# a Div scale, a causal Where mask, a padding mask whose all-hidden rows give NaN, an additive
# mask; 2 heads of 20 and of 12), with batch and sequence dynamic: one compile serves sequences
# of 67, 130, 5 and 0. The log must show a, b, c and d fused and e (its mask's shape not
# provably the scores') not; NaNs must sit where numpy's are.
"$PYTHON" "$HERE/make_fused_attention.py" "$M/fused_attention" ||
  fail "make_fused_attention.py failed"
for c in s67 s130 s5 s0; do
  out="$SCRATCH/out/fused_attention_$c"
  mkdir -p "$out"
  echo "== fused_attention_$c"
  inputs=()
  for name in q k v w causal pad addmask; do
    inputs+=(--input "$name=$M/fused_attention/${c}_$name.npy")
  done
  KILN_LOG=fusion "$KILN" run "$M/fused_attention/model.onnx" "${inputs[@]}" --output-dir "$out" \
    --cache-dir "$CACHE" >"$out/stdout" 2>"$out/stderr" ||
    { cat "$out/stderr"; fail "fused_attention_$c: kiln run failed"; }
  fused="$(sed -n "s/.*node '\(.\)' (MatMul): attention fused into one kernel/\1/p" "$out/stderr" |
    sort | tr -d '\n')"
  [ "$fused" = abcd ] || fail "fused_attention_$c: fused '$fused', expected abcd"
  for name in a b c d e; do
    "$PYTHON" "$HERE/make_fused_attention.py" --check "$M/fused_attention/${c}_$name.npy" \
      "$out/$name.npy" || fail "fused_attention_$c: output $name differs from numpy"
  done
done

# Casts and a quantization through float8e4m3fn and int4 inside one graph (make_small_types.py):
# each consumer sees the rounded (or wrapped) value, against a reference that enumerates float8.
"$PYTHON" "$HERE/make_small_types.py" "$M/small_types" || fail "make_small_types.py failed"
run_case small_types "$M/small_types/model.onnx" "$M/small_types/x.npy" "$M/small_types/y.npy"

# The dynamic-batch model is one compile: batches 3, 8 and 0 reuse the library built for batch 1.
for b in 3 8 0; do
  grep -q "from the code cache" "$SCRATCH/out/mlp_dyn_b$b/stdout" ||
    fail "mlp_dyn_b$b: expected the dynamic-batch model to come from the code cache"
done

# The comparison can fail: the batch-3 output against batch 8's expected values (a shape
# mismatch) and against the MLP's expected values perturbed beyond the tolerance.
"$PYTHON" "$HERE/compare.py" "$M/mlp_dyn/y_b8.npy" "$SCRATCH/out/mlp_dyn_b3/y.npy" >/dev/null &&
  fail "compare.py accepted a shape mismatch"
"$PYTHON" -c "import numpy as np, sys; y = np.load(sys.argv[1]); y[1, 2] += 1e-3; \
np.save(sys.argv[2], y)" "$M/mlp/y.npy" "$SCRATCH/perturbed.npy" || fail "could not perturb"
"$PYTHON" "$HERE/compare.py" "$SCRATCH/perturbed.npy" "$SCRATCH/out/mlp/y.npy" >/dev/null &&
  fail "compare.py accepted a value off by 1e-3"
echo ok
