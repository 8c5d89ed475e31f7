#include "sched/kernel_group.h"

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/error.h"

namespace kiln::sched {
namespace {

sym::Expr loop_var(size_t k) {
  return sym::Expr::symbol(fmt::format("x{}", k), sym::SymbolKind::kIndex);
}

std::string dims_str(const std::vector<sym::Expr>& dims) {
  std::string out = "[";
  for (size_t k = 0; k < dims.size(); ++k) {
    if (k) out += ", ";
    out += dims[k].str();
  }
  out += "]";
  return out;
}

bool is_one(const sym::Expr& e, const sym::Analyzer& facts) {
  return facts.statically_known_equal(e, 1);
}

bool same_dims(const std::vector<sym::Expr>& a, const std::vector<sym::Expr>& b,
               const sym::Analyzer& facts) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (!facts.statically_known_equal(a[k], b[k])) return false;
  }
  return true;
}

// Positions of the dims that are not statically 1.
std::vector<size_t> non_unit_dims(const std::vector<sym::Expr>& dims, const sym::Analyzer& facts) {
  std::vector<size_t> kept;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (!is_one(dims[k], facts)) kept.push_back(k);
  }
  return kept;
}

// Maps source variables over `src_sizes` onto target variables over `dst_sizes` (equal numel):
// one to one where the dims agree (ignoring size-1 dims), else through the row-major linear index.
void map_block(const std::vector<sym::Expr>& src_vars, const std::vector<sym::Expr>& src_sizes,
               const std::vector<sym::Expr>& dst_vars, const std::vector<sym::Expr>& dst_sizes,
               const sym::Analyzer& facts, sym::Substitution& out) {
  std::vector<size_t> src_kept = non_unit_dims(src_sizes, facts);
  std::vector<size_t> dst_kept = non_unit_dims(dst_sizes, facts);
  bool direct = src_kept.size() == dst_kept.size();
  for (size_t k = 0; direct && k < src_kept.size(); ++k) {
    direct = facts.statically_known_equal(src_sizes[src_kept[k]], dst_sizes[dst_kept[k]]);
  }
  if (direct) {
    for (size_t k = 0; k < src_vars.size(); ++k) out[src_vars[k]] = 0;
    for (size_t k = 0; k < src_kept.size(); ++k) out[src_vars[src_kept[k]]] = dst_vars[dst_kept[k]];
    return;
  }
  sym::Expr linear = 0;
  for (size_t k = 0; k < dst_vars.size(); ++k) linear = linear * dst_sizes[k] + dst_vars[k];
  sym::Expr stride = 1;
  for (size_t k = src_vars.size(); k-- > 0;) {
    out[src_vars[k]] = k == 0 ? sym::floor_div(linear, stride)
                              : sym::modular_indexing(linear, stride, src_sizes[k]);
    stride = stride * src_sizes[k];
  }
}

std::vector<sym::Expr> slice(const std::vector<sym::Expr>& v, size_t from, size_t to) {
  return std::vector<sym::Expr>(v.begin() + static_cast<std::ptrdiff_t>(from),
                                v.begin() + static_cast<std::ptrdiff_t>(to));
}

// A pointwise body over P x R: split its dims where the leading product equals P, else flatten
// its whole index space onto (P, R).
sym::Substitution map_inner_pointwise(const ir::LoopBody& body, const KernelGroup& group,
                                      const sym::Analyzer& facts) {
  sym::Substitution map;
  const auto& sizes = body.sizes();
  sym::Expr lead = 1;
  for (size_t k = 0; k <= sizes.size(); ++k) {
    if (k > 0) lead = lead * sizes[k - 1];
    if (!facts.statically_known_equal(lead, group.numel())) continue;
    map_block(slice(body.vars(), 0, k), slice(sizes, 0, k), group.vars, group.sizes, facts, map);
    map_block(slice(body.vars(), k, sizes.size()), slice(sizes, k, sizes.size()), group.reduce_vars,
              group.reduce_sizes, facts, map);
    return map;
  }
  std::vector<sym::Expr> all_vars = group.vars;
  all_vars.insert(all_vars.end(), group.reduce_vars.begin(), group.reduce_vars.end());
  std::vector<sym::Expr> all_sizes = group.sizes;
  all_sizes.insert(all_sizes.end(), group.reduce_sizes.begin(), group.reduce_sizes.end());
  map_block(body.vars(), sizes, all_vars, all_sizes, facts, map);
  return map;
}

}  // namespace

sym::Analyzer KernelGroup::analyzer(const sym::Analyzer& facts) const {
  sym::Analyzer a = facts;
  for (size_t k = 0; k < vars.size(); ++k) a.bind_index(vars[k], sizes[k]);
  for (size_t k = 0; k < reduce_vars.size(); ++k) a.bind_index(reduce_vars[k], reduce_sizes[k]);
  return a;
}

std::string KernelGroup::str() const {
  if (!is_reduction()) return dims_str(sizes);
  return fmt::format("{} x {}", dims_str(sizes), dims_str(reduce_sizes));
}

KernelGroup make_group(std::vector<sym::Expr> sizes, std::vector<sym::Expr> reduce_sizes) {
  KernelGroup g;
  g.sizes = std::move(sizes);
  g.reduce_sizes = std::move(reduce_sizes);
  for (size_t k = 0; k < g.sizes.size(); ++k) g.vars.push_back(loop_var(k));
  for (size_t k = 0; k < g.reduce_sizes.size(); ++k) {
    g.reduce_vars.push_back(loop_var(g.sizes.size() + k));
  }
  return g;
}

KernelGroup group_of(const ir::Buffer& buffer) {
  KILN_CHECK(buffer.kind == ir::BufferKind::kComputed, "group of non-computed buffer {}",
             buffer.name);
  return make_group(buffer.body.sizes(), buffer.body.reduce_sizes());
}

std::optional<KernelGroup> merge_groups(const KernelGroup& a, const KernelGroup& b,
                                        const sym::Analyzer& facts, std::string* reason) {
  auto refuse = [&](std::string why) -> std::optional<KernelGroup> {
    if (reason) *reason = std::move(why);
    return std::nullopt;
  };
  if (a.is_reduction() && b.is_reduction()) {
    if (facts.statically_known_equal(a.numel(), b.numel()) &&
        facts.statically_known_equal(a.reduce_numel(), b.reduce_numel())) {
      return a;
    }
    return refuse(fmt::format("reduction sizes differ: {} vs {}", a.str(), b.str()));
  }
  if (!a.is_reduction() && !b.is_reduction()) {
    if (facts.statically_known_equal(a.numel(), b.numel())) return a;
    return refuse(fmt::format("sizes differ: {} vs {}", a.str(), b.str()));
  }
  const KernelGroup& red = a.is_reduction() ? a : b;
  const KernelGroup& pw = a.is_reduction() ? b : a;
  if (facts.statically_known_equal(pw.numel(), red.numel() * red.reduce_numel()) ||
      facts.statically_known_equal(pw.numel(), red.numel())) {
    return red;
  }
  return refuse(
      fmt::format("pointwise size {} fits neither P nor P x R of {}", pw.str(), red.str()));
}

std::optional<KernelMember> map_member(const ir::Buffer& buffer, const KernelGroup& group,
                                       const sym::Analyzer& facts) {
  KILN_CHECK(buffer.kind == ir::BufferKind::kComputed, "kernel member {} is not computed",
             buffer.name);
  const ir::LoopBody& body = buffer.body;
  KernelMember m;
  m.buffer = &buffer;
  sym::Expr numel = sym::product(body.sizes());
  if (body.is_reduction()) {
    if (!facts.statically_known_equal(numel, group.numel()) ||
        !facts.statically_known_equal(sym::product(body.reduce_sizes()), group.reduce_numel())) {
      return std::nullopt;
    }
    m.kind = MemberKind::kReduction;
    map_block(body.vars(), body.sizes(), group.vars, group.sizes, facts, m.var_map);
    map_block(body.reduce_vars(), body.reduce_sizes(), group.reduce_vars, group.reduce_sizes, facts,
              m.var_map);
    return m;
  }
  bool fits_outer = facts.statically_known_equal(numel, group.numel());
  if (!group.is_reduction() || (fits_outer && same_dims(body.sizes(), group.sizes, facts))) {
    if (!fits_outer) return std::nullopt;
    m.kind = MemberKind::kPointwiseOuter;
    map_block(body.vars(), body.sizes(), group.vars, group.sizes, facts, m.var_map);
    return m;
  }
  if (facts.statically_known_equal(numel, group.numel() * group.reduce_numel())) {
    m.kind = MemberKind::kPointwiseInner;
    m.var_map = map_inner_pointwise(body, group, facts);
    return m;
  }
  if (!fits_outer) return std::nullopt;
  m.kind = MemberKind::kPointwiseOuter;
  map_block(body.vars(), body.sizes(), group.vars, group.sizes, facts, m.var_map);
  return m;
}

sym::Expr to_group_index(const sym::Expr& index, const KernelMember& member,
                         const sym::Analyzer& group_analyzer) {
  return group_analyzer.simplify(sym::substitute(index, member.var_map));
}

}  // namespace kiln::sched
