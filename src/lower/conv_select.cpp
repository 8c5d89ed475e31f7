#include "lower/conv_select.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autotune/select.h"
#include "lower/op_util.h"
#include "support/log.h"

namespace kiln::lower {
namespace {

using graph::DType;

std::optional<int64_t> static_size(const sym::Expr& e) { return e.as_integer(); }

// A constant float32 buffer viewed whole and contiguous, or nullptr.
const ir::Buffer* whole_constant(const ir::Program& program, const ir::View& view) {
  const ir::Buffer* b = program.find(view.buffer);
  if (b == nullptr || b->kind != ir::BufferKind::kConstant || b->dtype != DType::kFloat32 ||
      b->constant == nullptr || !view.layout.is_contiguous() ||
      view.layout.offset != sym::Expr(0) || view.layout.numel() != b->layout.numel()) {
    return nullptr;
  }
  return b;
}

// The problem of a convolution the choices implement, or nullopt.
std::optional<autotune::ConvProblem> template_problem(const ir::Program& program,
                                                      const ir::Buffer& conv) {
  const ir::ConvCall* call = conv.call.as<ir::ConvCall>();
  if (conv.kind != ir::BufferKind::kExtern || call == nullptr || conv.dtype != DType::kFloat32 ||
      call->applied_activation() != ir::ConvActivation::kNone || call->choice ||
      conv.call.inputs.size() < 2 || !conv.call.inputs[0] || !conv.call.inputs[1]) {
    return std::nullopt;
  }
  const ir::View& x = *conv.call.inputs[0];
  const ir::View& w = *conv.call.inputs[1];
  if (x.layout.rank() != 4 || w.layout.rank() != 4 || x.dtype != DType::kFloat32 ||
      !x.layout.is_contiguous() || !conv.layout.is_contiguous()) {
    return std::nullopt;
  }
  if (whole_constant(program, w) == nullptr) return std::nullopt;
  if (conv.call.inputs.size() > 2 && conv.call.inputs[2] &&
      whole_constant(program, *conv.call.inputs[2]) == nullptr) {
    return std::nullopt;
  }
  std::vector<int64_t> xs, ws;
  for (size_t d = 0; d < 4; ++d) {
    std::optional<int64_t> a = static_size(x.layout.sizes[d]), b = static_size(w.layout.sizes[d]);
    if (!a || !b) return std::nullopt;
    xs.push_back(*a);
    ws.push_back(*b);
  }
  const std::vector<int64_t>&strides = call->strides, &pads = call->pads,
        &dilations = call->dilations;
  autotune::ConvProblem p;
  // A channels-last call's X is [N, H, W, C] and its output [N, OH, OW, M].
  p.channels_last = call->channels_last;
  const size_t c_dim = p.channels_last ? 3 : 1, h_dim = p.channels_last ? 1 : 2;
  p.n = xs[0];
  p.c = xs[c_dim];
  p.h = xs[h_dim];
  p.w = xs[h_dim + 1];
  p.m = ws[0];
  p.kh = ws[2];
  p.kw = ws[3];
  p.group = call->group;
  // Group 1, depthwise (one input channel per group), or any group channels-last (whose only
  // choice is oneDNN); other NCHW groups stay with oneDNN.
  if (p.group != 1 && p.group != p.c && !p.channels_last) return std::nullopt;
  if (ws[1] * p.group != p.c || p.m % p.group != 0) return std::nullopt;
  if (strides.size() == 2) std::tie(p.stride_h, p.stride_w) = std::tie(strides[0], strides[1]);
  if (dilations.size() == 2) {
    std::tie(p.dilation_h, p.dilation_w) = std::tie(dilations[0], dilations[1]);
  }
  if (pads.size() == 4) {
    p.pad_top = pads[0];
    p.pad_left = pads[1];
    p.pad_bottom = pads[2];
    p.pad_right = pads[3];
  }
  if (p.n <= 0 || p.c <= 0 || p.h <= 0 || p.w <= 0 || p.m <= 0 || p.oh() <= 0 || p.ow() <= 0)
    return std::nullopt;
  if (static_size(conv.layout.sizes[h_dim]) != p.oh() ||
      static_size(conv.layout.sizes[h_dim + 1]) != p.ow())
    return std::nullopt;
  return p;
}

bool is_read(const ir::Program& program, const std::string& name) {
  for (const ir::OutputSpec& o : program.outputs) {
    if (o.buffer == name) return true;
  }
  for (const auto& b : program.buffers) {
    const std::vector<std::string> reads = b->reads();
    if (std::find(reads.begin(), reads.end(), name) != reads.end()) return true;
  }
  return false;
}

autotune::ConvChoicePtr choose(const autotune::ConvProblem& problem,
                               const LoweringOptions& options) {
  // A forced choice names an NCHW implementation: a channels-last convolution takes its
  // heuristic choice instead, unless oneDNN is forced (it takes either layout).
  if (problem.channels_last && !options.conv_choice.empty() && options.conv_choice != "onednn") {
    autotune::ConvSelectRequest request;
    request.problem = problem;
    request.threads = options.threads;
    request.mode = autotune::AutotuneMode::kOff;
    request.code_cache_dir = options.code_cache_dir;
    request.isa = options.template_isa;
    return autotune::select_conv(request).choice;
  }
  if (options.conv_choice == "template") {
    const std::optional<autotune::ConvConfig> config = autotune::conv_default_config(
        problem, options.threads, options.template_isa.value_or(autotune::host_template_isa()));
    if (config) return autotune::make_conv_template_choice(*config, problem);
    return autotune::make_conv_onednn_choice(problem);
  }
  if (!options.conv_choice.empty()) return autotune::make_conv_choice(options.conv_choice, problem);
  autotune::ConvSelectRequest request;
  request.problem = problem;
  request.threads = options.threads;
  request.mode = options.autotune;
  request.code_cache_dir = options.code_cache_dir;
  request.isa = options.template_isa;
  return autotune::select_conv(request).choice;
}

}  // namespace

int select_conv_choices(ir::Program& program, const LoweringOptions& options) {
  int selected = 0;
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    ir::Buffer& conv = *program.buffers[i];
    const std::optional<autotune::ConvProblem> problem = template_problem(program, conv);
    if (!problem) continue;
    const autotune::ConvChoicePtr choice = choose(*problem, options);
    if (choice->name() == "onednn") continue;

    const ir::Buffer* w = program.find(conv.call.inputs[1]->buffer);
    const ir::Buffer* b = conv.call.inputs.size() > 2 && conv.call.inputs[2]
                              ? program.find(conv.call.inputs[2]->buffer)
                              : nullptr;
    const std::vector<float> prepared = choice->prepare(
        w->constant->values<float>().data(), b ? b->constant->values<float>().data() : nullptr);
    std::shared_ptr<const graph::Tensor> tensor = prepared_weight(options, prepared);
    w->constant->release_pages();  // read whole to prepare it (external data: mapped)
    auto weight = std::make_unique<ir::Buffer>();
    weight->name = conv.name + "_w";
    weight->kind = ir::BufferKind::kConstant;
    weight->dtype = DType::kFloat32;
    weight->layout = ir::Layout::contiguous({sym::Expr(static_cast<int64_t>(prepared.size()))});
    weight->constant = tensor;
    const std::set<std::string> old = {w->name, b ? b->name : w->name};
    conv.call.inputs = {conv.call.inputs[0],
                        ir::View{weight->name, DType::kFloat32, weight->layout}};
    conv.call.as<ir::ConvCall>()->choice = choice;
    program.buffers.insert(program.buffers.begin() + static_cast<std::ptrdiff_t>(i),
                           std::move(weight));
    ++i;
    // The plain weight and bias are dead unless something else reads them.
    for (const std::string& name : old) {
      if (is_read(program, name)) continue;
      auto it = std::find_if(program.buffers.begin(), program.buffers.end(),
                             [&](const auto& buffer) { return buffer->name == name; });
      if (it == program.buffers.end()) continue;
      if (it - program.buffers.begin() <= static_cast<std::ptrdiff_t>(i)) --i;
      program.buffers.erase(it);
    }
    log::write(log::Category::kAutotune, "{}: {} runs as '{}'", conv.name, problem->text(),
               choice->name());
    ++selected;
  }
  return selected;
}

}  // namespace kiln::lower
