#include "ir/buffer.h"

#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <algorithm>

#include "support/error.h"

namespace kiln::ir {

Layout Layout::contiguous(std::vector<sym::Expr> sizes) {
  Layout layout;
  layout.strides.resize(sizes.size());
  sym::Expr stride = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    layout.strides[k] = stride;
    stride = stride * sizes[k];
  }
  layout.sizes = std::move(sizes);
  layout.offset = 0;
  return layout;
}

sym::Expr Layout::numel() const { return sym::product(sizes); }

sym::Expr Layout::storage_size() const {
  sym::Expr extent = offset + 1;
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto size = sizes[k].as_integer();
    if (size && *size == 0) return 0;
    extent = extent + (sizes[k] - 1) * strides[k];
  }
  return extent;
}

sym::Expr Layout::index(const std::vector<sym::Expr>& indices) const {
  KILN_CHECK(indices.size() == sizes.size(), "index rank {} for layout rank {}", indices.size(),
             sizes.size());
  return offset + sym::dot(indices, strides);
}

bool Layout::is_contiguous() const {
  if (offset != sym::Expr(0)) return false;
  Layout c = contiguous(sizes);
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == sym::Expr(1)) continue;  // the stride of a size-1 dim never matters
    if (strides[k] != c.strides[k]) return false;
  }
  return true;
}

std::vector<std::string> Buffer::reads() const {
  std::vector<std::string> names;
  if (kind == BufferKind::kComputed) {
    names = body.loaded_buffers();
  } else if (kind == BufferKind::kExtern) {
    for (const auto& in : call.inputs) {
      if (in) names.push_back(in->buffer);
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
  }
  return names;
}

void Buffer::add_origin(const Origin& origin) {
  auto it = std::lower_bound(origins.begin(), origins.end(), origin);
  if (it == origins.end() || !(*it == origin)) origins.insert(it, origin);
}

std::vector<std::string> dynamic_size_sources(const Program& program, const Buffer& buffer) {
  if (program.dynamic_sizes.empty()) return {};
  std::set<std::string> symbols;
  auto add = [&](const sym::Expr& e) {
    for (const sym::Expr& s : sym::free_symbols(e)) symbols.insert(s.name());
  };
  auto add_layout = [&](const Layout& l) {
    for (const sym::Expr& e : l.sizes) add(e);
    for (const sym::Expr& e : l.strides) add(e);
    add(l.offset);
  };
  add_layout(buffer.layout);
  if (buffer.kind == BufferKind::kComputed) {
    for (const sym::Expr& e : buffer.body.sizes()) add(e);
    for (const sym::Expr& e : buffer.body.reduce_sizes()) add(e);
    for (const Op& op : buffer.body.ops()) add(op.index);
  } else if (buffer.kind == BufferKind::kExtern) {
    for (const auto& in : buffer.call.inputs) {
      if (in) add_layout(in->layout);
    }
  }
  std::vector<std::string> sources;
  for (const DynamicSize& d : program.dynamic_sizes) {
    if (symbols.count(d.symbol) && d.buffer != buffer.name) sources.push_back(d.buffer);
  }
  std::sort(sources.begin(), sources.end());
  sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
  return sources;
}

bool is_control_flow(const Buffer& buffer) {
  const LibraryCall& op = buffer.call.op;
  return buffer.kind == BufferKind::kExtern &&
         (std::holds_alternative<IfCall>(op) || std::holds_alternative<LoopCall>(op) ||
          std::holds_alternative<ScanCall>(op));
}

bool is_control_flow_result(const Buffer& buffer) {
  return buffer.kind == BufferKind::kExtern && buffer.call.as<ControlResultCall>() != nullptr;
}

Buffer* Program::find(const std::string& name) const {
  for (const auto& b : buffers) {
    if (b->name == name) return b.get();
  }
  return nullptr;
}

}  // namespace kiln::ir
