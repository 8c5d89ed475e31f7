#pragma once
/// Library calls: the typed parameters of every kind of extern call (a BLAS or oneDNN product, a
/// GEMM or convolution choice, TopK, an RNN, NMS, control flow, ...). Each kind is one struct
/// below, listed once in the LibraryCall variant; that list is the registry. A call's users
/// dispatch on the alternative with std::visit over an overload set that names every kind, so a
/// kind added here fails to compile wherever it is not handled: the reference interpreter
/// (ir/interpreter_extern.cpp), the C++ backend's emitter (codegen/cpp/cpp_wrapper_ops.cpp) and
/// any later backend's. No kind or parameter travels as a string: a misspelt parameter is a
/// compile error, and an autotune choice is the choice object itself, not its name.
///
/// Strings that remain are data, not keys: `what` texts are the node descriptions run-time
/// errors quote.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "autotune/choice.h"
#include "autotune/conv_choice.h"

namespace kiln::ir {

struct Subgraph;

/// The activation a matrix product applies to each element last (a library epilogue: the CUDA
/// backend fuses a Relu or a tanh-form Gelu that follows it into its cuBLASLt call).
enum class MatMulActivation : uint8_t { kNone, kRelu, kGeluTanh };

/// Batched matrix product through BLAS on the CPU, cuBLASLt on CUDA (any dtype BLAS or its
/// fallback handles): out = act(alpha * A @ B + beta * C), C optional (input 2), broadcast over
/// batch dims. On CUDA, C is only ever a bias fused by the backend (a [N] vector broadcast over
/// the rows, beta 1), and `activation` is set only there.
struct MatMulCall {
  double alpha = 1.0;
  double beta = 1.0;
  MatMulActivation activation = MatMulActivation::kNone;
  std::string name() const { return "matmul"; }
};

/// A float32 GEMM against a constant weight through an autotune choice (the C++ template or a
/// library): out[..., N] = A[..., K] @ B[K, N], input 1 holding B as choice->prepare() left it.
/// An epilogue may be fused into it (ExternCall::product).
struct GemmCall {
  autotune::GemmChoicePtr choice;
  int64_t n = 0;
  int64_t k = 0;
  std::string name() const { return "gemm"; }
};

/// The activation a convolution on CUDA applies last, in place of its Relu (codegen/cuda/
/// cuda_conv.h fuses it; each is a pointwise mode of cuDNN's graph). Their numbers are those of
/// kiln_rt_cuda.h's kiln_cuda::ConvActivation.
enum class ConvActivation : uint8_t {
  kNone = 0,
  kRelu = 1,       // max(x, 0)
  kSigmoid = 2,    // 1 / (1 + exp(-x))
  kTanh = 3,       // tanh(x)
  kClip = 4,       // min(max(x, alpha), beta), alpha <= beta (Relu6: 0, 6)
  kLeakyRelu = 5,  // x < 0 ? alpha x : x
  kElu = 6,        // x < 0 ? alpha (exp(x) - 1) : x
  kGelu = 7,       // x Phi(x) = x / 2 (1 + erf(x / sqrt 2))
  kGeluTanh = 8,   // x / 2 (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
  kSwish = 9,      // x sigmoid(alpha x) (SiLU: alpha 1)
};

/// An N-D convolution: inputs X, W and an optional bias. Without a choice it runs through
/// oneDNN (float32, with its activation fused as a post-op) or the direct loop (other
/// dtypes); with one (lower/conv_select.h: the C++ template or im2col + OpenBLAS on a 2-D float32
/// problem) input 1 is the weight and bias as the choice prepared them, and an epilogue may be
/// fused into it (ExternCall::product).
struct ConvCall {
  std::vector<int64_t> strides;
  std::vector<int64_t> pads;  // all begins, then all ends
  std::vector<int64_t> dilations;
  int64_t group = 1;
  int relu_post_ops = 0;
  /// Channels-last (2-D only): X is [N, H, W, C] and the output [N, OH, OW, M] (lower/nn.cpp).
  bool channels_last = false;
  /// W is [M, KH, KW, C / group] (packed so at compile time for cuDNN's channels-last
  /// convolutions, lower/nn.cpp), not [M, C / group, KH, KW].
  bool weight_channels_last = false;
  /// On CUDA (codegen/cuda/cuda_conv.h fuses it): input 3 is a residual of the output's layout,
  /// added after the bias and before the `relu_post_ops` Relus.
  bool residual = false;
  /// An activation other than Relu after the bias and residual (relu_post_ops 0 then), with its
  /// parameters (ConvActivation says which it uses): a oneDNN post-op on the CPU, part of the
  /// cuDNN graph on CUDA.
  ConvActivation activation = ConvActivation::kNone;
  double alpha = 0, beta = 0;
  autotune::ConvChoicePtr choice;
  /// The activation the call applies last: Relu where relu_post_ops is set, else `activation`.
  ConvActivation applied_activation() const {
    return relu_post_ops > 0 ? ConvActivation::kRelu : activation;
  }
  std::string name() const { return "conv"; }
};

/// Scaled dot-product attention as one fused kernel (lower/attention_fusion.cpp recognizes the
/// pattern MatMul(Q, K^T) [* or / scale] [mask] Softmax(last axis) MatMul(., V) in float32):
///   out[..., i, :] = sum_j softmax_j(s[..., i, j]) V[..., j, :],  s = mask(scale * Q K^T)
/// with the mask one of `mask`'s kinds. Inputs: Q [..., Lq, D], K^T [..., D, Lk], V [..., Lk, Dv]
/// (views broadcast to the output's batch dims, strides of 0 for broadcast ones) and, with a
/// mask, the mask as a view broadcast to [..., Lq, Lk]. The output is contiguous [..., Lq, Dv].
/// Rows whose every score is -inf give NaN, as the unfused Softmax does.
enum class AttentionMask : uint8_t {
  kNone,
  kKeepWhereTrue,   // bool: s where mask, else `fill` (Where(mask, s, fill))
  kKeepWhereFalse,  // bool: `fill` where mask, else s (Where(mask, fill, s))
  kAdd,             // float32: s + mask
};
struct AttentionCall {
  double scale = 1.0;  // a Div by c becomes a product by 1 / c (within an ulp of the score)
  AttentionMask mask = AttentionMask::kNone;
  double fill = 0.0;
  std::string name() const { return "attention"; }
};

/// The indices of the top k along `axis` (k is the output's size there), best first.
struct TopKCall {
  int64_t axis = 0;
  bool largest = true;
  std::string name() const { return "topk"; }
};

/// RNN, GRU or LSTM over the whole sequence: output [seq + 2, dirs, batch, hidden] (Y, then Y_h
/// and Y_c). `kind` and the activation codes are those of kiln_rt::RnnParams.
struct RnnCall {
  int64_t kind = 0;  // 0 RNN, 1 GRU, 2 LSTM
  int64_t dirs = 1;
  bool reverse = false;
  bool batch_major = false;
  double clip = 0;
  bool linear_before_reset = false;
  bool input_forget = false;
  std::vector<int64_t> activations;
  std::vector<double> alpha;
  std::vector<double> beta;
  std::string name() const { return "rnn"; }
};

/// Determinants of the trailing square matrices.
struct DetCall {
  std::string name() const { return "det"; }
};

/// RoiAlign: inputs X, rois, batch indices.
struct RoiAlignCall {
  int64_t sampling_ratio = 0;
  double spatial_scale = 1.0;
  bool half_pixel = true;
  bool max_mode = false;
  std::string name() const { return "roi_align"; }
};

/// TfIdfVectorizer on integer tokens.
struct TfIdfCall {
  int64_t min_gram = 1;
  int64_t max_gram = 1;
  int64_t max_skip = 0;
  int64_t mode = 0;  // 0 TF, 1 IDF, 2 TFIDF
  std::vector<int64_t> pool;
  std::vector<int64_t> ngram_counts;
  std::vector<int64_t> ngram_indexes;
  std::vector<double> weights;
  std::string name() const { return "tfidf"; }
};

/// Unique: the count of unique values (which = nullopt, an int64 [1]) or output `which` of the
/// ONNX op (0 Y, 1 indices, 2 inverse indices, 3 counts), input 1 then being the count.
struct UniqueCall {
  int64_t axis = -1;  // -1: the input flattened
  bool sorted = true;
  std::optional<int64_t> which;
  std::string name() const { return which ? "unique" : "unique_count"; }
};

/// NonMaxSuppression: the count of selected boxes (`count`, an int64 [1]) or the selected
/// [n, 3] indices, input 2 then being the count.
struct NmsCall {
  int64_t max_per_class = 0;
  double iou_threshold = 0;
  std::optional<double> score_threshold;  // none: every box is a candidate
  bool center_point_box = false;
  bool count = false;
  std::string name() const { return count ? "nms_count" : "nms"; }
};

/// Sizes read from an integer tensor (lower/op_util.h sizes_from_tensor), optionally capped by
/// input 1.
struct ShapeValuesCall {
  std::string what;
  std::string name() const { return "shape_values"; }
};

/// Reshape's target dims resolved at run time (0 and -1 entries) against the input dims.
struct ReshapeDimsCall {
  std::string what;
  bool allowzero = false;
  std::string name() const { return "reshape_dims"; }
};

/// Expand's broadcast dims resolved at run time against the input dims.
struct ExpandDimsCall {
  std::string what;
  std::string name() const { return "expand_dims"; }
};

/// Range's element count from start, limit and delta.
struct RangeCountCall {
  std::string what;
  std::string name() const { return "range_count"; }
};

/// NonZero's count, then its positions (input 1 the count).
struct CountNonZeroCall {
  std::string name() const { return "count_nonzero"; }
};
struct NonZeroPositionsCall {
  std::string name() const { return "nonzero_positions"; }
};

/// Control flow: the call runs subgraphs and yields `results` tensors whose storage the
/// subgraph allocates; its own buffer holds no data, each result being a ControlResultCall.
/// Inputs: If the condition, then each branch's captures.
struct IfCall {
  std::shared_ptr<const Subgraph> then_branch;
  std::shared_ptr<const Subgraph> else_branch;
  int64_t results = 0;
  std::string name() const { return "if"; }
};

/// Loop: inputs M, cond, the carried values, then the body's captures. `scan_specs` describes
/// the scan outputs (kiln_rt::ScanOutputSpec: dtype, rank, dims, ... per output).
struct LoopCall {
  std::shared_ptr<const Subgraph> body;
  int64_t carried = 0;
  std::vector<int64_t> scan_specs;
  int64_t results = 0;
  std::string name() const { return "loop"; }
};

/// Scan: inputs the states, the scanned inputs, then the body's captures.
struct ScanCall {
  std::shared_ptr<const Subgraph> body;
  int64_t states = 0;
  bool batched = false;  // opset 8: a leading batch dim
  std::vector<int64_t> scan_input_axes;
  std::vector<int64_t> scan_input_directions;
  std::vector<int64_t> scan_output_axes;
  std::vector<int64_t> scan_output_directions;
  std::vector<int64_t> scan_specs;
  int64_t results = 0;
  std::string name() const { return "scan"; }
};

/// Result `index` of the control-flow call that is input 0.
struct ControlResultCall {
  int64_t index = 0;
  std::string name() const { return "result"; }
};

/// Every kind of library call: the registry.
using LibraryCall =
    std::variant<MatMulCall, GemmCall, ConvCall, AttentionCall, TopKCall, RnnCall, DetCall,
                 RoiAlignCall, TfIdfCall, UniqueCall, NmsCall, ShapeValuesCall, ReshapeDimsCall,
                 ExpandDimsCall, RangeCountCall, CountNonZeroCall, NonZeroPositionsCall, IfCall,
                 LoopCall, ScanCall, ControlResultCall>;

/// The kind's name, for dumps, comments and profile labels (never for dispatch).
inline std::string library_call_name(const LibraryCall& call) {
  return std::visit([](const auto& c) { return c.name(); }, call);
}

/// std::visit's helper: one callable from several lambdas.
template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace kiln::ir
