// The CUDA backend without a GPU: the kernels of ONNX-suite models of every kernel shape
// (pointwise, broadcast, reductions with Welford and arg-extrema, softmax and layer norm fused,
// index arithmetic with min/max, float16 casts, a gather, and models with library calls on the
// host) compile through NVRTC for sm_80 and sm_90, and the wrapper embeds both cubins; control
// flow runs on the host with its subgraphs compiled for the CPU. With a GPU, a softmax, a TopK
// and a Scan run and match references computed here. Without the CUDA toolkit the
// tests skip, and compiling for --device cuda is refused with a clear error.

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "onnx/importer.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;

using namespace cuda_test;  // NOLINT: the shared fixtures

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
  // The cubins are cached in the compile's code cache (options.cache_dir, a fresh one here, so
  // NVRTC runs), not in KILN_CACHE_DIR's.
  setenv("KILN_CACHE_DIR", (dir.path / "other-cache").c_str(), 1);
  setenv("KILN_CUDA_ARCHS", "80,90", 1);
  CompiledModel compiled = compile_for_cuda(GetParam(), dir.path / "dump");
  unsetenv("KILN_CUDA_ARCHS");
  unsetenv("KILN_CACHE_DIR");
  EXPECT_FALSE(fs::exists(dir.path / "other-cache" / "cuda"));
  const std::string wrapper = files::read(dir.path / "dump" / "5_wrapper.cpp");
  if (compiled.stats().kernels == 0) {
    EXPECT_EQ(wrapper.find("kCubin0"), std::string::npos);
    return;
  }
  int cubins = 0;
  for (const auto& entry : fs::directory_iterator(dir.path / "dump" / "cache" / "cuda")) {
    cubins += entry.path().extension() == ".cubin";
  }
  EXPECT_EQ(cubins, 2) << "one cubin per architecture in the compile's cache";
  // No synchronization inside the run: the host waits only for data it needs (library calls,
  // sizes read from data, outputs), or for each kernel in a profiled run.
  EXPECT_EQ(count(wrapper, "synchronize("),
            count(wrapper, "if (profile != nullptr) state.cuda.synchronize("));
  EXPECT_NE(wrapper.find("{80, kCubin0, 0}"), std::string::npos) << GetParam();
  EXPECT_NE(wrapper.find("{90, kCubin1, 0}"), std::string::npos) << GetParam();
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

/// The wrapper of `suite_case` compiled for CUDA (its kernels for sm_90 only).
std::string cuda_wrapper(const std::string& suite_case, const fs::path& dump) {
  setenv("KILN_CUDA_ARCHS", "90", 1);
  compile_for_cuda(suite_case, dump);
  unsetenv("KILN_CUDA_ARCHS");
  return files::read(dump / "5_wrapper.cpp");
}

TEST(CudaCompile, HostFallbacksCopyExactlyWhatTheyReadAndWrite) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  // TopK runs on the host (the host-fallback list) between kernels on the GPU: its one input
  // comes from the GPU, its one output goes back, and the host waits once, for the input.
  const std::string wrapper = cuda_wrapper("node/test_top_k", dir.path / "dump");
  EXPECT_NE(wrapper.find("// on the host: TopK: "), std::string::npos) << wrapper;
  const size_t topk = wrapper.find("{  // topk from");
  ASSERT_NE(topk, std::string::npos) << wrapper;
  const std::string call = wrapper.substr(topk, wrapper.find("host.finish();", topk) - topk);
  EXPECT_EQ(count(call, "host.in<"), 1u) << call;
  EXPECT_EQ(count(call, "host.out<"), 1u) << call;
  EXPECT_EQ(count(call, "host.ready("), 1u) << call;
  // Inputs are uploaded into device memory, intermediates live in the device arena.
  EXPECT_NE(wrapper.find("state.cuda.upload_input<float>(ws, in0)"), std::string::npos);
  EXPECT_EQ(wrapper.find("managed"), std::string::npos);
}

// Scan (like Loop and If) runs on the host: its body is compiled for the CPU (a kernel in a host
// unit, a function of the wrapper written with host storage), what the call reads is copied
// from the GPU before it, and its results go to the GPU after it.
TEST(CudaCompile, ControlFlowRunsOnTheHostWithItsBodyCompiledForTheCpu) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string wrapper = cuda_wrapper("node/test_scan9_sum", dir.path / "dump");
  EXPECT_NE(wrapper.find("// on the host: Scan: "), std::string::npos) << wrapper;
  const size_t scan = wrapper.find("{  // scan from");
  ASSERT_NE(scan, std::string::npos) << wrapper;
  const size_t end = wrapper.find("kiln_cuda::results_to_device(state.cuda, ws, ", scan);
  ASSERT_NE(end, std::string::npos) << wrapper;
  const std::string call = wrapper.substr(scan, end - scan);
  EXPECT_EQ(count(call, "host.in<float>("), 2u) << call;  // the initial state and x
  EXPECT_EQ(count(call, "host.ready("), 1u) << call;
  EXPECT_NE(call.find("kiln_rt::run_scan"), std::string::npos) << call;
  // The body: a host function with a host workspace, calling a CPU kernel.
  const size_t body = wrapper.find("static void subgraph_g1(const kiln_rt::TensorArg* inputs,");
  ASSERT_NE(body, std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("kiln_rt::Workspace ws;", body), std::string::npos) << wrapper;
  EXPECT_TRUE(fs::exists(dir.path / "dump" / "5_kernels0.cpp"));
  const std::string host_kernels = files::read(dir.path / "dump" / "5_kernels0.cpp");
  EXPECT_NE(host_kernels.find("extern \"C\" void g1_cpp_fused"), std::string::npos) << host_kernels;
  EXPECT_EQ(host_kernels.find("__global__"), std::string::npos);
}

TEST(CudaCompile, IndexChecksRunOnTheGpu) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string wrapper = cuda_wrapper("node/test_gather_0", dir.path / "dump");
  EXPECT_NE(wrapper.find("state.cuda.check_indices(arg1_indices, 3, 5, false, 0LL, \"node "
                         "'Gather_0' (Gather)\");"),
            std::string::npos)
      << wrapper;
  EXPECT_EQ(wrapper.find("kiln_rt::check_indices"), std::string::npos);
  // The kernel that gathers stops once a check failed.
  const std::string cuda = files::read(dir.path / "dump" / "5_kernels.cu");
  EXPECT_NE(cuda.find("if (kiln_error.code != 0) return;  // an index check failed"),
            std::string::npos)
      << cuda;
}

TEST(CudaCompile, WithoutTheToolkitCudaIsRefused) {
  if (codegen::nvrtc_available()) GTEST_SKIP() << "skipped: this Kiln compiles CUDA kernels";
  TempDir dir;
  try {
    compile_for_cuda("node/test_add_bcast", dir.path / "dump");
    FAIL() << "compiled for CUDA without the toolkit";
  } catch (const UserError& e) {
    // Built without the toolkit, or built with it on a machine where NVRTC does not load.
    const std::string what = e.what();
    EXPECT_TRUE(what.find("without the CUDA toolkit") != std::string::npos ||
                what.find("cannot be loaded") != std::string::npos)
        << what;
  }
}

// A kernel NVRTC rejects fails the compile with NVRTC's log and the names of the kernels its
// errors are in (generated code must compile; onnx.cuda_compile relies on the name).
TEST(CudaCompile, AnNvrtcErrorNamesTheKernel) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string source =
      "extern \"C\" __global__ void kiln_good(float* p) { p[threadIdx.x] = 1.0f; }\n"
      "extern \"C\" __global__ void kiln_bad(float* p) {\n"
      "  p[threadIdx.x] = not_declared;\n"
      "}\n";
  try {
    codegen::nvrtc_compile(source, {90}, dir.path);
    ADD_FAILURE() << "NVRTC compiled an undeclared identifier";
  } catch (const std::exception& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("for sm_90 (errors in kiln_bad)"), std::string::npos) << message;
    EXPECT_NE(message.find("not_declared"), std::string::npos) << message;
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

TEST(CudaRun, TopKOnTheHostBetweenKernelsMatchesAReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  CompiledModel compiled = compile_for_cuda("node/test_top_k", dir.path / "dump");
  graph::Tensor x(graph::DType::kFloat32, {3, 4});
  const std::vector<float> values = {5, 1, 7, 3, 2, 8, 6, 4, 9, 0, 11, 10};
  std::copy(values.begin(), values.end(), x.mutable_values<float>().begin());
  graph::Tensor k(graph::DType::kInt64, {1});
  k.mutable_values<int64_t>()[0] = 3;
  std::vector<graph::Tensor> y = compiled.run({x, k});
  ASSERT_EQ(y.size(), 2u);
  // The 3 largest of each row, largest first, and their positions.
  const std::vector<float> want = {7, 5, 3, 8, 6, 4, 11, 10, 9};
  const std::vector<int64_t> want_at = {2, 0, 3, 1, 2, 3, 2, 3, 0};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(y[0].values<float>()[i], want[i]) << "at " << i;
    EXPECT_EQ(y[1].values<int64_t>()[i], want_at[i]) << "at " << i;
  }
}

// Scan on the host between the upload of the model's inputs and the download of its outputs:
// the running sums of x's rows and their total, against sums in double.
TEST(CudaRun, ScanOnTheHostMatchesAReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  CompiledModel compiled = compile_for_cuda("node/test_scan9_sum", dir.path / "dump");
  graph::Tensor initial(graph::DType::kFloat32, {2}), x(graph::DType::kFloat32, {3, 2});
  const std::vector<float> start = {0.5f, -1.25f}, rows = {1, 2, -3, 4.5f, 5, 6};
  std::copy(start.begin(), start.end(), initial.mutable_values<float>().begin());
  std::copy(rows.begin(), rows.end(), x.mutable_values<float>().begin());
  std::vector<graph::Tensor> y = compiled.run({initial, x});
  ASSERT_EQ(y.size(), 2u);
  ASSERT_EQ(y[1].dims(), x.dims());
  double sum[2] = {start[0], start[1]};
  for (size_t r = 0; r < 3; ++r) {
    for (size_t c = 0; c < 2; ++c) {
      sum[c] += rows[r * 2 + c];
      EXPECT_EQ(y[1].values<float>()[r * 2 + c], static_cast<float>(sum[c])) << r << ", " << c;
    }
  }
  for (size_t c = 0; c < 2; ++c) EXPECT_EQ(y[0].values<float>()[c], static_cast<float>(sum[c]));
}

TEST(CudaRun, AnIndexOutOfRangeFailsWithTheCpuMessage) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  CompiledModel compiled = compile_for_cuda("node/test_gather_0", dir.path / "dump");
  graph::Tensor data(graph::DType::kFloat32, {5, 4, 3, 2});
  for (float& v : data.mutable_values<float>()) v = 1.0f;
  graph::Tensor indices(graph::DType::kInt64, {3});
  auto idx = indices.mutable_values<int64_t>();
  idx[0] = 0;
  idx[1] = 7;  // the first out of range: axis 0 has 5
  idx[2] = -9;
  try {
    compiled.run({data, indices});
    FAIL() << "an index out of range was not reported";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("node 'Gather_0' (Gather): index 7 is out of range for "
                                         "an axis of size 5 (valid: -5 to 4)"),
              std::string::npos)
        << e.what();
  }
  // The run state is fine afterwards: the next run with good indices works.
  idx[1] = 4;
  idx[2] = -5;
  std::vector<graph::Tensor> y = compiled.run({data, indices});
  ASSERT_EQ(y.size(), 1u);
  for (float v : y[0].values<float>()) EXPECT_EQ(v, 1.0f);
}

}  // namespace
}  // namespace kiln::driver
