#include "sched/template_epilogue.h"

#include <algorithm>
#include <memory>
#include <set>

#include "support/log.h"

namespace kiln::sched {

namespace {

bool index_only(const sym::Expr& e) {
  for (const sym::Expr& s : sym::free_symbols(e)) {
    if (s.symbol_kind() != sym::SymbolKind::kIndex) return false;
  }
  return true;
}

/// Why `consumer` cannot be the epilogue of `product`, or "" when it can.
std::string refusal(const ir::Program& program, const ir::Buffer& product,
                    const ir::Buffer& consumer) {
  if (consumer.kind != ir::BufferKind::kComputed || consumer.is_reduction())
    return "the reader is not pointwise";
  if (consumer.dtype != graph::DType::kFloat32) return "the reader is not float32";
  const std::vector<sym::Expr>& sizes = product.layout.sizes;
  if (consumer.layout.sizes != sizes || !consumer.layout.is_contiguous())
    return "the reader's shape or layout differs";
  for (size_t d = 1; d + 1 < sizes.size(); ++d) {
    if (!sizes[d].is_integer()) return "a symbolic inner batch dim";
  }
  const ir::LoopBody& body = consumer.body;
  if (body.sizes() != sizes) return "the reader's loops differ";
  const sym::Expr identity = product.layout.index(body.vars());
  int stores = 0;
  for (const ir::Op& op : body.ops()) {
    if (op.code == ir::OpCode::kIndirect) return "indirect indexing";
    if (op.code == ir::OpCode::kIndexExpr && !index_only(op.index)) return "a symbolic index";
    if (op.code == ir::OpCode::kStore) {
      ++stores;
      if (op.index != consumer.layout.index(body.vars())) return "a non-contiguous store";
    }
    if (op.code != ir::OpCode::kLoad) continue;
    if (op.mask != ir::kNoValue) return "a masked load";
    if (!index_only(op.index)) return "a load with a symbolic index";
    if (op.buffer == product.name) {
      if (op.index != identity) return "the product is not read elementwise";
    } else if (op.buffer_dtype != graph::DType::kFloat32) {
      return "a load of a buffer other than float32";
    }
  }
  if (stores != 1) return "more than one store";
  if (!ir::dynamic_size_sources(program, consumer).empty()) return "a run-time size";
  return "";
}

}  // namespace

int fuse_template_epilogues(ir::Program& program) {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& o : program.outputs) outputs.insert(o.buffer);
  int fused = 0;
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    const ir::Buffer& product = *program.buffers[i];
    if (product.kind != ir::BufferKind::kExtern || product.call.kernel != "gemm" ||
        outputs.count(product.name)) {
      continue;
    }
    std::vector<ir::Buffer*> readers;
    for (const auto& b : program.buffers) {
      const std::vector<std::string> reads = b->reads();
      if (std::find(reads.begin(), reads.end(), product.name) != reads.end())
        readers.push_back(b.get());
    }
    if (readers.size() != 1) continue;
    ir::Buffer& consumer = *readers[0];
    if (std::string why = refusal(program, product, consumer); !why.empty()) {
      log::write(log::Category::kFusion, "template {}: epilogue {} refused: {}", product.name,
                 consumer.name, why);
      continue;
    }
    std::vector<std::string> loads = consumer.body.loaded_buffers();
    consumer.kind = ir::BufferKind::kExtern;
    consumer.call = product.call;
    if (product.call.attrs.count("product")) {  // the product has an epilogue already: chain
      consumer.call.epilogue_chain.push_back(std::make_shared<const ir::Buffer>(product));
    }
    consumer.call.attrs["product"] = product.name;
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
