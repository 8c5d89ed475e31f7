// Issue 14: OpenBLAS products cut into blocks on Kiln's pool (kiln_rt_pool.h's parallel_gemm,
// which cuts C along the larger of M and N, gemm_by_rows). One model holds MatMuls of two inputs
// (so no template takes them; each is kiln_rt::gemm, an OpenBLAS sgemm per block) at odd sizes
// that take every way of cutting: rows with a partial last block (131 x 67 x 45, 600 x 100 x 7),
// columns with a partial last block (37 x 129 x 301, 1 x 515 x 1001), and the narrow case where
// neither axis has two full units (13 x 2049 x 23, cut by columns). It is compiled once and run
// with 1, 2, 3 and 4 threads; each output is checked against a double-precision loop here, with
// the float32 tolerance 1e-5 relative + 1e-6 x K absolute (a sum of K products of values in
// [-1, 1]: float32 rounding grows with K). Not timed.

#include <omp.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "graph/graph.h"
#include "model_builder.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;
using graph::Value;

struct Shape {
  int64_t m, k, n;
};
const std::vector<Shape> kShapes = {
    {131, 67, 45}, {600, 100, 7}, {37, 129, 301}, {1, 515, 1001}, {13, 2049, 23}};

Tensor filled(std::vector<int64_t> dims, int64_t salt) {
  Tensor t(DType::kFloat32, std::move(dims));
  auto v = t.mutable_values<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(std::sin(0.61 * static_cast<double>(i) + 0.7 * salt));
  }
  return t;
}

TEST(ParallelGemm, OddSizesMatchADoubleReferenceAtOneToFourThreads) {
  test_models::ModelBuilder builder;
  std::vector<Tensor> inputs;
  for (size_t s = 0; s < kShapes.size(); ++s) {
    const Shape& sh = kShapes[s];
    const std::string id = std::to_string(s);
    Value* a = builder.input("a" + id, DType::kFloat32, {sh.m, sh.k});
    Value* b = builder.input("b" + id, DType::kFloat32, {sh.k, sh.n});
    builder.output(builder.op("MatMul", {a, b}, {}, "product" + id));
    inputs.push_back(filled({sh.m, sh.k}, 2 * static_cast<int64_t>(s)));
    inputs.push_back(filled({sh.k, sh.n}, 2 * static_cast<int64_t>(s) + 1));
  }
  CompileOptions options;
  options.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "driver" / "parallel_gemm";
  omp_set_num_threads(2);
  CompiledModel compiled = compile(std::move(builder.model), options);

  // The products, in double precision.
  std::vector<std::vector<double>> want;
  for (size_t s = 0; s < kShapes.size(); ++s) {
    const Shape& sh = kShapes[s];
    auto a = inputs[2 * s].values<float>(), b = inputs[2 * s + 1].values<float>();
    std::vector<double> c(static_cast<size_t>(sh.m * sh.n));
    for (int64_t i = 0; i < sh.m; ++i) {
      for (int64_t j = 0; j < sh.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < sh.k; ++p) acc += double{a[i * sh.k + p]} * b[p * sh.n + j];
        c[i * sh.n + j] = acc;
      }
    }
    want.push_back(std::move(c));
  }

  for (int threads = 1; threads <= 4; ++threads) {
    omp_set_num_threads(threads);  // the run's thread count: the calling thread's setting
    const std::vector<Tensor> out = compiled.run(inputs);
    ASSERT_EQ(out.size(), kShapes.size());
    for (size_t s = 0; s < kShapes.size(); ++s) {
      const Shape& sh = kShapes[s];
      ASSERT_EQ(out[s].numel(), sh.m * sh.n);
      auto got = out[s].values<float>();
      for (size_t i = 0; i < want[s].size(); ++i) {
        ASSERT_NEAR(got[i], want[s][i], 1e-5 * std::abs(want[s][i]) + 1e-6 * sh.k)
            << sh.m << " x " << sh.k << " x " << sh.n << " at " << threads << " threads, element "
            << i;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::driver
