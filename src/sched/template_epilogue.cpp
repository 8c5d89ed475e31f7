#include "sched/template_epilogue.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/log.h"

namespace kiln::sched {

sym::Expr elementwise_index(const ir::Program& program, const ir::Layout& layout,
                            const ir::LoopBody& body) {
  sym::Analyzer analyzer = program.analyzer;
  for (size_t k = 0; k < body.vars().size(); ++k)
    analyzer.bind_index(body.vars()[k], body.sizes()[k]);
  return analyzer.simplify(layout.index(body.vars()));
}

namespace {

// The buffers that read `name` (by a load of their body or as an input of their call).
std::vector<ir::Buffer*> readers_of(const ir::Program& program, const std::string& name) {
  std::vector<ir::Buffer*> readers;
  for (const auto& b : program.buffers) {
    const std::vector<std::string> reads = b->reads();
    if (std::find(reads.begin(), reads.end(), name) != reads.end()) readers.push_back(b.get());
  }
  return readers;
}

}  // namespace

int fuse_template_epilogues(ir::Program& program, const Backend& backend) {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& o : program.outputs) outputs.insert(o.buffer);
  int fused = 0;
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    const ir::Buffer& product = *program.buffers[i];
    // GEMM and a convolution with a choice (lower/conv_select.h: the template or im2col + GEMM)
    // take epilogues as IR; any other library call (a oneDNN convolution) only what its backend
    // fuses its own way (Backend::fuse_library_epilogue).
    if (product.kind != ir::BufferKind::kExtern || ir::is_control_flow(product) ||
        outputs.count(product.name)) {
      continue;
    }
    const ir::ConvCall* conv_call = product.call.as<ir::ConvCall>();
    const bool conv_choice = conv_call != nullptr && conv_call->choice != nullptr;
    const bool templated = product.call.as<ir::GemmCall>() != nullptr || conv_choice;
    const std::vector<ir::Buffer*> readers = readers_of(program, product.name);
    if (readers.size() != 1) continue;
    ir::Buffer& consumer = *readers[0];
    if (!templated) {  // a library call: the backend may take the reader its own way
      if (!backend.fuse_library_epilogue(program, product, consumer)) continue;
      log::write(log::Category::kFusion, "library call {}: {} fused into it by the backend",
                 product.name, consumer.name);
      program.buffers.erase(program.buffers.begin() + static_cast<std::ptrdiff_t>(i));
      --i;
      ++fused;
      continue;
    }
    if (std::string why = backend.template_epilogue_refusal(program, product, consumer);
        !why.empty()) {
      log::write(log::Category::kFusion, "template {}: epilogue {} refused: {}", product.name,
                 consumer.name, why);
      continue;
    }
    std::vector<std::string> loads = consumer.body.loaded_buffers();
    consumer.kind = ir::BufferKind::kExtern;
    consumer.call = product.call;
    if (!product.call.product.empty()) {  // the product has an epilogue already: chain
      consumer.call.epilogue_chain.push_back(std::make_shared<const ir::Buffer>(product));
    }
    consumer.call.product = product.name;
    for (const std::string& name : loads) {
      if (name == product.name ||
          std::any_of(consumer.call.inputs.begin(), consumer.call.inputs.end(),
                      [&](const auto& v) { return v->buffer == name; })) {
        continue;
      }
      const ir::Buffer* b = program.find(name);
      consumer.call.inputs.push_back(ir::View{name, b->dtype, b->layout});
    }
    for (const ir::Origin& o : product.origins) consumer.add_origin(o);
    log::write(log::Category::kFusion, "template {}: {} fused as its epilogue", product.name,
               consumer.name);
    program.buffers.erase(program.buffers.begin() + static_cast<std::ptrdiff_t>(i));
    --i;
    ++fused;
  }
  return fused;
}

int fuse_conv_prologues(ir::Program& program, const Backend& backend) {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& o : program.outputs) outputs.insert(o.buffer);
  auto choice_call = [](const ir::Buffer& b) {
    const ir::ConvCall* conv =
        b.kind == ir::BufferKind::kExtern ? b.call.as<ir::ConvCall>() : nullptr;
    return conv != nullptr && conv->choice != nullptr && b.call.prologue == nullptr;
  };
  auto position = [&](const std::string& name) {
    return std::find_if(program.buffers.begin(), program.buffers.end(),
                        [&](const auto& b) { return b->name == name; });
  };
  // From each convolution call (few) to the buffer it reads as X: no scan per buffer. Only
  // producers are erased, and a call with a prologue is no producer, so each call is still there
  // when its turn comes (the calls are in the program's order, producers first).
  std::vector<std::string> calls;
  for (const auto& b : program.buffers) {
    if (choice_call(*b)) calls.push_back(b->name);
  }
  int fused = 0;
  for (const std::string& name : calls) {
    ir::Buffer& consumer = **position(name);
    const std::vector<std::optional<ir::View>>& in = consumer.call.inputs;
    if (in.empty() || !in[0]) continue;
    const auto at = position(in[0]->buffer);
    if (at == program.buffers.end()) continue;
    const ir::Buffer& producer = **at;
    const bool pointwise = producer.kind == ir::BufferKind::kComputed && !producer.is_reduction();
    if (!(choice_call(producer) || pointwise) || outputs.count(producer.name)) continue;
    // X, and only X: the whole buffer as it is laid out, read by nothing else.
    const std::vector<std::string> loads = consumer.body.loaded_buffers();
    const bool x_only =
        in[0]->layout == producer.layout &&
        std::none_of(in.begin() + 1, in.end(),
                     [&](const auto& v) { return v && v->buffer == producer.name; }) &&
        std::find(loads.begin(), loads.end(), producer.name) == loads.end() &&
        readers_of(program, producer.name).size() == 1;
    if (!x_only) continue;
    if (std::string why = backend.conv_prologue_refusal(program, producer, consumer);
        !why.empty()) {
      log::write(log::Category::kFusion, "{}: not fused into convolution {}: {}", producer.name,
                 consumer.name, why);
      continue;
    }
    // The producer's operands in place of its output (a call's X first), then the rest of the
    // producer's operands after the consumer's own inputs.
    std::vector<std::optional<ir::View>> operands;
    if (pointwise) {
      for (const std::string& load : producer.body.loaded_buffers()) {
        const ir::Buffer* b = program.find(load);
        operands.emplace_back(ir::View{load, b->dtype, b->layout});
      }
    } else {
      operands = producer.call.inputs;
    }
    std::vector<std::optional<ir::View>> inputs = in;
    inputs[0] = operands.at(0);
    for (size_t k = 1; k < operands.size(); ++k) {
      const std::optional<ir::View>& v = operands[k];
      if (v && std::none_of(inputs.begin(), inputs.end(), [&](const auto& u) {
            return u && u->buffer == v->buffer && u->layout == v->layout;
          })) {
        inputs.push_back(v);
      }
    }
    consumer.call.inputs = std::move(inputs);
    consumer.call.prologue = std::make_shared<const ir::Buffer>(producer);
    for (const ir::Origin& o : producer.origins) consumer.add_origin(o);
    log::write(log::Category::kFusion, "{}: fused into convolution {} as its prologue",
               producer.name, consumer.name);
    program.buffers.erase(at);
    ++fused;
  }
  return fused;
}

}  // namespace kiln::sched
