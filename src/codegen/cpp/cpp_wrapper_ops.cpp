#include "codegen/cpp/cpp_wrapper_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "autotune/choice.h"
#include "autotune/conv_choice.h"
#include "codegen/cpp/cpp_epilogue.h"
#include "codegen/cpp/cpp_host_text.h"
#include "support/error.h"

namespace kiln::codegen {

using graph::DType;

namespace {

void add_unique(std::vector<std::string>& list, const std::string& item) {
  if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
}

/// The pointwise body fused into a GEMM or convolution choice's call as its epilogue (empty
/// when nothing was fused).
EpilogueCode choice_epilogue(const ir::Buffer& buffer) {
  if (buffer.call.product.empty()) return {};
  return epilogue_code(buffer);
}

/// ", e0buffer, e1buffer, ...": the buffers a choice's epilogue reads, as its call's last
/// arguments.
std::string epilogue_args(const EpilogueCode& epilogue) {
  std::string args;
  for (const std::string& b : epilogue.buffers) args += ", " + b;
  return args;
}

}  // namespace

/// One library call's emission: an overload per kind of ir::LibraryCall.
struct CppWrapperOps::Call {
  CppWrapperOps& writer;
  IndentedBuffer& out;
  const ir::Buffer& buffer;
  const ir::Program& program;
  const std::vector<std::optional<ir::View>>& in = buffer.call.inputs;

  const ir::View& input(size_t k) const { return *in.at(k); }

  void operator()(const ir::MatMulCall& call) {
    // Only the CUDA backend fuses activations into a matrix product (cuBLASLt epilogues).
    KILN_CHECK(call.activation == ir::MatMulActivation::kNone,
               "matmul {}: an activation epilogue on the CPU", buffer.name);
    out.linef("const kiln_rt::View a = {};", view_init(input(0)));
    out.linef("const kiln_rt::View b = {};", view_init(input(1)));
    bool has_c = in.size() > 2 && in[2].has_value();
    if (has_c) out.linef("const kiln_rt::View c = {};", view_init(*in[2]));
    out.linef("const int64_t out_shape[] = {{{}}};", dims_list(buffer.layout.sizes));
    out.linef("kiln_rt::matmul<{}>(a, b, {}, {}, out_shape, {}, {}, {});", ctype(buffer.dtype),
              has_c ? "&c" : "nullptr", buffer.name, buffer.layout.rank(), call.alpha, call.beta);
  }

  /// A GEMM choice's call (autotune/choice.h: the C++ template or a library), with the pointwise
  /// body fused into it as its epilogue (sched/template_epilogue.h): its source is a translation
  /// unit of its own.
  void operator()(const ir::GemmCall& call) {
    const autotune::GemmChoice& choice = *call.choice;
    const EpilogueCode epilogue = choice_epilogue(buffer);
    const std::string name =
        choice_function("gemm", "a GEMM", choice, fmt::format("{}|{}", call.n, call.k), epilogue,
                        "int64_t, const float*, const float*, float*");
    const ir::View& a = input(0);
    const sym::Expr rows =
        sym::product(std::vector<sym::Expr>(a.layout.sizes.begin(), a.layout.sizes.end() - 1));
    const std::string args = epilogue_args(epilogue);
    out.linef("// {}, {}", choice.name(),
              buffer.call.product.empty() ? "no epilogue" : "epilogue fused");
    out.linef("{}({}, {}, {}, {}{});", name, cexpr(rows), data_pointer(a), data_pointer(input(1)),
              buffer.name, args);
  }

  void operator()(const ir::ConvCall& call) {
    if (call.choice) return write_conv_choice(*call.choice);
    const ir::View& x = input(0);
    const ir::View& w = input(1);
    bool has_bias = in.size() > 2 && in[2].has_value();
    const size_t spatial = x.layout.rank() - 2;
    // A channels-last call's X and output are [N, H, W, C] and [N, OH, OW, M].
    const size_t channel_dim = call.channels_last ? x.layout.rank() - 1 : 1;
    const size_t first_spatial = call.channels_last ? 1 : 2;
    out.line("kiln_rt::ConvParams p;");
    out.linef("p.spatial = {};", spatial);
    out.linef("p.n = {}; p.c = {}; p.m = {}; p.group = {};", cexpr(x.layout.sizes[0]),
              cexpr(x.layout.sizes[channel_dim]), cexpr(w.layout.sizes[0]), call.group);
    if (call.channels_last) out.line("p.channels_last = 1;");
    const std::vector<int64_t>&strides = call.strides, &dilations = call.dilations,
          &pads = call.pads;
    for (size_t k = 0; k < spatial; ++k) {
      size_t slot = 3 - spatial + k;
      out.linef("p.in[{}] = {}; p.kernel[{}] = {}; p.out[{}] = {};", slot,
                cexpr(x.layout.sizes[first_spatial + k]), slot, cexpr(w.layout.sizes[2 + k]), slot,
                cexpr(buffer.layout.sizes[first_spatial + k]));
      out.linef("p.stride[{}] = {}; p.dilation[{}] = {}; p.pad_begin[{}] = {}; p.pad_end[{}] = {};",
                slot, k < strides.size() ? strides[k] : 1, slot,
                k < dilations.size() ? dilations[k] : 1, slot, k < pads.size() ? pads[k] : 0, slot,
                spatial + k < pads.size() ? pads[spatial + k] : 0);
    }
    std::string t = ctype(buffer.dtype);
    std::string xp = fmt::format("{} + {}", x.buffer, cexpr(x.layout.offset));
    std::string wp = fmt::format("{} + {}", w.buffer, cexpr(w.layout.offset));
    std::string bp =
        has_bias ? fmt::format("{} + {}", in[2]->buffer, cexpr(in[2]->layout.offset)) : "nullptr";
    if (buffer.dtype != DType::kFloat32) {
      out.linef("kiln_rt::conv_direct<{}>(p, {}, {}, {}, {});", t, xp, wp, bp, buffer.name);
      return;
    }
    const ir::Buffer* wb = program.find(w.buffer);
    bool constant = wb != nullptr && wb->kind == ir::BufferKind::kConstant;
    // The activation fused as a oneDNN post-op (cpp_epilogue.h fuse_onednn_post_ops), by
    // ir::ConvActivation's number with its parameters.
    const ir::ConvActivation act = call.applied_activation();
    const std::string post_ops =
        act == ir::ConvActivation::kNone
            ? std::string()
            : fmt::format(", kiln_rt::ConvActivation{{{}, {}, {}}}", static_cast<int>(act),
                          act == ir::ConvActivation::kRelu ? 0.0 : call.alpha,
                          act == ir::ConvActivation::kRelu ? 0.0 : call.beta);
    out.linef("state.conv[{}].run(p, {}, {}, {}, {}, {}{});", writer.conv_sites_++, xp, wp, bp,
              buffer.name, constant ? "true" : "false", post_ops);
  }

  /// A convolution choice's call (lower/conv_select.h: the C++ template or im2col + OpenBLAS),
  /// with the pointwise body fused into it as its epilogue: its source is a translation unit of
  /// its own, as a GEMM choice's.
  void write_conv_choice(const autotune::ConvChoice& choice) {
    if (buffer.call.prologue) {
      if (buffer.call.prologue->kind == ir::BufferKind::kComputed) {
        return write_conv_input_scale(choice, *buffer.call.prologue);
      }
      return write_conv_prologue(choice, *buffer.call.prologue);
    }
    const autotune::ConvProblem& problem = choice.problem();
    const EpilogueCode epilogue = choice_epilogue(buffer);
    const std::string name = choice_function("conv", "a convolution", choice, problem.text(),
                                             epilogue, "const float*, const float*, float*");
    const std::string args = epilogue_args(epilogue);
    out.linef("// {}, {}, {}", problem.text(), choice.name(),
              buffer.call.product.empty() ? "no epilogue" : "epilogue fused");
    out.linef("{}({}, {}, {}{});", name, data_pointer(input(0)), data_pointer(input(1)),
              buffer.name, args);
  }

  /// A convolution choice's call with the convolution that computed its X fused into it as its
  /// prologue (sched/template_epilogue.h fuse_conv_prologues), each with its own epilogue: one
  /// function of its own translation unit, called with the producer's X and prepared weight.
  void write_conv_prologue(const autotune::ConvChoice& choice, const ir::Buffer& producer) {
    const autotune::ConvChoice& made = *producer.call.as<ir::ConvCall>()->choice;
    const EpilogueCode made_epilogue = choice_epilogue(producer);
    KILN_CHECK(made_epilogue.buffers.empty(), "convolution {}: its prologue's epilogue reads {}",
               buffer.name, made_epilogue.buffers.front());
    const EpilogueCode epilogue = choice_epilogue(buffer);
    const std::string key = fmt::format(
        "conv|{}|{}|{}|{}|{}|{}", made.name(), made.problem().text(), made_epilogue.epilogue.expr,
        choice.name(), choice.problem().text(), epilogue.epilogue.expr);
    const std::string name = unit_function(
        "conv", fmt::format("two convolutions ({} into {})", made.name(), choice.name()), key,
        epilogue, "const float*, const float*, const float*, float*",
        {made.linkage(), choice.linkage()}, [&](const std::string& function_name) {
          return choice.render_with_prologue(made, made_epilogue.epilogue, function_name,
                                             epilogue.epilogue);
        });
    const std::string args = epilogue_args(epilogue);
    out.linef("// {}, {}, into {}, {}, {}", made.problem().text(), made.name(),
              choice.problem().text(), choice.name(),
              buffer.call.product.empty() ? "no epilogue" : "epilogue fused");
    out.linef("{}({}, {}, {}, {}{});", name, data_pointer(*producer.call.inputs.at(0)),
              data_pointer(*producer.call.inputs.at(1)), data_pointer(input(1)), buffer.name, args);
  }

  /// A convolution choice's call whose X is a pointwise buffer's product of an image and a
  /// per-channel scale, fused into it (input_scale_operands): the function scales its weight by
  /// the scale and convolves the image as it is.
  void write_conv_input_scale(const autotune::ConvChoice& choice, const ir::Buffer& scaled) {
    const std::optional<InputScale> operands = input_scale_operands(program, scaled);
    KILN_CHECK(operands.has_value(), "convolution {}: its prologue {} is not X times a scale",
               buffer.name, scaled.name);
    const EpilogueCode epilogue = choice_epilogue(buffer);
    const std::string name =
        unit_function("conv", fmt::format("a convolution of a scaled input ({})", choice.name()),
                      fmt::format("conv|{}|{}|{}|scaled", choice.name(), choice.problem().text(),
                                  epilogue.epilogue.expr),
                      epilogue, "const float*, const float*, const float*, float*",
                      {choice.linkage()}, [&](const std::string& function_name) {
                        return choice.render_with_input_scale(function_name, epilogue.epilogue);
                      });
    const std::string args = epilogue_args(epilogue);
    out.linef("// {} of {} scaled per channel by {}, {}, {}", choice.problem().text(),
              operands->x.buffer, operands->s.buffer, choice.name(),
              buffer.call.product.empty() ? "no epilogue" : "epilogue fused");
    out.linef("{}({}, {}, {}, {}{});", name, data_pointer(operands->x), data_pointer(input(1)),
              data_pointer(operands->s), buffer.name, args);
  }

  /// The fused attention kernel (kiln_rt_attention.h): its operands as views of the output's
  /// rank, the sizes and the mask's kind.
  void operator()(const ir::AttentionCall& call) {
    const size_t rank = buffer.layout.rank();
    const ir::View &q = input(0), &kt = input(1), &v = input(2);
    out.line("kiln_rt::AttentionArgs args;");
    out.linef("args.batch_rank = {};", rank - 2);
    for (size_t k = 0; k + 2 < rank; ++k)
      out.linef("args.batch[{}] = {};", k, cexpr(buffer.layout.sizes[k]));
    out.linef("args.lq = {}; args.lk = {}; args.d = {}; args.dv = {};",
              cexpr(buffer.layout.sizes[rank - 2]), cexpr(kt.layout.sizes[rank - 1]),
              cexpr(q.layout.sizes[rank - 1]), cexpr(v.layout.sizes[rank - 1]));
    out.linef("args.q = {};", view_init(q));
    out.linef("args.kt = {};", view_init(kt));
    out.linef("args.v = {};", view_init(v));
    if (call.mask != ir::AttentionMask::kNone) out.linef("args.mask = {};", view_init(input(3)));
    out.linef("args.mask_kind = {};", static_cast<int>(call.mask));
    out.linef("args.scale = static_cast<float>({});", call.scale);
    out.linef("args.fill = {};", float_literal(call.fill));
    out.linef("kiln_rt::attention(args, {});", buffer.name);
  }

  /// A float constant as C++ text (infinities spelled out).
  static std::string float_literal(double x) {
    if (std::isinf(x)) {
      return x > 0 ? "std::numeric_limits<float>::infinity()"
                   : "-std::numeric_limits<float>::infinity()";
    }
    return fmt::format("static_cast<float>({})", x);
  }

  void operator()(const ir::TopKCall& call) {
    const ir::View& x = input(0);
    out.linef("const int64_t shape[] = {{{}}};", dims_list(x.layout.sizes));
    out.linef("kiln_rt::topk_indices<{}>({}, shape, {}, {}, {}, {}, {});", ctype(x.dtype),
              data_pointer(x), x.layout.rank(), call.axis,
              cexpr(buffer.layout.sizes.at(static_cast<size_t>(call.axis))),
              call.largest ? "true" : "false", buffer.name);
  }

  void operator()(const ir::RnnCall& call) {
    const ir::View& x = input(0);
    const bool batch_major = call.batch_major;
    out.line("kiln_rt::RnnParams p;");
    out.linef("p.kind = {}; p.dirs = {}; p.reverse = {}; p.batch_major = {};", call.kind, call.dirs,
              int{call.reverse}, int{batch_major});
    out.linef("p.seq = {}; p.batch = {}; p.input = {}; p.hidden = {};",
              cexpr(x.layout.sizes[batch_major ? 1 : 0]),
              cexpr(x.layout.sizes[batch_major ? 0 : 1]), cexpr(x.layout.sizes[2]),
              cexpr(buffer.layout.sizes[3]));
    out.linef("p.clip = {}; p.linear_before_reset = {}; p.input_forget = {};", call.clip,
              int{call.linear_before_reset}, int{call.input_forget});
    for (size_t k = 0; k < call.activations.size(); ++k) {
      out.linef("p.acts[{}] = {}; p.alpha[{}] = {}; p.beta[{}] = {};", k, call.activations[k], k,
                call.alpha[k], k, call.beta[k]);
    }
    std::vector<std::string> args;
    for (size_t k = 0; k < 8; ++k) {
      args.push_back(k < in.size() && in[k] ? data_pointer(*in[k]) : "nullptr");
    }
    out.linef("kiln_rt::rnn<{}>(p, {}, {});", ctype(buffer.dtype), fmt::join(args, ", "),
              buffer.name);
  }

  void operator()(const ir::DetCall&) {
    const ir::View& x = input(0);
    const sym::Expr n = x.layout.sizes.back();
    out.linef("kiln_rt::det<{}>({}, {}, {}, {});", ctype(buffer.dtype), data_pointer(x),
              cexpr(buffer.layout.numel()), cexpr(n), buffer.name);
  }

  void operator()(const ir::RoiAlignCall& call) {
    const ir::View& x = input(0);
    out.line("kiln_rt::RoiAlignParams p;");
    out.linef("p.n = {}; p.c = {}; p.h = {}; p.w = {};", cexpr(x.layout.sizes[0]),
              cexpr(x.layout.sizes[1]), cexpr(x.layout.sizes[2]), cexpr(x.layout.sizes[3]));
    out.linef("p.rois = {}; p.oh = {}; p.ow = {};", cexpr(buffer.layout.sizes[0]),
              cexpr(buffer.layout.sizes[2]), cexpr(buffer.layout.sizes[3]));
    out.linef("p.sampling_ratio = {}; p.spatial_scale = {}; p.half_pixel = {}; p.max_mode = {};",
              call.sampling_ratio, call.spatial_scale, int{call.half_pixel}, int{call.max_mode});
    const ir::View& batch = input(2);
    out.linef("kiln_rt::roi_align<{}, {}>(p, {}, {}, {}, {});", ctype(buffer.dtype),
              ctype(batch.dtype), data_pointer(x), data_pointer(input(1)), data_pointer(batch),
              buffer.name);
  }

  void operator()(const ir::TfIdfCall& call) {
    const ir::View& x = input(0);
    out.linef("static const int64_t pool[] = {{{}}};", fmt::join(call.pool, ", "));
    out.linef("static const int64_t ngram_counts[] = {{{}}};", fmt::join(call.ngram_counts, ", "));
    out.linef("static const int64_t ngram_indexes[] = {{{}}};",
              fmt::join(call.ngram_indexes, ", "));
    if (!call.weights.empty())
      out.linef("static const double weights[] = {{{}}};", fmt::join(call.weights, ", "));
    out.line("kiln_rt::TfIdfParams p;");
    out.linef("p.min_gram = {}; p.max_gram = {}; p.max_skip = {}; p.mode = {};", call.min_gram,
              call.max_gram, call.max_skip, call.mode);
    out.linef("p.pool = pool; p.pool_size = {}; p.ngram_counts = ngram_counts; p.levels = {};",
              call.pool.size(), call.ngram_counts.size());
    out.linef("p.ngram_indexes = ngram_indexes; p.weights = {};",
              call.weights.empty() ? "nullptr" : "weights");
    const bool batched = x.layout.rank() == 2;
    out.linef("kiln_rt::tfidf<{}>(p, {}, {}, {}, {}, {});", ctype(x.dtype), data_pointer(x),
              batched ? cexpr(x.layout.sizes[0]) : "1", cexpr(x.layout.sizes.back()), buffer.name,
              cexpr(buffer.layout.sizes.back()));
  }

  void operator()(const ir::UniqueCall& call) {
    const ir::View& x = input(0);
    sym::Expr outer(1), inner(1), n = x.layout.numel();
    if (call.axis >= 0) {
      const size_t axis = static_cast<size_t>(call.axis);
      const auto& sizes = x.layout.sizes;
      n = sizes[axis];
      for (size_t d = 0; d < axis; ++d) outer = outer * sizes[d];
      for (size_t d = axis + 1; d < sizes.size(); ++d) inner = inner * sizes[d];
    }
    std::string args = fmt::format("{}, {}, {}, {}, {}", data_pointer(x), cexpr(outer), cexpr(n),
                                   cexpr(inner), call.sorted ? "true" : "false");
    if (!call.which) {
      out.linef("{}[0] = kiln_rt::unique<{}>({}, -1, nullptr);", buffer.name, ctype(x.dtype), args);
    } else {
      out.linef("kiln_rt::unique<{}>({}, {}, {});", ctype(x.dtype), args, *call.which, buffer.name);
    }
  }

  void operator()(const ir::NmsCall& call) {
    const ir::View& boxes = input(0);
    const ir::View& scores = input(1);
    if (call.score_threshold) {
      out.linef("const double score_threshold = {};", *call.score_threshold);
    }
    std::string args =
        fmt::format("{}, {}, {}, {}, {}, {}, {}, {}, {}", data_pointer(boxes), data_pointer(scores),
                    cexpr(scores.layout.sizes[0]), cexpr(scores.layout.sizes[1]),
                    cexpr(scores.layout.sizes[2]), call.max_per_class, call.iou_threshold,
                    call.score_threshold ? "&score_threshold" : "nullptr",
                    call.center_point_box ? "true" : "false");
    if (call.count) {
      out.linef("{}[0] = kiln_rt::nms<float>({}, nullptr);", buffer.name, args);
    } else {
      out.linef("kiln_rt::nms<float>({}, {});", args, buffer.name);
    }
  }

  // Sizes computed from data (lower/op_util.h sizes_from_tensor and friends); the wrapper binds
  // them to symbols right after.
  void operator()(const ir::RangeCountCall& call) {
    const ir::View& x = input(0);
    out.linef("kiln_rt::range_count<{}>({}, {}, {}, {}, {});", ctype(x.dtype), data_pointer(x),
              data_pointer(input(1)), data_pointer(input(2)), buffer.name, cpp_quote(call.what));
  }

  void operator()(const ir::ShapeValuesCall& call) {
    const ir::View& x = input(0);
    const std::optional<ir::View>& max = in.size() > 1 ? in[1] : std::nullopt;
    out.linef("kiln_rt::shape_values<{}>({}, {}, {}, {}, {});", ctype(x.dtype), data_pointer(x),
              cexpr(x.layout.numel()),
              max ? fmt::format("({})[0]", data_pointer(*max)) : std::string("-1"), buffer.name,
              cpp_quote(call.what));
  }

  void operator()(const ir::ReshapeDimsCall& call) {
    const ir::View& x = input(0);
    const ir::View& dims = input(1);
    out.linef("kiln_rt::reshape_dims<{}>({}, {}, {}, {}, {}, {}, {});", ctype(x.dtype),
              data_pointer(x), cexpr(x.layout.numel()), data_pointer(dims),
              cexpr(dims.layout.numel()), call.allowzero ? "true" : "false", buffer.name,
              cpp_quote(call.what));
  }

  void operator()(const ir::ExpandDimsCall& call) {
    const ir::View& x = input(0);
    const ir::View& dims = input(1);
    out.linef("kiln_rt::expand_dims<{}>({}, {}, {}, {}, {}, {});", ctype(x.dtype), data_pointer(x),
              cexpr(x.layout.numel()), data_pointer(dims), cexpr(dims.layout.numel()), buffer.name,
              cpp_quote(call.what));
  }

  void operator()(const ir::CountNonZeroCall& call) { nonzero(call.name()); }
  void operator()(const ir::NonZeroPositionsCall& call) { nonzero(call.name()); }

  void nonzero(const std::string& function) {
    const ir::View& x = input(0);
    out.linef("kiln_rt::{}<{}>({}, {}, {});", function, ctype(x.dtype), data_pointer(x),
              cexpr(x.layout.numel()), buffer.name);
  }

  // Control flow runs subgraphs: the wrapper writes it (codegen/wrapper/wrapper.cpp).
  void operator()(const ir::IfCall& call) { control_flow(call.name()); }
  void operator()(const ir::LoopCall& call) { control_flow(call.name()); }
  void operator()(const ir::ScanCall& call) { control_flow(call.name()); }
  void operator()(const ir::ControlResultCall& call) { control_flow(call.name()); }

  [[noreturn]] void control_flow(const std::string& kind) {
    internal_error("{} of buffer {} is control flow, not a library call", kind, buffer.name);
  }

  /// The function a GEMM or convolution choice's call calls: calls of the same choice, problem
  /// and epilogue share one, defined in a translation unit of its own (`<kind><n>.cpp`) whose
  /// linkage the library takes on. `params` are its parameters before the epilogue's inputs.
  template <typename Choice>
  std::string choice_function(const std::string& kind, const std::string& what,
                              const Choice& choice, const std::string& problem,
                              const EpilogueCode& epilogue, std::string params) {
    return unit_function(
        kind, fmt::format("{} ({})", what, choice.name()),
        fmt::format("{}|{}|{}|{}", kind, choice.name(), problem, epilogue.epilogue.expr), epilogue,
        std::move(params), {choice.linkage()},
        [&](const std::string& name) { return choice.render(name, epilogue.epilogue); });
  }

  /// The function of the unit `render(name)` defines, one per `key` (`what` heads the unit).
  template <typename Render>
  std::string unit_function(const std::string& kind, const std::string& what,
                            const std::string& key, const EpilogueCode& epilogue,
                            std::string params,
                            const std::vector<autotune::ChoiceLinkage>& linkages, Render&& render) {
    int& count = writer.choice_counts_[kind];
    auto [it, fresh] = writer.choice_functions_.emplace(key, fmt::format("{}_{}", kind, count));
    if (!fresh) return it->second;
    const std::string& name = it->second;
    for (size_t k = 0; k < epilogue.buffers.size(); ++k) params += ", const float*";
    writer.declarations_.push_back(fmt::format("extern \"C\" void {}({});", name, params));
    writer.units_.emplace_back(fmt::format("{}{}.cpp", kind, count++),
                               "// Generated by Kiln: " + what + ". Do not edit.\n" +
                                   writer.kernel_prelude_ + render(name));
    for (const autotune::ChoiceLinkage& linkage : linkages) {
      for (const std::string& dir : linkage.include_dirs) {
        add_unique(writer.needs_.include_dirs, dir);
      }
      for (const std::string& lib : linkage.libraries) add_unique(writer.needs_.libraries, lib);
    }
    return name;
  }
};

void CppWrapperOps::note(const ir::ExternCall& call) {
  std::visit(ir::Overloaded{
                 [&](const ir::MatMulCall&) { needs_.uses_blas = true; },
                 [&](const ir::ConvCall&) { needs_.uses_dnnl = true; },
                 [&](const ir::AttentionCall&) { uses_attention_ = true; },
                 [&](const ir::IfCall&) {},
                 [&](const ir::LoopCall&) {},
                 [&](const ir::ScanCall&) {},
                 [&](const ir::ControlResultCall&) {},
                 // The others (GEMM choices included) are kiln_rt_library.h kernels.
                 [&](const auto&) { uses_library_ = true; },
             },
             call.op);
}

void CppWrapperOps::write_includes(IndentedBuffer& out, bool uses_control) {
  out.line("#include \"kiln_rt.h\"");
  if (needs_.uses_blas) out.line("#include \"kiln_rt_blas.h\"");
  if (uses_library_) out.line("#include \"kiln_rt_library.h\"");
  if (uses_attention_) out.line("#include \"kiln_rt_attention.h\"");
  if (uses_control) out.line("#include \"kiln_rt_control.h\"");
  if (needs_.uses_dnnl) {
    out.line("#define KILN_RT_WITH_DNNL 1");
    out.line("#include \"kiln_rt_conv.h\"");
  }
}

void CppWrapperOps::write_run_state_members(IndentedBuffer& out) {
  out.line("    kiln_rt::Arena arena;");
  if (conv_sites_ > 0) out.linef("    kiln_rt::ConvSite conv[{}];", conv_sites_);
}

void CppWrapperOps::write_workspace(IndentedBuffer& out) { out.line("kiln_rt::Workspace ws;"); }

void CppWrapperOps::write_input_data(IndentedBuffer& out, size_t k, const std::string& ctype,
                                     const std::string& pointer) {
  out.linef("const {}* {} = static_cast<const {}*>(in{}.data);", ctype, pointer, ctype, k);
}

void CppWrapperOps::write_constant_data(IndentedBuffer& out, size_t index, const std::string& ctype,
                                        const std::string& pointer, size_t /*bytes*/) {
  out.linef("const {}* {} = static_cast<const {}*>(constants[{}]);", ctype, pointer, ctype, index);
}

void CppWrapperOps::write_arena(IndentedBuffer& out, const std::string& bytes) {
  out.linef("char* const arena = state.arena.reserve({});", bytes);
}

void CppWrapperOps::write_allocation(IndentedBuffer& out, const Allocation& a) {
  const std::string& t = a.ctype;
  switch (a.place) {
    case Allocation::Place::kOutput:
      out.linef("{}* {} = kiln_rt::output_storage<{}>(outputs[{}], {}, {}, ws);", t, a.buffer, t,
                a.output, a.elements, a.output_name);
      return;
    case Allocation::Place::kArena:
      out.linef("{}* {} = reinterpret_cast<{}*>(arena + {});", t, a.buffer, t, a.offset);
      return;
    case Allocation::Place::kWorkspace:
      out.linef("{}* {} = ws.alloc<{}>({});", t, a.buffer, t, a.elements);
      return;
  }
}

void CppWrapperOps::write_index_check(IndentedBuffer& out, const std::string& pointer,
                                      const std::string& count, const std::string& size,
                                      bool has_ignored, int64_t ignored, const std::string& node) {
  out.linef("kiln_rt::check_indices({}, {}, {}, {}, {}LL, {});", pointer, count, size,
            has_ignored ? "true" : "false", ignored, node);
}

void CppWrapperOps::write_size_read(IndentedBuffer& out, const std::string& identifier,
                                    const std::string& pointer, const std::string& element) {
  out.linef("const int64_t {} = {}[{}];  // known from here on", identifier, pointer, element);
}

void CppWrapperOps::write_release(IndentedBuffer& out, const std::string& pointer) {
  out.linef("ws.release({});", pointer);
}

void CppWrapperOps::write_take_over(IndentedBuffer& out, const std::string& results) {
  out.linef("for (const kiln_rt::TensorArg& r : {}) ws.adopt(r.data);", results);
}

void CppWrapperOps::write_hand_over(IndentedBuffer& out, const std::string& pointer) {
  out.linef("ws.detach({});", pointer);
}

void CppWrapperOps::write_finish_output(IndentedBuffer& out, size_t k, const std::string& data,
                                        const std::string& dtype, const std::string& rank,
                                        const std::string& dims, const std::string& element_size,
                                        const std::string& name) {
  out.linef("kiln_rt::finish_output(outputs[{}], {}, {}, {}, {}, {}, {}, ws);", k, data, dtype,
            rank, dims, element_size, name);
}

void CppWrapperOps::write_timing_support(IndentedBuffer& out) {
  out.line(
      "// Times the call that follows in a profiled run (one event per kernel or library call).");
  out.line("#define KILN_TIMED(name, kind) kiln_rt::ProfileScope timed_(profile, name, kind)");
  out.line("");
}

void CppWrapperOps::write_declarations(IndentedBuffer& out,
                                       const std::vector<const GeneratedKernel*>& kernels) {
  for (const std::string& decl : declarations_) out.line(decl);
  for (const GeneratedKernel* k : kernels) {
    std::string params;
    for (const KernelArg& a : k->args) {
      if (!params.empty()) params += ", ";
      params += a.kind == KernelArg::Kind::kSize
                    ? "int64_t"
                    : (a.is_output ? ctype(a.dtype) + "*" : "const " + ctype(a.dtype) + "*");
    }
    out.linef("extern \"C\" void {}({});", k->name, params);
  }
}

void CppWrapperOps::write_timing_mark(IndentedBuffer& out, const std::string& label,
                                      const std::string& kind) {
  out.linef("KILN_TIMED({}, {});", cpp_quote(label), cpp_quote(kind));
}

void CppWrapperOps::write_kernel_call(IndentedBuffer& out, const std::string& label,
                                      const std::string& function, const std::string& args) {
  out.line("{");
  out.indent();
  write_timing_mark(out, label, "kernel");
  out.linef("{}({});", function, args);
  out.dedent();
  out.line("}");
}

void CppWrapperOps::write_library_call(IndentedBuffer& out, const ir::Buffer& buffer,
                                       const ir::Program& program) {
  std::visit(Call{*this, out, buffer, program}, buffer.call.op);
}

std::vector<std::pair<std::string, std::string>> CppWrapperOps::take_units() {
  return std::move(units_);
}

}  // namespace kiln::codegen
