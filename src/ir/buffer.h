#pragma once
/// Buffers of the loop IR and the Program that lowering produces. A Buffer is a named region of
/// memory with a Layout (sizes, strides, offset as sym::Expr, in elements; storage 64-byte
/// aligned). It is an input of the model, a constant (folded at compile time or an initializer),
/// computed by a LoopBody (pointwise or reduction), or the result of an extern library call.
/// Views (Reshape, Transpose, Slice, Expand, ...) are not buffers: they are index remaps that
/// lowering folds into the loads of their consumers; a strided View of a buffer is what extern
/// calls take.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "graph/dtype.h"
#include "graph/graph.h"
#include "graph/tensor.h"
#include "ir/device.h"
#include "ir/library_call.h"
#include "ir/loop_body.h"
#include "sym/expr.h"

namespace kiln::ir {

inline constexpr int64_t kAlignBytes = 64;

struct Layout {
  std::vector<sym::Expr> sizes;
  std::vector<sym::Expr> strides;
  sym::Expr offset;

  /// Row-major contiguous strides for `sizes`.
  static Layout contiguous(std::vector<sym::Expr> sizes);
  size_t rank() const { return sizes.size(); }
  sym::Expr numel() const;
  /// Elements the storage must hold: offset + sum((size - 1) * stride) + 1 (0 when numel is 0
  /// for static shapes).
  sym::Expr storage_size() const;
  /// The flat element index of a multi-index.
  sym::Expr index(const std::vector<sym::Expr>& indices) const;
  bool is_contiguous() const;
  std::string str() const;  // "[8, s0] stride [s0, 1] offset 0"
  bool operator==(const Layout&) const = default;
};

/// A strided window onto a buffer: what extern calls read.
struct View {
  std::string buffer;
  graph::DType dtype = graph::DType::kFloat32;
  Layout layout;
  std::string str() const;
};

/// A library call (BLAS GEMM, oneDNN convolution, ...). Inputs are views of materialized
/// buffers; an absent optional input is nullopt. The output is the buffer that holds the call.
class Buffer;

struct ExternCall {
  /// What the call computes, with its typed parameters (ir/library_call.h).
  LibraryCall op;
  std::vector<std::optional<View>> inputs;
  /// Set when a pointwise epilogue was fused into a GEMM or convolution call
  /// (sched/template_epilogue.h): the buffer name the epilogue's body reads the call's value by.
  std::string product;
  /// A template call's earlier epilogues, applied in order before the call's own buffer's body
  /// (sched/template_epilogue.h); each holds the buffer as it was when the next one fused.
  std::vector<std::shared_ptr<const Buffer>> epilogue_chain;
  /// Set when what computed this convolution call's X was fused into it
  /// (sched/template_epilogue.h fuse_conv_prologues): that buffer as it was (a convolution call
  /// with its own epilogue, or a pointwise body); it is no longer in the program. Input 0 is then
  /// its first operand (a call's X), and its other operands are among this call's inputs.
  std::shared_ptr<const Buffer> prologue;

  /// The parameters when the call is of kind T, else nullptr.
  template <typename T>
  const T* as() const {
    return std::get_if<T>(&op);
  }
  template <typename T>
  T* as() {
    return std::get_if<T>(&op);
  }
  std::string name() const { return library_call_name(op); }
};

/// The ONNX node a buffer came from, for kernel names and comments.
struct Origin {
  std::string node;     // node name
  std::string op_type;  // ONNX op type
  bool operator<(const Origin& o) const {
    return std::tie(node, op_type) < std::tie(o.node, o.op_type);
  }
  bool operator==(const Origin& o) const = default;
};

enum class BufferKind : uint8_t { kInput, kConstant, kComputed, kExtern };

class Buffer {
 public:
  std::string name;
  BufferKind kind = BufferKind::kComputed;
  graph::DType dtype = graph::DType::kFloat32;
  Device device = Device::kCpu;  // where its storage lives (ir/device.h)
  Layout layout;
  std::shared_ptr<const graph::Tensor> constant;  // kConstant
  LoopBody body;                                  // kComputed: stores into this buffer
  ExternCall call;                                // kExtern
  std::vector<Origin> origins;                    // sorted, unique

  bool is_reduction() const { return kind == BufferKind::kComputed && body.is_reduction(); }
  /// Buffers this one reads (loads of the body or inputs of the call), sorted, unique.
  std::vector<std::string> reads() const;
  void add_origin(const Origin& origin);
  std::string str() const;  // header line + body
};

/// A model input as the wrapper sees it.
struct InputSpec {
  std::string onnx_name;
  std::string buffer;
  graph::DType dtype;
  std::vector<sym::Expr> shape;
};

/// One type a graph output may have when its rank or dtype is known only after a run.
struct OutputAlternative {
  graph::DType dtype = graph::DType::kUndefined;
  std::string shape;  // as text: "[N, 128]" (its symbols may belong to a branch)

  bool operator==(const OutputAlternative&) const = default;
};

/// A model output: the buffer that holds it (outputs are always materialized, contiguous and
/// never reused for another buffer).
///
/// When an If whose branches give different ranks or dtypes returns it (`alternatives` lists
/// them), its rank and dtype are known only after a run: `buffer` is then the If's result, whose
/// run-time dtype and dims the output takes over, `shape` is empty and `dtype` is the dtype when
/// every alternative has the same one, else kUndefined.
struct OutputSpec {
  std::string onnx_name;
  std::string buffer;
  graph::DType dtype;
  std::vector<sym::Expr> shape;
  std::vector<OutputAlternative> alternatives = {};

  bool type_known_after_run() const { return !alternatives.empty(); }
};

/// How a model input or output maps onto the entry point's flat tensors (InputSpecs or
/// OutputSpecs): a tensor is one; a sequence, whose length is fixed when compiling, one per
/// element; an optional is what it holds, or nothing when it is empty (also fixed when
/// compiling).
struct BoundaryValue {
  std::string onnx_name;
  graph::ValueKind kind = graph::ValueKind::kTensor;  // of the content
  bool optional = false;
  bool present = true;
  size_t first = 0;  // its first spec
  size_t count = 1;  // its specs
};

/// A runtime check the wrapper performs before any kernel runs on the data it guards: that every
/// element of an integer buffer lies in [-size, size) (Gather-style indices).
struct IndexCheck {
  std::string buffer;
  sym::Expr size;
  std::string node;                // "node 'g' (Gather)" for the message
  std::optional<int64_t> ignored;  // a value also allowed (a loss's ignore_index)
};

/// A run-time check that a reduction without an identity (ArgMax, ArgMin) never reduces an empty
/// axis into a non-empty output: when `outputs` > 0, `extent` must be > 0.
struct ExtentCheck {
  std::string buffer;  // the reduction's buffer: the check goes when it is pruned
  sym::Expr extent;    // elements reduced into each output
  sym::Expr outputs;   // elements of the output
  std::string node;    // "node 'a' (ArgMax)" for the message
};

/// A run-time check that a specialized input still holds the values the compile assumed.
struct ValueGuard {
  std::string buffer;
  std::string onnx_name;
  std::vector<double> values;  // integers, bools (0/1) or one floating scalar
};

/// A size known only at run time (the count of NonZero, a shape computed from data): the wrapper
/// binds `symbol` from element `element` of the int64 `buffer` right after the item that computes
/// it (right after the inputs for an input: a Loop body's iteration number), and every later
/// allocation, kernel and output shape may use it. With `result` >= 0, `buffer` is a
/// control-flow call and the symbol is dim `dim` of the run-time shape of its result `result`.
/// Items whose sizes or indices use the symbol run after `buffer` (dynamic_size_sources).
struct DynamicSize {
  std::string symbol;
  std::string buffer;
  int result = -1;
  int dim = -1;
  int64_t element = 0;
};

struct Subgraph;
struct Program;

/// The buffers that bind the dynamic sizes `buffer` uses (in its layout, loop sizes, indices or
/// call inputs): it must run after them, and they live as long as it does.
std::vector<std::string> dynamic_size_sources(const Program& program, const Buffer& buffer);

/// Control flow (If, Loop, Scan) is an extern call (IfCall, LoopCall, ScanCall) that runs
/// subgraphs (also listed in Program::subgraphs) and yields several tensors whose storage the
/// subgraph allocates. The call's own buffer holds no data; each result is a buffer of its own,
/// a ControlResultCall reading it.
bool is_control_flow(const Buffer& buffer);
bool is_control_flow_result(const Buffer& buffer);

/// The result of lowering: buffers in dependency order, the model's inputs and outputs.
struct Program {
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<InputSpec> inputs;
  std::vector<OutputSpec> outputs;
  /// The model's inputs and outputs as ONNX values, in graph order, over `inputs` / `outputs`.
  std::vector<BoundaryValue> input_values;
  std::vector<BoundaryValue> output_values;
  std::vector<IndexCheck> index_checks;
  std::vector<ExtentCheck> extent_checks;
  std::vector<ValueGuard> value_guards;
  std::vector<DynamicSize> dynamic_sizes;
  /// The subgraphs of the program's control-flow calls (nested ones live in their parent's).
  std::vector<std::shared_ptr<const Subgraph>> subgraphs;
  /// Facts about size symbols (e.g. from Reshape: s0 * 4 == 16 * s1) known when lowering.
  sym::Analyzer analyzer;

  Buffer* find(const std::string& name) const;
  std::string str() const;
};

/// A subgraph of a control-flow call (an If branch, a Loop or Scan body), lowered into a Program
/// of its own that the wrapper turns into a function: its inputs are the subgraph's formal
/// inputs, then the outer values it reads (captures); its outputs are allocated by it and
/// adopted by the caller.
struct Subgraph {
  std::string name;  // "g1": its function and kernels are named after it
  Program program;
  size_t formal_inputs = 0;  // program.inputs beyond these are captures, in `captures` order
  std::vector<std::string> captures;  // the outer buffers passed for them
};

}  // namespace kiln::ir
