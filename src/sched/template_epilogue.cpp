#include "sched/template_epilogue.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <set>

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

/// The pointwise chain `consumer` applies to a float32 convolution's product as oneDNN post-ops
/// (its count of Relus), or nullopt when the body is anything else. Only Relu: oneDNN's binary add
/// post-op (a residual Add) runs 1.5-4.5x slower than the convolution plus a separate kernel on
/// its plain-layout path (bench/conv_block_bench.cpp), so an Add stays a kernel of its own.
std::optional<int> conv_post_ops(const ir::Program& program, const ir::Buffer& product,
                                 const ir::Buffer& consumer) {
  if (product.dtype != graph::DType::kFloat32 || consumer.kind != ir::BufferKind::kComputed ||
      consumer.is_reduction() || consumer.dtype != graph::DType::kFloat32 ||
      consumer.layout.sizes != product.layout.sizes || !consumer.layout.is_contiguous() ||
      !product.layout.is_contiguous() || consumer.body.sizes() != product.layout.sizes) {
    return std::nullopt;
  }
  const ir::LoopBody& body = consumer.body;
  const sym::Expr identity = elementwise_index(program, product.layout, body);
  int relus = 0;
  std::optional<ir::ValueId> current;
  for (size_t id = 0; id < body.ops().size(); ++id) {
    const auto vid = static_cast<ir::ValueId>(id);
    const ir::Op& op = body.op(vid);
    if (op.code == ir::OpCode::kLoad && op.buffer == product.name && op.mask == ir::kNoValue &&
        op.index == identity && !current) {
      current = vid;
      continue;
    }
    if (!current) return std::nullopt;
    if (op.code == ir::OpCode::kRelu && op.operands[0] == *current) {
      ++relus;
      current = vid;
    } else if (op.code == ir::OpCode::kStore && op.operands[0] == *current &&
               op.index == elementwise_index(program, consumer.layout, body)) {
      return relus == 0 ? std::nullopt : std::optional<int>(relus);
    } else {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

/// A convolution's only reader that is a chain of Relus becomes the convolution call, with the
/// chain as oneDNN post-ops.
bool fuse_conv_post_ops(ir::Program& program, const ir::Buffer& product, ir::Buffer& consumer) {
  std::optional<int> relus = conv_post_ops(program, product, consumer);
  if (!relus) return false;
  consumer.kind = ir::BufferKind::kExtern;
  consumer.call = product.call;
  consumer.call.as<ir::ConvCall>()->relu_post_ops = *relus;
  for (const ir::Origin& o : product.origins) consumer.add_origin(o);
  return true;
}

}  // namespace

int fuse_template_epilogues(ir::Program& program, const Backend& backend) {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& o : program.outputs) outputs.insert(o.buffer);
  int fused = 0;
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    const ir::Buffer& product = *program.buffers[i];
    // A convolution with a choice (lower/conv_select.h: the template or im2col + GEMM) takes
    // epilogues as GEMM does; without one it is oneDNN's, which takes Relu post-ops.
    if (product.kind != ir::BufferKind::kExtern || outputs.count(product.name)) continue;
    const ir::ConvCall* conv_call = product.call.as<ir::ConvCall>();
    const bool conv_choice = conv_call != nullptr && conv_call->choice != nullptr;
    const bool conv = conv_call != nullptr && conv_call->relu_post_ops == 0 && !conv_choice;
    if (product.call.as<ir::GemmCall>() == nullptr && !conv && !conv_choice) continue;
    std::vector<ir::Buffer*> readers;
    for (const auto& b : program.buffers) {
      const std::vector<std::string> reads = b->reads();
      if (std::find(reads.begin(), reads.end(), product.name) != reads.end())
        readers.push_back(b.get());
    }
    if (readers.size() != 1) continue;
    ir::Buffer& consumer = *readers[0];
    if (conv) {
      if (!fuse_conv_post_ops(program, product, consumer)) continue;
      log::write(log::Category::kFusion, "conv {}: {} fused as oneDNN post-ops: {} Relu",
                 product.name, consumer.name, consumer.call.as<ir::ConvCall>()->relu_post_ops);
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

}  // namespace kiln::sched
