/// Expr handles and nodes: construction, hashing, structural order, traversal, substitution and
/// evaluation. Canonicalizing builders live in builders.cpp, printers in printer.cpp.

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/error.h"
#include "sym/expr_node.h"

namespace kiln::sym {
namespace {

// splitmix64 finalizer: a deterministic mixer, so hashes do not depend on the run.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t hash_string(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

std::shared_ptr<const ExprNode> make_integer_node(int64_t value) {
  auto node = std::make_shared<ExprNode>();
  node->kind = ExprKind::kInteger;
  node->value = value;
  node->hash = mix(mix(static_cast<uint64_t>(ExprKind::kInteger)) ^ static_cast<uint64_t>(value));
  return node;
}

constexpr int64_t kCachedMin = -16;
constexpr int64_t kCachedMax = 256;

// Small literals are shared. The table is built once, thread-safely (function-local static),
// and never changes afterwards.
const std::shared_ptr<const ExprNode>& cached_integer(int64_t value) {
  static const auto table = [] {
    std::array<std::shared_ptr<const ExprNode>, kCachedMax - kCachedMin + 1> t;
    for (int64_t v = kCachedMin; v <= kCachedMax; ++v) t[v - kCachedMin] = make_integer_node(v);
    return t;
  }();
  return table[value - kCachedMin];
}

void collect_symbols(const Expr& e, std::set<Expr>& out) {
  if (e.is_symbol()) {
    out.insert(e);
    return;
  }
  for (const Expr& a : e.args()) collect_symbols(a, out);
}

[[noreturn]] void overflow(const char* op, int64_t a, int64_t b) {
  internal_error("int64 overflow in symbolic {}: {} and {}", op, a, b);
}

}  // namespace

Expr ExprBuilder::integer(int64_t value) {
  if (value >= kCachedMin && value <= kCachedMax) return Expr(cached_integer(value));
  return Expr(make_integer_node(value));
}

Expr ExprBuilder::symbol(std::string_view name, SymbolKind kind) {
  KILN_CHECK(!name.empty(), "symbol name must not be empty");
  auto node = std::make_shared<ExprNode>();
  node->kind = ExprKind::kSymbol;
  node->symbol_kind = kind;
  node->name = std::string(name);
  node->hash = mix(mix(static_cast<uint64_t>(ExprKind::kSymbol)) ^ hash_string(name) ^
                   (static_cast<uint64_t>(kind) << 56));
  return Expr(std::move(node));
}

Expr ExprBuilder::node(ExprKind kind, std::vector<Expr> args) {
  KILN_CHECK(kind != ExprKind::kInteger && kind != ExprKind::kSymbol,
             "ExprBuilder::node needs a compound kind");
  auto node = std::make_shared<ExprNode>();
  node->kind = kind;
  uint64_t h = mix(static_cast<uint64_t>(kind) + 0x51);
  for (const Expr& a : args) h = mix(h ^ a.hash());
  node->hash = h;
  node->args = std::move(args);
  return Expr(std::move(node));
}

Expr::Expr() : node_(cached_integer(0)) {}
Expr::Expr(int64_t value) : Expr(ExprBuilder::integer(value)) {}

Expr Expr::symbol(std::string_view name, SymbolKind kind) {
  return ExprBuilder::symbol(name, kind);
}

ExprKind Expr::kind() const { return node_->kind; }

std::optional<int64_t> Expr::as_integer() const {
  if (!is_integer()) return std::nullopt;
  return node_->value;
}

const std::string& Expr::name() const {
  KILN_CHECK(is_symbol(), "name() of a non-symbol expression {}", str());
  return node_->name;
}

SymbolKind Expr::symbol_kind() const {
  KILN_CHECK(is_symbol(), "symbol_kind() of a non-symbol expression {}", str());
  return node_->symbol_kind;
}

const std::vector<Expr>& Expr::args() const { return node_->args; }

size_t Expr::hash() const { return node_->hash; }

bool Expr::operator==(const Expr& other) const {
  if (node_ == other.node_) return true;
  if (node_->hash != other.node_->hash) return false;
  return compare(*this, other) == 0;
}

bool Expr::operator<(const Expr& other) const { return compare(*this, other) < 0; }

int compare(const Expr& a, const Expr& b) {
  const ExprNode* x = a.node();
  const ExprNode* y = b.node();
  if (x == y) return 0;
  if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
  switch (x->kind) {
    case ExprKind::kInteger:
      return x->value == y->value ? 0 : (x->value < y->value ? -1 : 1);
    case ExprKind::kSymbol:
      if (int c = x->name.compare(y->name); c != 0) return c < 0 ? -1 : 1;
      if (x->symbol_kind != y->symbol_kind) return x->symbol_kind < y->symbol_kind ? -1 : 1;
      return 0;
    default:
      break;
  }
  size_t n = std::min(x->args.size(), y->args.size());
  for (size_t i = 0; i < n; ++i) {
    if (int c = compare(x->args[i], y->args[i]); c != 0) return c;
  }
  if (x->args.size() != y->args.size()) return x->args.size() < y->args.size() ? -1 : 1;
  return 0;
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow("addition", a, b);
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow("multiplication", a, b);
  return r;
}

int64_t checked_neg(int64_t a) {
  if (a == std::numeric_limits<int64_t>::min()) overflow("negation", a, 0);
  return -a;
}

int64_t floor_div_int(int64_t a, int64_t b) {
  if (b == 0) internal_error("division by zero in symbolic floor division of {}", a);
  if (b == -1) return checked_neg(a);
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t mod_int(int64_t a, int64_t b) {
  if (b == 0) internal_error("division by zero in symbolic modulo of {}", a);
  if (b == -1) return 0;
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

int64_t ceil_div_int(int64_t a, int64_t b) {
  if (b == 0) internal_error("division by zero in symbolic ceiling division of {}", a);
  if (b == -1) return checked_neg(a);
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) == (b < 0))) ? q + 1 : q;
}

std::vector<Expr> free_symbols(const Expr& e) {
  std::set<Expr> symbols;  // Expr order sorts symbols by name, then kind
  collect_symbols(e, symbols);
  return {symbols.begin(), symbols.end()};
}

bool only_index_symbols(const Expr& e) {
  for (const Expr& s : free_symbols(e)) {
    if (s.symbol_kind() != SymbolKind::kIndex) return false;
  }
  return true;
}

bool has_symbol(const Expr& e, const Expr& symbol) {
  if (e == symbol) return true;
  for (const Expr& a : e.args()) {
    if (has_symbol(a, symbol)) return true;
  }
  return false;
}

Expr replace_subexprs(const Expr& e, const Substitution& replacements) {
  if (auto it = replacements.find(e); it != replacements.end()) return it->second;
  if (e.args().empty()) return e;
  std::vector<Expr> args;
  args.reserve(e.args().size());
  bool changed = false;
  for (const Expr& a : e.args()) {
    args.push_back(replace_subexprs(a, replacements));
    changed = changed || args.back().node() != a.node();
  }
  if (!changed) return e;
  return build(e.kind(), args);
}

Expr build(ExprKind kind, const std::vector<Expr>& args) {
  switch (kind) {
    case ExprKind::kAdd: {
      Expr sum = 0;
      for (const Expr& a : args) sum += a;
      return sum;
    }
    case ExprKind::kMul:
      return product(args);
    case ExprKind::kFloorDiv:
      return floor_div(args[0], args[1]);
    case ExprKind::kCeilDiv:
      return ceil_div(args[0], args[1]);
    case ExprKind::kMod:
      return mod(args[0], args[1]);
    case ExprKind::kModularIndexing:
      return modular_indexing(args[0], args[1], args[2]);
    case ExprKind::kMin:
    case ExprKind::kMax: {
      Expr r = args[0];
      for (size_t i = 1; i < args.size(); ++i) {
        r = kind == ExprKind::kMin ? min(r, args[i]) : max(r, args[i]);
      }
      return r;
    }
    default:
      internal_error("build: {} operands for a leaf kind {}", args.size(), static_cast<int>(kind));
  }
}

Expr substitute(const Expr& e, const Substitution& replacements) {
  return replace_subexprs(e, replacements);
}

int64_t evaluate(const Expr& e, const Binding& binding) {
  const auto& args = e.args();
  switch (e.kind()) {
    case ExprKind::kInteger:
      return *e.as_integer();
    case ExprKind::kSymbol: {
      auto it = binding.find(e.name());
      if (it == binding.end()) internal_error("evaluate: symbol {} is not bound", e.name());
      return it->second;
    }
    case ExprKind::kAdd: {
      int64_t r = 0;
      for (const Expr& a : args) r = checked_add(r, evaluate(a, binding));
      return r;
    }
    case ExprKind::kMul: {
      int64_t r = 1;
      for (const Expr& a : args) r = checked_mul(r, evaluate(a, binding));
      return r;
    }
    case ExprKind::kFloorDiv:
      return floor_div_int(evaluate(args[0], binding), evaluate(args[1], binding));
    case ExprKind::kCeilDiv:
      return ceil_div_int(evaluate(args[0], binding), evaluate(args[1], binding));
    case ExprKind::kMod:
      return mod_int(evaluate(args[0], binding), evaluate(args[1], binding));
    case ExprKind::kModularIndexing:
      return mod_int(floor_div_int(evaluate(args[0], binding), evaluate(args[1], binding)),
                     evaluate(args[2], binding));
    case ExprKind::kMin:
    case ExprKind::kMax: {
      int64_t r = evaluate(args[0], binding);
      for (size_t i = 1; i < args.size(); ++i) {
        int64_t v = evaluate(args[i], binding);
        r = e.kind() == ExprKind::kMin ? std::min(r, v) : std::max(r, v);
      }
      return r;
    }
  }
  internal_error("evaluate: unknown expression kind {}", static_cast<int>(e.kind()));
}

bool is_structurally_nonnegative(const Expr& e) {
  const auto& args = e.args();
  auto all = [&](size_t from) {
    for (size_t i = from; i < args.size(); ++i) {
      if (!is_structurally_nonnegative(args[i])) return false;
    }
    return true;
  };
  switch (e.kind()) {
    case ExprKind::kInteger:
      return *e.as_integer() >= 0;
    case ExprKind::kSymbol:
      return e.symbol_kind() != SymbolKind::kIndex;
    case ExprKind::kAdd:
    case ExprKind::kMul:
    case ExprKind::kFloorDiv:
    case ExprKind::kCeilDiv:
    case ExprKind::kMin:
      return all(0);
    case ExprKind::kMod:  // the result takes the divisor's sign
      return is_structurally_nonnegative(args[1]);
    case ExprKind::kModularIndexing:
      return is_structurally_nonnegative(args[2]);
    case ExprKind::kMax:
      for (const Expr& a : args) {
        if (is_structurally_nonnegative(a)) return true;
      }
      return false;
  }
  return false;
}

}  // namespace kiln::sym
