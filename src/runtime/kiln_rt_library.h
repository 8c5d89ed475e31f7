#pragma once
// Kiln runtime: library-style kernels that do not fit the loop IR (selection, factorization).
// Inputs are contiguous; each function is called by the wrapper with the shapes it bound.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln_rt.h"

namespace kiln_rt {

/// TopK indices: for every slice of x along `axis` (shape[axis] elements, the other dims
/// outer/inner), the indices of its k largest (or smallest) elements, best first; equal values
/// keep their order (the lower index first), NaN counts as the largest.
template <typename T>
inline void topk_indices(const T* x, const int64_t* shape, int rank, int axis, int64_t k,
                         bool largest, int64_t* out) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (int d = axis + 1; d < rank; ++d) inner *= shape[d];
  const int64_t n = shape[axis];
  if (k > n)
    fail("TopK: k = %lld exceeds the axis size %lld", static_cast<long long>(k),
         static_cast<long long>(n));
#pragma omp parallel for collapse(2) if (outer * inner > 64)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const T* base = x + o * n * inner + i;
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      auto better = [&](int64_t a, int64_t b) {
        double va = static_cast<double>(base[a * inner]), vb = static_cast<double>(base[b * inner]);
        bool na = std::isnan(va), nb = std::isnan(vb);
        if (na || nb)
          return largest ? (na && !nb) || (na && nb && a < b) : (nb && !na) || (na && nb && a < b);
        if (va != vb) return largest ? va > vb : va < vb;
        return a < b;
      };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
      for (int64_t j = 0; j < k; ++j) out[(o * k + j) * inner + i] = order[static_cast<size_t>(j)];
    }
  }
}

}  // namespace kiln_rt
