#pragma once
/// Memory of the reference interpreter (interpreter.h): the storage of each buffer as Scalars,
/// layouts with their symbols evaluated, and the extern-kernel reference implementations.
/// Internal to the interpreter.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "ir/buffer.h"
#include "ir/interpreter_scalar.h"
#include "sym/expr.h"

namespace kiln::ir::interp {

/// The elements of one buffer, in the compute form of its dtype (float16 values held as the
/// exact float they round to). `written` catches reads of elements nothing stored.
struct Storage {
  graph::DType dtype = graph::DType::kFloat32;
  std::vector<Scalar> data;
  std::vector<bool> written;

  Storage() = default;
  Storage(graph::DType d, int64_t size)
      : dtype(d), data(static_cast<size_t>(size)), written(static_cast<size_t>(size), false) {}
  /// The element at flat index `k`; InternalError when out of bounds or never written.
  Scalar read(int64_t k, const std::string& name) const;
  /// Stores a value already in this storage's dtype; InternalError when out of bounds.
  void write(int64_t k, Scalar value, const std::string& name);
};

using Storages = std::map<std::string, Storage>;

/// A Layout with every symbol evaluated.
struct ConcreteLayout {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;

  int64_t numel() const;
  /// Elements the storage must hold (0 for empty layouts).
  int64_t storage_size() const;
  /// The flat index of a multi-index.
  int64_t at(const std::vector<int64_t>& index) const;
};

ConcreteLayout concretize(const Layout& layout, const sym::Binding& binding);
std::vector<int64_t> evaluate_all(const std::vector<sym::Expr>& exprs, const sym::Binding& binding);

/// Calls fn(index) for every multi-index below `sizes` in row-major order (once for rank 0,
/// never when a size is 0).
template <typename Fn>
void for_each_index(const std::vector<int64_t>& sizes, Fn&& fn) {
  for (int64_t s : sizes) {
    if (s <= 0) return;
  }
  std::vector<int64_t> index(sizes.size(), 0);
  for (;;) {
    fn(static_cast<const std::vector<int64_t>&>(index));
    size_t k = sizes.size();
    for (;;) {
      if (k == 0) return;
      --k;
      if (++index[k] < sizes[k]) break;
      index[k] = 0;
    }
  }
}

/// Runs an extern buffer's call ("matmul", "conv") into its storage.
void run_extern(const Buffer& buffer, Storages& storages, const sym::Binding& binding);

}  // namespace kiln::ir::interp
