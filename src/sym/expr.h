#pragma once
/// Symbolic integer expressions: Kiln's counterpart of sympy as Inductor uses it for sizes,
/// strides and indices. Expressions are immutable, structurally shared, and always in canonical
/// form: the builders below fold constants and combine like terms, so equal expressions compare
/// and hash equal. Range-dependent rewriting (FloorDiv/Mod under known bounds) is done by
/// sym::Analyzer (analyzer.h).
///
/// Semantics: FloorDiv and Mod are floor division and the matching modulo (Python's // and %;
/// the sign of Mod follows the divisor). CeilDiv(a, b) = -FloorDiv(-a, b). ModularIndexing(x, d,
/// m) = FloorDiv(x, d) Mod m, the shape of flattened tensor indices.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::sym {

enum class ExprKind : uint8_t {
  kInteger,
  kSymbol,
  kAdd,
  kMul,
  kFloorDiv,
  kCeilDiv,
  kMod,
  kModularIndexing,
  kMin,
  kMax,
};

/// What a symbol stands for. Size symbols are tensor dimensions (>= 0; zero-size tensors occur);
/// index symbols are loop variables whose range is given to an Analyzer; unbacked symbols are sizes
/// known only at run time from data (NonZero, Unique...), also >= 0.
enum class SymbolKind : uint8_t { kSize, kIndex, kUnbacked };

class ExprNode;

/// A handle to an immutable canonical expression. Cheap to copy. Default-constructed is 0.
class Expr {
 public:
  Expr();
  Expr(int64_t value);  // NOLINT: implicit, so `x * 4 + 1` reads naturally
  Expr(int value) : Expr(static_cast<int64_t>(value)) {}  // NOLINT

  /// A symbol; the same name and kind always give an equal Expr.
  static Expr symbol(std::string_view name, SymbolKind kind = SymbolKind::kSize);

  ExprKind kind() const;
  bool is_integer() const { return kind() == ExprKind::kInteger; }
  bool is_symbol() const { return kind() == ExprKind::kSymbol; }
  /// The value of an integer literal, nullopt otherwise.
  std::optional<int64_t> as_integer() const;
  /// Symbol name (kSymbol only).
  const std::string& name() const;
  SymbolKind symbol_kind() const;
  /// Operands: Add/Mul terms in canonical order, FloorDiv/CeilDiv/Mod (a, b),
  /// ModularIndexing (x, div, mod), Min/Max operands.
  const std::vector<Expr>& args() const;

  size_t hash() const;
  bool operator==(const Expr& other) const;
  bool operator!=(const Expr& other) const { return !(*this == other); }
  /// A total, deterministic order (structural; never pointer-based).
  bool operator<(const Expr& other) const;

  /// Canonical readable form, e.g. "4*x + (i // 3) % 5". Also the reuse-key text.
  std::string str() const;

  const ExprNode* node() const { return node_.get(); }

 private:
  explicit Expr(std::shared_ptr<const ExprNode> node) : node_(std::move(node)) {}
  friend class ExprBuilder;
  std::shared_ptr<const ExprNode> node_;
};

Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator-(const Expr& a);
Expr operator*(const Expr& a, const Expr& b);
Expr& operator+=(Expr& a, const Expr& b);
Expr& operator*=(Expr& a, const Expr& b);
Expr floor_div(const Expr& a, const Expr& b);
Expr ceil_div(const Expr& a, const Expr& b);
Expr mod(const Expr& a, const Expr& b);
Expr modular_indexing(const Expr& x, const Expr& div, const Expr& mod);
Expr min(const Expr& a, const Expr& b);
Expr max(const Expr& a, const Expr& b);

/// Product and dot product of lists (1 and 0 for empty lists).
Expr product(const std::vector<Expr>& values);
Expr dot(const std::vector<Expr>& a, const std::vector<Expr>& b);

/// Free symbols, sorted by name (deterministic).
std::vector<Expr> free_symbols(const Expr& e);
bool has_symbol(const Expr& e, const Expr& symbol);
/// True when every symbol of `e` is an index variable (no size or unbacked symbol).
bool only_index_symbols(const Expr& e);

/// Replaces symbols by expressions (simultaneously) and re-canonicalizes.
using Substitution = std::map<Expr, Expr>;
Expr substitute(const Expr& e, const Substitution& replacements);

/// Values for symbols, by name.
using Binding = std::map<std::string, int64_t, std::less<>>;
/// Evaluates under a binding; throws InternalError when a symbol is unbound or on division by 0.
int64_t evaluate(const Expr& e, const Binding& binding);

/// The C++ (and CUDA) identifier of a symbol: index symbols (loop variables Kiln names) as they
/// are; size and unbacked symbols, whose names may come from the model's dim params, through
/// kiln::identifier under the prefix "s" ("batch" -> "s_batch", "p2o.Dim.0" ->
/// "sxp2o_2eDim_2e0"), so that they are valid, distinct and never clash with Kiln's own names.
std::string cpp_identifier(const Expr& symbol);
/// The C++ identifier of the size symbol named `name` (as cpp_identifier spells it).
std::string size_identifier(std::string_view name);

/// C++ expression text (int64_t arithmetic). FloorDiv/Mod print as plain `/` and `%` only when
/// `nonnegative_operands` says both operands are known >= 0 (the common case for indices);
/// otherwise as calls to kiln_floordiv / kiln_mod / kiln_ceildiv, which the generated code's
/// prelude defines. Symbols print as `cpp_identifier` spells them.
std::string to_cpp(const Expr& e, const std::function<bool(const Expr&)>& nonnegative = {});
/// CUDA expression text; same rules as to_cpp.
std::string to_cuda(const Expr& e, const std::function<bool(const Expr&)>& nonnegative = {});

}  // namespace kiln::sym

template <>
struct std::hash<kiln::sym::Expr> {
  size_t operator()(const kiln::sym::Expr& e) const { return e.hash(); }
};
