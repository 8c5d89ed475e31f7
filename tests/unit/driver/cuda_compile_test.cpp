// The CUDA backend without a GPU: the kernels of ONNX-suite models of every kernel shape
// (pointwise, broadcast, reductions with Welford and arg-extrema, softmax and layer norm fused,
// index arithmetic with min/max, float16 casts, a gather, and models with library calls on the
// host) compile through NVRTC for sm_80 and sm_90, and the wrapper embeds both cubins. With a
// GPU, a softmax runs on it and matches a reference computed here. Without the CUDA toolkit the
// tests skip, and compiling for --device cuda is refused with a clear error.

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda/nvrtc_compile.h"
#include "driver/compile.h"
#include "onnx/importer.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;

/// A temporary directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kiln-cuda-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

/// True when the CUDA driver finds a device (what the wrappers need to run).
bool has_cuda_device() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<int (*)(int*)>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  return init != nullptr && count != nullptr && init(0) == 0 && count(&n) == 0 && n > 0;
}

CompiledModel compile_for_cuda(const std::string& suite_case, const fs::path& dump) {
  graph::Model model = onnx::import_model(fs::path(KILN_TEST_DATA_DIR) / suite_case / "model.onnx");
  CompileOptions options;
  options.device = ir::Device::kCuda;
  options.dump_dir = dump;
  options.cache_dir = dump / "cache";
  return compile(model, options);
}

class CudaCompile : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaCompile, KernelsCompileForSm80AndSm90) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  // The cubins are cached under KILN_CACHE_DIR: a fresh one makes NVRTC run.
  setenv("KILN_CACHE_DIR", (dir.path / "cache").c_str(), 1);
  setenv("KILN_CUDA_ARCHS", "80,90", 1);
  CompiledModel compiled = compile_for_cuda(GetParam(), dir.path / "dump");
  unsetenv("KILN_CUDA_ARCHS");
  unsetenv("KILN_CACHE_DIR");
  const std::string wrapper = files::read(dir.path / "dump" / "5_wrapper.cpp");
  if (compiled.stats().kernels == 0) {
    EXPECT_EQ(wrapper.find("kCubin0"), std::string::npos);
    return;
  }
  EXPECT_NE(wrapper.find("{80, kCubin0}"), std::string::npos) << GetParam();
  EXPECT_NE(wrapper.find("{90, kCubin1}"), std::string::npos) << GetParam();
  EXPECT_NE(wrapper.find("static void launch_cuda_fused_"), std::string::npos) << GetParam();
  // The CUDA source NVRTC compiled is dumped beside the wrapper.
  const std::string cuda = files::read(dir.path / "dump" / "5_kernels.cu");
  EXPECT_NE(cuda.find("extern \"C\" __global__ void __launch_bounds__("), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Suite, CudaCompile,
    ::testing::Values("node/test_add_bcast", "node/test_softmax_axis_1",
                      "node/test_logsoftmax_axis_1",
                      "node/test_layer_normalization_3d_axis1_epsilon",
                      "node/test_reduce_log_sum_exp_default_axes_keepdims_random",
                      "node/test_argmax_default_axis_random", "node/test_averagepool_2d_ceil",
                      "node/test_batchnorm_epsilon", "node/test_cast_FLOAT_to_FLOAT16",
                      "node/test_gather_0", "node/test_matmul_2d"),
    [](const ::testing::TestParamInfo<const char*>& info) {
      std::string name = fs::path(info.param).filename().string();
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(CudaCompile, WithoutTheToolkitCudaIsRefused) {
  if (codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built with CUDA";
  TempDir dir;
  try {
    compile_for_cuda("node/test_add_bcast", dir.path / "dump");
    FAIL() << "compiled for CUDA without the toolkit";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("without the CUDA toolkit"), std::string::npos)
        << e.what();
  }
}

TEST(CudaRun, SoftmaxOnTheGpuMatchesAReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  CompiledModel compiled = compile_for_cuda("node/test_softmax_axis_1", dir.path / "dump");
  graph::Tensor x(graph::DType::kFloat32, {3, 4, 5});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  for (float& v : x.mutable_values<float>()) v = uniform(rng);
  std::vector<graph::Tensor> y = compiled.run({x});
  ASSERT_EQ(y.size(), 1u);
  ASSERT_EQ(y[0].dims(), x.dims());
  // Softmax over axis 1 (4 elements) of each (batch, column), in double.
  auto in = x.values<float>();
  auto out = y[0].values<float>();
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t c = 0; c < 5; ++c) {
      double top = -1e30, sum = 0;
      for (int64_t r = 0; r < 4; ++r) top = std::max<double>(top, in[(b * 4 + r) * 5 + c]);
      for (int64_t r = 0; r < 4; ++r) sum += std::exp(in[(b * 4 + r) * 5 + c] - top);
      for (int64_t r = 0; r < 4; ++r) {
        const size_t k = static_cast<size_t>((b * 4 + r) * 5 + c);
        const double want = std::exp(in[k] - top) / sum;
        EXPECT_NEAR(out[k], want, 1e-6 + 1e-5 * want) << "at " << k;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::driver
