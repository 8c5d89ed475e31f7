// Model libraries built by driver::compile_library (`kiln compile`), loaded through the C API of
// include/kiln/runtime.h alone: outputs against numpy (float32: rtol 1e-4, atol 1e-5), outputs
// into caller buffers, concurrent runs, external weights, the errors of a bad library, weights
// file, ABI, CPU or input, the arena of a chain, and profiling.
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../unit/driver/cuda_test_util.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "codegen/wrapper/model_api.h"
#include "driver/compile.h"
#include "kiln/runtime.h"
#include "onnx/importer.h"
#include "onnx/tensor_file.h"
#include "runtime/kiln_rt_weights.h"

kiln_status* load_with_abi_999(const char* path);  // abi_other.cpp

namespace kiln {
namespace {

namespace fs = std::filesystem;

/// This test's own directory (ctest runs the tests in parallel processes), with the models in
/// models/. The code cache, test-tmp/aot/cache, is shared: it is safe between processes.
const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::path(KILN_BUILD_DIR) / "test-tmp" / "aot" /
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(d);
    fs::create_directories(d);
    const std::string command = "/usr/bin/python3 '" KILN_TESTS_DIR "/aot/make_aot_models.py' '" +
                                (d / "models").string() + "'";
    if (std::system(command.c_str()) != 0) ADD_FAILURE() << "failed: " << command;
    return d;
  }();
  return dir;
}

driver::LibraryResult build(const std::string& model, const std::string& output,
                            bool external = false) {
  driver::LibraryOptions options;
  options.output = scratch() / output;
  options.external_weights = external;
  options.compile.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "aot" / "cache";
  options.compile.autotune = autotune::AutotuneMode::kOff;
  return driver::compile_library(onnx::import_model(scratch() / "models" / model), options);
}

/// The conv + matmul library, built once (embedded weights).
const fs::path& conv_matmul_library() {
  static const fs::path path = build("conv_matmul.onnx", "conv_matmul.so").library;
  return path;
}

struct Loaded {
  kiln_model* model = nullptr;
  ~Loaded() { kiln_model_free(model); }
};

/// Frees library-allocated outputs when the scope ends, also when an ASSERT returns early (else
/// LeakSanitizer adds a leak report to the failure).
template <size_t N>
struct FreeOutputs {
  kiln_tensor (&out)[N];
  ~FreeOutputs() {
    for (kiln_tensor& t : out) kiln_free(t.data);
  }
};

/// The status's message (and frees it); "" for success.
std::string message_of(kiln_status* status, kiln_status_code* code = nullptr) {
  if (code != nullptr) *code = kiln_status_get_code(status);
  std::string text = status == nullptr ? "" : kiln_status_message(status);
  kiln_status_free(status);
  return text;
}

void load(const fs::path& path, Loaded& loaded, int threads = 0) {
  kiln_options options = kiln_default_options();
  options.threads = threads;
  ASSERT_EQ(message_of(kiln_model_load(path.c_str(), &options, &loaded.model)), "");
}

kiln_tensor tensor_of(const graph::Tensor& t) {
  kiln_tensor k{};
  k.data = const_cast<void*>(t.data());
  k.dtype = static_cast<int32_t>(t.dtype());
  k.rank = static_cast<int32_t>(t.rank());
  for (int64_t d = 0; d < t.rank(); ++d) k.dims[d] = t.dims()[d];
  return k;
}

graph::Tensor npy(const std::string& name) {
  return onnx::read_tensor_file(scratch() / "models" / (name + ".npy"));
}

void expect_close(const float* got, const graph::Tensor& want) {
  std::span<const float> w = want.values<float>();
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_NEAR(got[i], w[i], 1e-5 + 1e-4 * std::fabs(w[i])) << "element " << i;
  }
}

/// Checks library-allocated outputs y and z against numpy's, then frees them.
void expect_outputs(kiln_tensor (&out)[2]) {
  ASSERT_EQ(out[0].rank, 2);
  EXPECT_EQ(out[0].dims[0], 3);
  EXPECT_EQ(out[0].dims[1], 10);
  expect_close(static_cast<const float*>(out[0].data), npy("y"));
  ASSERT_EQ(out[1].rank, 2);
  EXPECT_EQ(out[1].dims[0], 3);
  EXPECT_EQ(out[1].dims[1], 3);
  expect_close(static_cast<const float*>(out[1].data), npy("z"));
  for (kiln_tensor& t : out) kiln_free(t.data);
}

TEST(ModelLibrary, DescribesItsInputsAndOutputs) {
  Loaded m;
  load(conv_matmul_library(), m);
  ASSERT_EQ(kiln_model_input_count(m.model), 1u);
  ASSERT_EQ(kiln_model_output_count(m.model), 2u);
  kiln_value_info info;
  ASSERT_EQ(message_of(kiln_model_input_info(m.model, 0, &info)), "");
  EXPECT_STREQ(info.name, "x");
  EXPECT_EQ(info.dtype, KILN_FLOAT32);
  ASSERT_EQ(info.rank, 4);
  EXPECT_EQ(info.dims[0], -1);
  EXPECT_STREQ(info.dim_names[0], "batch");
  EXPECT_EQ(info.dims[1], 3);
  EXPECT_EQ(info.dim_names[1], nullptr);
  ASSERT_EQ(message_of(kiln_model_output_info(m.model, 0, &info)), "");
  EXPECT_STREQ(info.name, "y");
  EXPECT_EQ(info.dims[1], 10);
  ASSERT_EQ(message_of(kiln_model_output_info(m.model, 1, &info)), "");
  EXPECT_STREQ(info.name, "z");
  EXPECT_STREQ(info.dim_names[1], "batch");
  kiln_status_code code;
  EXPECT_NE(message_of(kiln_model_input_info(m.model, 1, &info), &code).find("has 1 input"),
            std::string::npos);
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(kiln_model_target(m.model), "auto");
}

/// The variant this CPU runs: x86-64-v4 where it has AVX-512 (F, BW, CD, DQ, VL), else x86-64-v3.
std::string best_variant() {
  __builtin_cpu_init();
  const bool v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  return v4 ? "x86-64-v4" : "x86-64-v3";
}

// The default library holds a variant per ISA level; each gives numpy's outputs. x86-64-v3 is
// loaded as on a CPU without AVX-512 (KILN_CPU_FEATURES); the variant is chosen at the first load
// in a process, so the second load follows the first one's unload.
TEST(ModelLibrary, EachVariantMatchesNumpy) {
  for (const char* features : {"", "avx,avx2,fma,bmi,bmi2,f16c"}) {
    Loaded m;
    if (*features != '\0') ::setenv("KILN_CPU_FEATURES", features, 1);
    load(conv_matmul_library(), m);
    ::unsetenv("KILN_CPU_FEATURES");
    ASSERT_NE(m.model, nullptr);
    EXPECT_EQ(kiln_model_variant(m.model), *features != '\0' ? "x86-64-v3" : best_variant());
    const graph::Tensor x = npy("x");
    kiln_tensor in = tensor_of(x);
    kiln_tensor out[2] = {};
    ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, out, 2)), "");
    expect_outputs(out);
  }
}

/// Writes tests/models/`script`'s model and data into scratch()/`name` and compiles the model
/// (both variants, autotuning off) to scratch()/`name`.so; returns that library.
fs::path compile_models_script(const std::string& script, const std::string& name) {
  const fs::path dir = scratch() / name;
  const std::string command =
      "/usr/bin/python3 '" KILN_TESTS_DIR "/models/" + script + "' '" + dir.string() + "'";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  driver::LibraryOptions options;
  options.output = scratch() / (name + ".so");
  options.compile.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "aot" / "cache";
  options.compile.autotune = autotune::AutotuneMode::kOff;
  return driver::compile_library(onnx::import_model(dir / "model.onnx"), options).library;
}

/// `library` loaded with the variant this CPU selects, then with x86-64-v3 forced
/// (KILN_CPU_FEATURES), each checked to be the variant expected and given to `body`.
void for_each_variant(const fs::path& library, const std::function<void(Loaded&)>& body) {
  for (const char* features : {"", "avx,avx2,fma,bmi,bmi2,f16c"}) {
    Loaded m;
    if (*features != '\0') ::setenv("KILN_CPU_FEATURES", features, 1);
    load(library, m);
    ::unsetenv("KILN_CPU_FEATURES");
    ASSERT_NE(m.model, nullptr);
    EXPECT_EQ(kiln_model_variant(m.model), *features != '\0' ? "x86-64-v3" : best_variant());
    body(m);
  }
}

// tests/models/make_attention.py's causal attention block (3 heads of 20, sequence 67, dynamic
// batch; small batched products, a Where mask, transcendental GEMM epilogues, a tied head) in
// each variant, at batch 2 and 1: the AVX2 forms of those kernels run here too.
TEST(ModelLibrary, AttentionBlockEachVariantMatchesNumpy) {
  const fs::path library = compile_models_script("make_attention.py", "attention");
  const fs::path dir = scratch() / "attention";
  for_each_variant(library, [&](Loaded& m) {
    for (const char* batch : {"2", "1"}) {
      SCOPED_TRACE(std::string("variant ") + kiln_model_variant(m.model) + ", batch " + batch);
      const auto read = [&](const char* name) {
        return onnx::read_tensor_file(dir / (std::string(name) + "_b" + batch + ".npy"));
      };
      const graph::Tensor x = read("x");
      kiln_tensor in = tensor_of(x);
      kiln_tensor out[2] = {};
      const FreeOutputs<2> free_outputs{out};
      ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, out, 2)), "");
      expect_close(static_cast<const float*>(out[0].data), read("y"));
      expect_close(static_cast<const float*>(out[1].data), read("z"));
    }
  });
}

// tests/models/make_fused_attention.py's four fused attentions (a Div scale, a causal Where, a
// padding Where(mask, -inf, s) whose all-hidden rows give NaN, an additive mask; heads of 20 and
// 12; dynamic batch and sequence) and one left unfused, in each variant at sequences 67 and 130:
// the AVX2 form of runtime/kiln_rt_attention.h runs here too. NaN where numpy has NaN, else
// within rtol 1e-4, atol 1e-5.
TEST(ModelLibrary, FusedAttentionEachVariantMatchesNumpy) {
  const fs::path library = compile_models_script("make_fused_attention.py", "fused_attention");
  const fs::path dir = scratch() / "fused_attention";
  for_each_variant(library, [&](Loaded& m) {
    for (const char* c : {"s67", "s130"}) {
      SCOPED_TRACE(std::string("variant ") + kiln_model_variant(m.model) + ", case " + c);
      const auto read = [&](const char* name) {
        return onnx::read_tensor_file(dir / (std::string(c) + "_" + name + ".npy"));
      };
      std::vector<graph::Tensor> inputs;
      for (const char* name : {"q", "k", "v", "w", "causal", "pad", "addmask"})
        inputs.push_back(read(name));
      std::vector<kiln_tensor> in;
      for (const graph::Tensor& t : inputs) in.push_back(tensor_of(t));
      kiln_tensor out[5] = {};
      const FreeOutputs<5> free_outputs{out};
      ASSERT_EQ(message_of(kiln_model_run(m.model, in.data(), in.size(), out, 5)), "");
      const char* names[5] = {"a", "b", "c", "d", "e"};
      for (int k = 0; k < 5; ++k) {
        const graph::Tensor want = read(names[k]);
        std::span<const float> w = want.values<float>();
        const auto* got = static_cast<const float*>(out[k].data);
        for (size_t i = 0; i < w.size(); ++i) {
          if (std::isnan(w[i])) {
            ASSERT_TRUE(std::isnan(got[i])) << "output " << names[k] << " element " << i;
          } else {
            ASSERT_NEAR(got[i], w[i], 1e-5 + 1e-4 * std::fabs(w[i]))
                << "output " << names[k] << " element " << i;
          }
        }
      }
    }
  });
}

// tests/models/make_resnet.py's ResNet blocks at awkward sizes (a 7x7 stride-2 stem to 19
// channels, MaxPool with pads, basic, strided and bottleneck blocks with residual Adds, 37
// channels, odd widths), which run channels-last end to end: the dynamic-batch model (oneDNN's
// nhwc convolutions) at batch 2 and 1, and the static batch-2 one (the channels-last pointwise
// and direct templates), each in each variant, so that the AVX2 forms run here too.
// Within rtol 1e-4, atol 1e-5 of numpy.
void resnet_blocks_match_numpy() {
  const fs::path dynamic = compile_models_script("make_resnet.py", "resnet");
  const fs::path dir = scratch() / "resnet";
  driver::LibraryOptions options;
  options.output = scratch() / "resnet_b2.so";
  options.compile.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "aot" / "cache";
  options.compile.autotune = autotune::AutotuneMode::kOff;
  const fs::path fixed =
      driver::compile_library(onnx::import_model(dir / "model_b2.onnx"), options).library;
  for (const fs::path& library : {dynamic, fixed}) {
    for_each_variant(library, [&](Loaded& m) {
      for (const char* batch : {"2", "1"}) {
        if (library == fixed && std::string(batch) == "1") continue;
        SCOPED_TRACE(library.filename().string() + ", variant " + kiln_model_variant(m.model) +
                     ", batch " + batch);
        const auto read = [&](const char* name) {
          return onnx::read_tensor_file(dir / (std::string(name) + "_b" + batch + ".npy"));
        };
        const graph::Tensor x = read("x");
        kiln_tensor in = tensor_of(x);
        kiln_tensor out[2] = {};
        ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, out, 2)), "");
        ASSERT_EQ(out[1].rank, 4);
        EXPECT_EQ(out[1].dims[1], 37);
        expect_close(static_cast<const float*>(out[0].data), read("y"));
        expect_close(static_cast<const float*>(out[1].data), read("z"));
        for (kiln_tensor& t : out) kiln_free(t.data);
      }
    });
  }
}

TEST(ModelLibrary, ResNetBlocksChannelsLastEachVariantMatchesNumpy) { resnet_blocks_match_numpy(); }

// The same with every oneDNN convolution cut into pieces on the pool (KILN_CONV_PIECE_MACS=1,
// read by each library at its first convolution; kiln_rt_conv.h's conv_pieces): ranges of images
// at batch 2, output rows and blocks of output channels at batch 1, when the machine has 2 or
// more hardware threads.
TEST(ModelLibrary, ResNetBlocksInConvPiecesMatchNumpy) {
  ASSERT_EQ(setenv("KILN_CONV_PIECE_MACS", "1", 1), 0);
  resnet_blocks_match_numpy();
}

TEST(ModelLibrary, MatchesNumpyWithLibraryAndCallerBuffers) {
  Loaded m;
  load(conv_matmul_library(), m);
  const graph::Tensor x = npy("x");
  kiln_tensor in = tensor_of(x);
  kiln_tensor out[2] = {};  // allocated by the library
  ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, out, 2)), "");
  expect_outputs(out);

  std::vector<float> y(30, -1.0f), z(9, -1.0f);  // the caller's
  kiln_tensor given[2] = {};
  given[0].data = y.data();
  given[0].capacity = y.size() * sizeof(float);
  given[1].data = z.data();
  given[1].capacity = z.size() * sizeof(float);
  ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, given, 2)), "");
  EXPECT_EQ(given[0].data, y.data());
  EXPECT_EQ(given[1].data, z.data());
  expect_close(y.data(), npy("y"));
  expect_close(z.data(), npy("z"));

  given[0].capacity = 29 * sizeof(float);
  kiln_status_code code;
  const std::string error = message_of(kiln_model_run(m.model, &in, 1, given, 2), &code);
  EXPECT_EQ(code, KILN_ERROR_BAD_INPUT);
  EXPECT_NE(error.find("output 'y': the buffer given holds 116 bytes, the output needs 120"),
            std::string::npos)
      << error;
}

/// 8 threads x 100 runs of one loaded model (oneDNN, OpenBLAS, the GEMM template and kernels)
/// give the outputs of a run alone, bit for bit; each run's OpenMP regions use `threads`.
void expect_concurrent_runs_identical(int run_threads) {
  Loaded m;
  load(conv_matmul_library(), m, run_threads);
  const graph::Tensor x = npy("x");
  kiln_tensor in = tensor_of(x);
  kiln_tensor ref[2] = {};
  ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, ref, 2)), "");
  std::vector<float> reference(static_cast<const float*>(ref[0].data),
                               static_cast<const float*>(ref[0].data) + 30);
  reference.insert(reference.end(), static_cast<const float*>(ref[1].data),
                   static_cast<const float*>(ref[1].data) + 9);
  expect_outputs(ref);

  constexpr int kThreads = 8, kRuns = 100;
  std::vector<int> mismatches(kThreads, 0), failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        kiln_tensor out[2] = {};
        kiln_status* status = kiln_model_run(m.model, &in, 1, out, 2);
        if (status != nullptr) {
          kiln_status_free(status);
          ++failures[t];
          continue;
        }
        mismatches[t] += std::memcmp(out[0].data, reference.data(), 30 * sizeof(float)) != 0 ||
                         std::memcmp(out[1].data, reference.data() + 30, 9 * sizeof(float)) != 0;
        for (kiln_tensor& o : out) kiln_free(o.data);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

TEST(ModelLibrary, ConcurrentRunsGiveIdenticalOutputs) { expect_concurrent_runs_identical(1); }

TEST(ModelLibrary, ConcurrentRunsWithOpenMpTeamsGiveIdenticalOutputs) {
  expect_concurrent_runs_identical(2);
}

TEST(ModelLibrary, RejectsABadInputWithItsNameAndShapes) {
  Loaded m;
  load(conv_matmul_library(), m);
  graph::Tensor bad(graph::DType::kFloat32, {2, 3, 9, 8});
  kiln_tensor in = tensor_of(bad);
  kiln_tensor out[2] = {};
  kiln_status_code code;
  std::string error = message_of(kiln_model_run(m.model, &in, 1, out, 2), &code);
  EXPECT_EQ(code, KILN_ERROR_BAD_INPUT);
  EXPECT_NE(error.find("input 'x': expected shape [batch, 3, 8, 8], got [2, 3, 9, 8]"),
            std::string::npos)
      << error;
  graph::Tensor wrong_dtype(graph::DType::kInt64, {2, 3, 8, 8});
  in = tensor_of(wrong_dtype);
  error = message_of(kiln_model_run(m.model, &in, 1, out, 2), &code);
  EXPECT_EQ(code, KILN_ERROR_BAD_INPUT);
  EXPECT_NE(error.find("input 'x': expected dtype float32, got int64"), std::string::npos) << error;
  error = message_of(kiln_model_run(m.model, &in, 2, out, 2), &code);
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("takes 1 inputs and 2 outputs, 2 and 2 were given"), std::string::npos)
      << error;
}

// The weights file is written streaming (codegen::write_weights_file): its checksum, fed in
// pieces, is the one the loader computes over the whole payload, and the file is what
// map_weights_file accepts, with each constant at its offset and zeros between them. One of the
// constants is a spilled (file-mapped) tensor, as prepacked weights of big models are.
TEST(ModelLibrary, WeightsFileIsWrittenStreaming) {
  std::vector<unsigned char> bytes(10000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t piece : {1, 7, 31, 32, 33, 1000, 20000}) {
    kiln_rt::WeightsChecksum sum;
    for (size_t at = 0; at < bytes.size(); at += piece)
      sum.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    EXPECT_EQ(sum.finish(), kiln_rt::weights_checksum(bytes.data(), bytes.size())) << piece;
  }

  const fs::path dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "aot" / "weights_streaming";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::shared_ptr<const graph::Tensor>> constants;
  auto plain = std::make_shared<graph::Tensor>(graph::DType::kFloat32, std::vector<int64_t>{5});
  for (int i = 0; i < 5; ++i) plain->mutable_values<float>()[static_cast<size_t>(i)] = 0.5f * i;
  constants.push_back(plain);
  constants.push_back(std::make_shared<graph::Tensor>(graph::Tensor::spilled(
      graph::DType::kUInt8, {static_cast<int64_t>(bytes.size())}, bytes.data(), dir)));
  constants.push_back(
      std::make_shared<graph::Tensor>(graph::DType::kInt64, std::vector<int64_t>{0}));
  codegen::WeightsBlob blob = codegen::layout_weights(constants);
  EXPECT_EQ(blob.offsets, (std::vector<uint64_t>{0, 64, 10112}));  // 10000 bytes take 10048
  EXPECT_EQ(blob.payload_bytes, 10112u);
  codegen::write_weights_file(dir / "m.weights", constants, blob);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1)
      << "only m.weights: no temporary file left, the spilled one has no name";

  kiln_rt::WeightsFile file;
  char error[512] = {};
  ASSERT_TRUE(kiln_rt::map_weights_file((dir / "m.weights").c_str(), "m.so", blob.payload_bytes,
                                        blob.checksum, file, error, sizeof error))
      << error;
  EXPECT_EQ(std::memcmp(file.payload, plain->data(), 20), 0);
  EXPECT_EQ(std::count(file.payload + 20, file.payload + 64, 0), 44);
  EXPECT_EQ(std::memcmp(file.payload + 64, bytes.data(), bytes.size()), 0);
  EXPECT_EQ(kiln_rt::weights_checksum(file.payload, blob.payload_bytes), blob.checksum);
  ::munmap(file.mapping, file.mapping_bytes);
  fs::remove_all(dir);
}

TEST(ModelLibrary, ExternalWeightsAreMappedAndChecked) {
  const driver::LibraryResult r = build("conv_matmul.onnx", "external/model.so", true);
  ASSERT_EQ(r.weights, scratch() / "external" / "model.weights");
  // The library alone is smaller than the weights it would otherwise embed.
  const auto embedded = fs::file_size(conv_matmul_library());
  EXPECT_LT(fs::file_size(r.library) + r.weights_bytes / 2, embedded);
  {
    Loaded m;
    load(r.library, m);
    const graph::Tensor x = npy("x");
    kiln_tensor in = tensor_of(x), out[2] = {};
    ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, out, 2)), "");
    expect_outputs(out);
  }
  const std::string original = [&] {
    std::ifstream f(r.weights, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }();
  auto write = [&](const std::string& bytes) {
    std::ofstream(r.weights, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto load_error = [&](kiln_status_code* code) {
    kiln_model* model = nullptr;
    std::string error = message_of(kiln_model_load(r.library.c_str(), nullptr, &model), code);
    EXPECT_EQ(model, nullptr);
    return error;
  };
  kiln_status_code code;
  write(original.substr(0, original.size() - 100));
  std::string error = load_error(&code);
  EXPECT_EQ(code, KILN_ERROR_LOAD);
  EXPECT_NE(error.find("model.weights: expected "), std::string::npos) << error;
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;

  std::string altered = original;
  altered[altered.size() / 2] ^= 0x10;
  write(altered);
  error = load_error(&code);
  EXPECT_EQ(code, KILN_ERROR_LOAD);
  EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;

  fs::remove(r.weights);
  error = load_error(&code);
  EXPECT_EQ(code, KILN_ERROR_LOAD);
  EXPECT_NE(error.find("cannot open the weights file"), std::string::npos) << error;
  write(original);
}

TEST(ModelLibrary, ATruncatedLibraryIsRefused) {
  const fs::path truncated = scratch() / "truncated.so";
  fs::copy_file(conv_matmul_library(), truncated, fs::copy_options::overwrite_existing);
  fs::resize_file(truncated, fs::file_size(truncated) / 3);
  kiln_model* model = nullptr;
  kiln_status_code code;
  const std::string error = message_of(kiln_model_load(truncated.c_str(), nullptr, &model), &code);
  EXPECT_EQ(code, KILN_ERROR_LOAD);
  EXPECT_NE(error.find("truncated.so: cannot load the model library"), std::string::npos) << error;
  EXPECT_EQ(model, nullptr);
}

TEST(ModelLibrary, AnAbiMismatchIsRefused) {
  kiln_status_code code;
  const std::string error = message_of(load_with_abi_999(conv_matmul_library().c_str()), &code);
  EXPECT_EQ(code, KILN_ERROR_ABI);
  EXPECT_NE(error.find("built for Kiln C ABI version 2, this program for version 999"),
            std::string::npos)
      << error;
}

TEST(ModelLibrary, ACpuWithoutTheTargetIsaIsRefused) {
  ::setenv("KILN_CPU_FEATURES", "avx,fma,bmi", 1);  // an older CPU: no AVX2, BMI2, F16C
  kiln_model* model = nullptr;
  kiln_status_code code;
  const std::string error =
      message_of(kiln_model_load(conv_matmul_library().c_str(), nullptr, &model), &code);
  ::unsetenv("KILN_CPU_FEATURES");
  EXPECT_EQ(code, KILN_ERROR_UNSUPPORTED_CPU);
  EXPECT_NE(error.find("this CPU lacks avx2 bmi2 f16c, which the model library needs (it was "
                       "compiled for auto; its least demanding variant is x86-64-v3)"),
            std::string::npos)
      << error;
  EXPECT_EQ(model, nullptr);
}

TEST(ModelLibrary, TheArenaOfAMatMulReluChainHoldsTwoBuffers) {
  const driver::LibraryResult r = build("chain.onnx", "chain.so");
  const int64_t buffer = 64 * 256 * 4;
  EXPECT_LE(std::stoll(r.arena_bytes), 2 * buffer) << "arena " << r.arena_bytes;
  EXPECT_GE(std::stoll(r.intermediate_bytes), 19 * buffer);
  Loaded m;
  load(r.library, m);
  graph::Tensor x(graph::DType::kFloat32, {64, 256});
  kiln_tensor in = tensor_of(x), out{};
  ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, &out, 1)), "");
  EXPECT_EQ(out.dims[0], 64);
  kiln_free(out.data);
}

TEST(ModelLibrary, ProfilingRecordsOneEventPerCall) {
  Loaded m;
  load(conv_matmul_library(), m);
  const graph::Tensor x = npy("x");
  kiln_tensor in = tensor_of(x), out[2] = {};
  ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, out, 2)), "");
  expect_outputs(out);
  const kiln_profile_event* events = nullptr;
  EXPECT_EQ(kiln_model_profile_events(m.model, &events), 0u);  // not enabled yet
  ASSERT_EQ(message_of(kiln_model_set_profiling(m.model, 1)), "");
  for (int r = 0; r < 2; ++r) {
    kiln_tensor o[2] = {};
    ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, o, 2)), "");
    expect_outputs(o);
  }
  const size_t count = kiln_model_profile_events(m.model, &events);
  // Per run, three library calls: the oneDNN convolution (the Relu its post-op), the GEMM
  // (the bias Add its epilogue) and the BLAS product f @ f^T; no generated kernel is left.
  std::string listing;
  int calls = 0;
  for (size_t k = 0; k < count; ++k) {
    listing += std::string(events[k].kind) + " " + events[k].name + "\n";
    EXPECT_GE(events[k].duration_ns, 0);
    EXPECT_EQ(events[k].run, k < count / 2 ? 0u : 1u);
    calls += std::string(events[k].kind) == "call";
  }
  EXPECT_EQ(count % 2, 0u) << listing;
  EXPECT_EQ(calls, 6) << listing;
  kiln_model_clear_profile(m.model);
  EXPECT_EQ(kiln_model_profile_events(m.model, &events), 0u);
}

// --- CUDA libraries (`kiln compile --device cuda`) ---------------------------------------------
// Built here without a GPU (NVRTC only); the machine checks at load are tested through
// KILN_CUDA_FAKE_DRIVER, which replaces what the driver reports (kiln_rt_cuda.h); runs need a GPU
// and skip without one.

/// conv_matmul.onnx compiled for CUDA at fp32 (cubins for sm_80 and sm_90, PTX for compute_80).
const driver::LibraryResult& cuda_library() {
  static const driver::LibraryResult result = [] {
    ::unsetenv("KILN_CUDA_ARCHS");
    driver::LibraryOptions options;
    options.output = scratch() / "conv_matmul_cuda.so";
    options.find_dependencies = true;
    options.compile.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "aot" / "cache";
    options.compile.autotune = autotune::AutotuneMode::kOff;
    options.compile.device = ir::Device::kCuda;
    options.compile.precision = ir::Precision::kFp32;
    return driver::compile_library(onnx::import_model(scratch() / "models" / "conv_matmul.onnx"),
                                   options);
  }();
  return result;
}

/// kiln_model_load's message for the CUDA library with KILN_CUDA_FAKE_DRIVER=`fake`, and its code.
std::string load_with_fake_driver(const char* fake, kiln_status_code& code) {
  ::setenv("KILN_CUDA_FAKE_DRIVER", fake, 1);
  kiln_model* model = nullptr;
  std::string error =
      message_of(kiln_model_load(cuda_library().library.c_str(), nullptr, &model), &code);
  ::unsetenv("KILN_CUDA_FAKE_DRIVER");
  kiln_model_free(model);
  return error;
}

TEST(CudaLibrary, IsBuiltWithoutAGpuAndNeedsNoToolkitAtRunTime) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: this Kiln has no NVRTC";
  const driver::LibraryResult& r = cuda_library();
  EXPECT_EQ(r.device, "cuda");
  EXPECT_EQ(r.cuda_modules, "sm_80, sm_90 and PTX for compute_80");
  ASSERT_EQ(r.variants.size(), 1u);
  EXPECT_EQ(r.variants[0].name, "x86-64-v3");
  // The driver, cuBLASLt (the MatMul) and cuDNN (the Conv) are loaded with dlopen ...
  ASSERT_EQ(r.loads.size(), 3u);
  EXPECT_EQ(r.loads[0].rfind("libcuda.so.1", 0), 0u) << r.loads[0];
  EXPECT_EQ(r.loads[1].rfind("libcublasLt.so.13", 0), 0u) << r.loads[1];
  EXPECT_EQ(r.loads[2].rfind("libcudnn.so.9", 0), 0u) << r.loads[2];
  // ... and nothing of CUDA or Kiln is linked (ldd of the library and its variant).
  ASSERT_FALSE(r.needed.empty());
  for (const std::string& lib : r.needed) {
    for (const char* banned : {"cuda", "cublas", "cudnn", "nvrtc", "kiln"})
      EXPECT_EQ(lib.find(banned), std::string::npos) << lib;
  }
}

TEST(CudaLibrary, LoadSaysWhatTheMachineLacks) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: this Kiln has no NVRTC";
  kiln_status_code code = KILN_OK;
  std::string error = load_with_fake_driver("none", code);
  EXPECT_EQ(code, KILN_ERROR_DEVICE);
  EXPECT_NE(error.find("this model runs on CUDA, but the CUDA driver (libcuda.so.1) is not found"),
            std::string::npos)
      << error;
  const int nvrtc_major = std::atoi(codegen::nvrtc_version_text().c_str());
  error =
      load_with_fake_driver(fmt::format("driver={}", 1000 * (nvrtc_major - 1) + 80).c_str(), code);
  EXPECT_EQ(code, KILN_ERROR_DEVICE);
  EXPECT_NE(error.find(fmt::format("the CUDA driver is too old: it supports CUDA {}.8, the model "
                                   "library was compiled with CUDA {}.0",
                                   nvrtc_major - 1, nvrtc_major)),
            std::string::npos)
      << error;
  error = load_with_fake_driver("devices=0", code);
  EXPECT_EQ(code, KILN_ERROR_DEVICE);
  EXPECT_NE(error.find("the driver finds no CUDA device"), std::string::npos) << error;
  error = load_with_fake_driver("cc=7.5", code);
  EXPECT_EQ(code, KILN_ERROR_DEVICE);
  EXPECT_NE(error.find("the GPU (compute capability 7.5) runs none of the model's kernels, "
                       "compiled for sm_80, sm_90 and PTX for compute_80"),
            std::string::npos)
      << error;
  error = load_with_fake_driver("cc=10.0,cublaslt=110000", code);  // PTX runs there
  EXPECT_EQ(code, KILN_ERROR_DEVICE);
  EXPECT_NE(error.find("cuBLASLt 110000 is too old"), std::string::npos) << error;
  error = load_with_fake_driver("cc=8.6,cublaslt=130100,cudnn=8907", code);  // sm_80's cubin
  EXPECT_EQ(code, KILN_ERROR_DEVICE);
  EXPECT_NE(error.find("cuDNN 8907 is too old"), std::string::npos) << error;
  // A machine that has it all: the load succeeds (runs need the real driver).
  EXPECT_EQ(load_with_fake_driver("cc=9.0,cublaslt=130100,cudnn=91400", code), "");
  EXPECT_EQ(code, KILN_OK);
  if (driver::cuda_test::has_cuda_device()) return;
  // Without one, both kinds of run fail with the driver's absence, not a crash.
  ::setenv("KILN_CUDA_FAKE_DRIVER", "cc=9.0,cublaslt=130100,cudnn=91400", 1);
  Loaded m;
  load(cuda_library().library, m);
  ::unsetenv("KILN_CUDA_FAKE_DRIVER");
  ASSERT_NE(m.model, nullptr);
  const graph::Tensor x = npy("x");
  kiln_tensor in = tensor_of(x);
  kiln_tensor out[2] = {};
  error = message_of(kiln_model_run(m.model, &in, 1, out, 2));
  EXPECT_NE(error.find("the CUDA driver (libcuda.so.1) is not found"), std::string::npos) << error;
  kiln_cuda_run_options options = kiln_default_cuda_run_options();
  options.outputs_on_device = 1;
  error = message_of(kiln_model_run_cuda(m.model, &in, 1, out, 2, &options));
  EXPECT_NE(error.find("the CUDA driver (libcuda.so.1) is not found"), std::string::npos) << error;
}

TEST(CudaLibrary, TheCudaRunOfACpuLibraryIsRefused) {
  Loaded m;
  load(conv_matmul_library(), m);
  EXPECT_STREQ(kiln_model_device(m.model), "cpu");
  kiln_status_code code;
  const std::string error =
      message_of(kiln_model_run_cuda(m.model, nullptr, 0, nullptr, 0, nullptr), &code);
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("not compiled for CUDA"), std::string::npos) << error;
}

// On a GPU: numpy's outputs (float32 tolerances, --precision fp32), then
// kiln_cuda_library_check: device and pinned buffers on the caller's stream, and 8 threads x 20
// runs, all bit-identical to the first run.
TEST(CudaLibrary, RunsOnTheGpuLikeNumpyFromManyThreads) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: this Kiln has no NVRTC";
  if (!driver::cuda_test::has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  Loaded m;
  load(cuda_library().library, m);
  EXPECT_STREQ(kiln_model_device(m.model), "cuda");
  const graph::Tensor x = npy("x");
  kiln_tensor in = tensor_of(x);
  kiln_tensor out[2] = {};
  ASSERT_EQ(message_of(kiln_model_run(m.model, &in, 1, out, 2)), "");
  expect_outputs(out);
  const std::string command = "'" KILN_BUILD_DIR "/bin/kiln_cuda_library_check' '" +
                              cuda_library().library.string() + "' '" +
                              (scratch() / "cuda_check").string() +
                              "' 'x=" + (scratch() / "models" / "x.npy").string() + "' --runs 20";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace kiln
