#pragma once
/// Lowering: graph::Graph -> ir::Program. Each ONNX op has a lowering function (one file per op
/// family: elementwise.cpp, reduce.cpp, shape.cpp, index.cpp, nn.cpp, ...) registered in
/// registry.cpp. A lowering function turns the node's input TensorValues into output
/// TensorValues.
///
/// A TensorValue is lazy: a LoopBody over index variables i0..i{rank-1} whose result() is the
/// element at that index. Consumers inline it (LoweringContext::load_at), so chains of
/// elementwise ops and views (Reshape, Transpose, Slice, Expand...) become one expression with no
/// memory traffic. Something forces a value to be materialized into an ir::Buffer (realize):
/// several users of a non-trivial value, an extern call's input, a graph output, a body that grew
/// too large. Views are index remaps: a Transpose's body is its input's body with the variables
/// permuted.
///
/// Values whose integer contents are known at compile time (Shape, Constant, small initializers,
/// and arithmetic on them) also carry `known`: the element values as sym::Expr, possibly symbolic
/// (Shape of a dynamic input gives [batch, 3, ...]). Reshape, Expand, Slice and friends read their
/// shape arguments from it.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autotune/select.h"
#include "graph/graph.h"
#include "ir/buffer.h"
#include "ir/device.h"
#include "ir/loop_body.h"
#include "sym/analyzer.h"

namespace kiln::lower {

/// Integer tensors up to this many elements carry their values in TensorValue::known (through
/// views, folded arithmetic and index ops); lowering folds no larger contents.
inline constexpr int64_t kMaxKnownElements = 4096;

struct TensorValue {
  graph::DType dtype = graph::DType::kFloat32;
  std::vector<sym::Expr> shape;
  /// Computes the element at (i0, .., i{rank-1}); sizes() == shape, no reduction vars.
  std::shared_ptr<const ir::LoopBody> body;
  /// Integer contents known at compile time, row-major (at most a few thousand elements).
  std::optional<std::vector<sym::Expr>> known;
  /// Floating contents known at compile time (scalars and small constants), row-major.
  std::optional<std::vector<double>> known_float;
  /// The ONNX nodes whose computation is folded into `body` (sorted): a buffer materialized from
  /// this value is named after them, not after the node that happened to force it.
  std::vector<ir::Origin> origins;
  /// Set when the value is an ONNX sequence: its tensors, their number known at compile time
  /// (SequenceConstruct, SplitToSequence, ...); `dtype` is the element type, `body` unset.
  std::shared_ptr<const std::vector<TensorValue>> sequence;
  /// Set when the value is an ONNX optional; `none` when it holds nothing (then only `dtype`,
  /// the element type, and `sequence` for an optional sequence, are meaningful). Whether an
  /// optional holds a value is always known when compiling.
  bool optional = false;
  bool none = false;

  size_t rank() const { return shape.size(); }
  /// The known integer values; throws UserError naming `what` when not known at compile time.
  const std::vector<sym::Expr>& known_ints(std::string_view what) const;
};

/// The activation layout of 2-D convolutions (lower/nn.cpp).
enum class ConvLayout {
  /// Channels-last (on the CPU and on CUDA) when the graph is a network of convolutions: it has a
  /// depthwise convolution (MobileNet's chains of 1x1 and depthwise layers) or at least
  /// kChannelsLastMinConvs float32 2-D convolutions (ResNet's chains of 3x3 and 1x1 ones), so that
  /// the reorders at the chain's ends are paid once; else NCHW.
  kAuto,
  kNchw,
  /// The ungrouped and depthwise float32 2-D convolutions run on channels-last activations
  /// (ir::ConvCall::channels_last; on CUDA with weights packed [M, KH, KW, C] when compiling),
  /// with the values between them (pointwise ops, residual adds, MaxPool, GlobalAveragePool) kept
  /// channels-last, so that a chain of them needs no reorder; other grouped convolutions stay
  /// NCHW.
  kChannelsLast,
};

/// kAuto's count of 2-D float32 convolutions from which a graph runs channels-last.
inline constexpr int kChannelsLastMinConvs = 3;

/// Per-compile options that change lowering decisions.
struct LoweringOptions {
  /// A lazy value whose body has more compute ops than this is realized before being inlined
  /// into a second consumer.
  int max_inline_ops = 64;
  /// Values of model inputs known when compiling (by ONNX input name). Small integer and bool
  /// inputs (rank <= 1, at most kMaxSpecializedElements) among them are specialized, and small
  /// floating ones where an op needs them when compiling (Resize's scales, Dropout's ratio,
  /// NonMaxSuppression's thresholds): those ops (and Reshape's shape, Slice's starts, axes...)
  /// read them, and the wrapper checks at run time that the input still holds them.
  std::map<std::string, std::shared_ptr<const graph::Tensor>> input_values;
  /// Values of sequence and optional inputs (by ONNX input name): they fix a sequence's length
  /// and an optional's presence, and its elements' ranks where the model does not give them.
  std::map<std::string, graph::IoValue> structured_inputs;
  /// OpenMP threads the compiled code will run (algorithm choices depend on it).
  int threads = 1;
  /// Algorithm selection (autotune/select.h): the mode (empty: KILN_AUTOTUNE, else default),
  /// and the code cache its candidates compile in (empty: the default one).
  std::optional<autotune::AutotuneMode> autotune;
  std::filesystem::path code_cache_dir;
  /// The ISA GEMM and convolution templates may use: a library built for x86-64-v3 passes AVX2
  /// even on an AVX-512 host; empty: this host's.
  std::optional<autotune::TemplateIsa> template_isa;
  /// Forces every convolution that lower/conv_select.h gives a choice onto one choice instead of
  /// selecting: "onednn", "im2col-openblas", "template" (its default config) or a template
  /// choice's full name. Empty: algorithm selection. For benches and tests.
  std::string conv_choice;
  ConvLayout conv_layout = ConvLayout::kAuto;
  /// The device the program is lowered for. On CUDA, matrix products are always an
  /// ir::MatMulCall (cuBLASLt) over views it can read, never a CPU GEMM choice, and Gemm's
  /// beta * C is a pointwise consumer of the product (the CUDA backend fuses a bias into the
  /// call as a cuBLASLt epilogue).
  ir::Device device = ir::Device::kCpu;
  /// Attention written node by node (MatMul, scale, mask, Softmax, MatMul) runs as one fused CPU
  /// kernel where lower/attention_fusion.h recognizes it; off: node by node.
  bool fuse_attention = true;
  /// On CUDA, attention is fused (Kiln's kernel, codegen/cuda/cuda_attention.h) only when this
  /// is set as well: measured on an H200 (bench/ort's BERT-base, seq 128, tf32, CUDA graphs),
  /// cuBLASLt's batched products and the one-kernel Softmax took 1.124 ms a run against the
  /// fused kernel's 1.216 ms, so node by node is the default there.
  bool cuda_fused_attention = false;
};

inline constexpr int64_t kMaxSpecializedElements = 8;

class GraphLowering;

class LoweringContext {
 public:
  LoweringContext(ir::Program& program, const LoweringOptions& options);

  ir::Program& program() { return program_; }
  sym::Analyzer& analyzer() { return program_.analyzer; }
  const LoweringOptions& options() const { return options_; }

  /// The node being lowered (for error messages and buffer origins).
  const graph::Node& node() const { return *node_; }
  void set_node(const graph::Node* node) { node_ = node; }

  /// Throws UserError naming the current node: "node 'x' (Op): <message>".
  [[noreturn]] void fail(const std::string& message) const;

  /// The lowering of the graph this context belongs to (control-flow ops lower their subgraphs
  /// through it).
  GraphLowering& graph_lowering() const { return *graph_lowering_; }
  void set_graph_lowering(GraphLowering* lowering) { graph_lowering_ = lowering; }

  // --- Making values ---------------------------------------------------------------------------

  /// A value that loads every element of `buffer` through its layout.
  TensorValue from_buffer(const ir::Buffer& buffer);
  /// A compile-time constant tensor (becomes a constant buffer when used by a kernel; small
  /// integer tensors also set `known`).
  TensorValue from_constant(std::shared_ptr<const graph::Tensor> tensor);
  /// A scalar or small tensor whose integer contents are known (possibly symbolic).
  TensorValue from_known(graph::DType dtype, std::vector<sym::Expr> shape,
                         std::vector<sym::Expr> values);
  /// Elementwise: `fn` builds the element at `index` (one expr per output dim) inside `body`,
  /// typically by load_at() of the inputs and body ops.
  using PointwiseFn =
      std::function<ir::ValueId(ir::LoopBody& body, const std::vector<sym::Expr>& index)>;
  TensorValue pointwise(graph::DType dtype, std::vector<sym::Expr> shape, const PointwiseFn& fn);

  /// Inlines `value` into `body` at the given index (one expr per dim of value) and returns the
  /// element. This is how every consumer reads a TensorValue.
  ir::ValueId load_at(ir::LoopBody& body, const TensorValue& value,
                      const std::vector<sym::Expr>& index);

  /// A reduction: output dims `shape`, reduced dims `reduce_shape`; `fn` builds the value to
  /// reduce at (index, reduce_index). Materializes a reduction buffer and returns a value that
  /// loads it.
  using ReductionFn =
      std::function<ir::ValueId(ir::LoopBody& body, const std::vector<sym::Expr>& index,
                                const std::vector<sym::Expr>& reduce_index)>;
  TensorValue reduction(graph::DType dtype, std::vector<sym::Expr> shape,
                        std::vector<sym::Expr> reduce_shape, ir::ReductionType type,
                        const ReductionFn& fn);

  /// An extern library call producing one buffer of `dtype`/`shape` (contiguous).
  TensorValue extern_call(ir::LibraryCall op, graph::DType dtype, std::vector<sym::Expr> shape,
                          std::vector<std::optional<ir::View>> inputs);

  // --- Materializing ---------------------------------------------------------------------------

  /// Materializes `value` into a contiguous computed buffer unless it already is a load of one
  /// (with `copy`, always: a graph output never shares storage with an input, a constant or
  /// another output); returns a value loading that buffer. `reason` is recorded in the log.
  TensorValue realize(const TensorValue& value, std::string_view reason, bool copy = false);
  /// A strided view of a materialized buffer holding `value`: an affine load of a buffer is
  /// returned as a view without a copy; anything else is realized first. When `contiguous` is
  /// set, the view is guaranteed contiguous (a copy is made if needed).
  ir::View as_view(const TensorValue& value, bool contiguous = false);
  /// The buffer name if `value` is exactly a load of a whole buffer in its own layout.
  std::optional<std::string> as_buffer(const TensorValue& value) const;

  // --- Channels-last values (LoweringOptions::conv_layout) -----------------------------------

  /// The rank-4 `value` [N, C, H, W] as a lazy [N, H, W, C] view, and back.
  TensorValue to_channels_last(const TensorValue& value);
  TensorValue from_channels_last(const TensorValue& value);
  /// Records that `buffer` holds a [N, H, W, C] tensor that NCHW values read through
  /// from_channels_last.
  void mark_channels_last(const std::string& buffer) { channels_last_.insert(buffer); }
  /// Whether `value` (rank 4) loads a buffer that mark_channels_last recorded: such a value is
  /// realized channels-last, so that its loads and its store run in the same order.
  bool reads_channels_last(const TensorValue& value) const;
  /// Materializes `value` [N, C, H, W] into a [N, H, W, C] buffer and returns its NCHW view.
  TensorValue realize_channels_last(const TensorValue& value, std::string_view reason);

  /// A fresh size symbol ("dyn<N>") bound at run time as `size` says (its symbol is set here).
  sym::Expr dynamic_size(ir::DynamicSize size);
  /// A fresh buffer name ("buf<N>").
  std::string new_buffer_name();
  /// Adds a buffer to the program with the current node as origin.
  ir::Buffer& add_buffer(std::unique_ptr<ir::Buffer> buffer);
  /// Constant folding's memo (constant_fold.cpp): whether each buffer of the program, by name,
  /// depends only on constants.
  std::map<std::string, bool>& foldable_buffers() { return foldable_buffers_; }

  // --- Helpers for op lowerings ----------------------------------------------------------------

  /// Numpy-style broadcast of shapes; fails naming the node when incompatible (a symbolic dim
  /// against a different non-1 dim is assumed equal and recorded as a fact).
  std::vector<sym::Expr> broadcast_shapes(const std::vector<std::vector<sym::Expr>>& shapes);
  /// The index into an input of shape `input_shape` for an output index under broadcasting
  /// (right-aligned; size-1 dims read index 0).
  static std::vector<sym::Expr> broadcast_index(const std::vector<sym::Expr>& index,
                                                const std::vector<sym::Expr>& input_shape);
  /// Normalizes a possibly negative axis for `rank`; fails naming the node when out of range.
  int64_t normalize_axis(int64_t axis, int64_t rank) const;

 private:
  ir::Program& program_;
  LoweringOptions options_;
  const graph::Node* node_ = nullptr;
  GraphLowering* graph_lowering_ = nullptr;
  int next_buffer_ = 0;
  std::map<std::string, bool> foldable_buffers_;
  std::set<std::string> channels_last_;
};

/// A lowering function: the node's inputs (nullopt for omitted optional inputs) to its outputs.
using LowerFn =
    std::function<std::vector<TensorValue>(LoweringContext& ctx, const graph::Node& node,
                                           const std::vector<std::optional<TensorValue>>& inputs)>;

struct OpLowering {
  LowerFn fn;
  int64_t min_opset = 1;  // lowest ai.onnx opset version of the op this handles
  /// Highest. Given as the op's newest version the lowering implements; when that is 17 or
  /// later, Registry::add widens it to the opset before the op's next change of meaning
  /// (graph::last_opset_with_meaning_of), so versions that only add element types keep it.
  int64_t max_opset = 17;
};

/// The table of op lowerings, keyed by (domain, op type). Built once; read-only afterwards.
class Registry {
 public:
  void add(std::string domain, std::string op_type, OpLowering lowering);
  const OpLowering* find(std::string_view domain, std::string_view op_type) const;
  /// Every registered op as "domain:op" ("" domain printed as op only), sorted.
  std::vector<std::string> ops() const;
  static const Registry& instance();

 private:
  std::map<std::pair<std::string, std::string>, OpLowering, std::less<>> table_;
};

// Registration functions, one per op family file (registry.cpp calls them all).
void register_elementwise_ops(Registry& registry);
void register_reduce_ops(Registry& registry);
void register_norm_ops(Registry& registry);
void register_shape_ops(Registry& registry);
void register_index_ops(Registry& registry);
void register_nn_ops(Registry& registry);
void register_training_ops(Registry& registry);
void register_movement_ops(Registry& registry);
void register_contraction_ops(Registry& registry);
void register_resize_ops(Registry& registry);
void register_quantize_ops(Registry& registry);
void register_conv_transpose_ops(Registry& registry);
void register_grid_sample_ops(Registry& registry);
void register_recurrent_ops(Registry& registry);
void register_library_ops(Registry& registry);
void register_signal_ops(Registry& registry);
void register_dynamic_ops(Registry& registry);
void register_sequence_ops(Registry& registry);
void register_control_flow_ops(Registry& registry);
void register_attention_ops(Registry& registry);
void register_newer_ops(Registry& registry);

/// Lowers a whole model graph into a Program. Throws UserError naming the node for unsupported
/// ops, dtypes (e.g. string tensors) or attributes.
ir::Program lower_graph(const graph::Graph& graph, const LoweringOptions& options = {});

}  // namespace kiln::lower
