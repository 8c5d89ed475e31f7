// Ifs whose branches give outputs of different ranks or dtypes, compiled into model libraries
// (driver::compile_library, what `kiln compile` runs) and run through the C API of
// include/kiln/runtime.h alone: the output info says the rank (and dtype) is known only after a
// run, and each run, for either condition, gives numpy's outputs with their own dtype, rank and
// dims (float32: rtol 1e-4, atol 1e-5; integers exactly). Models: make_if_type_models.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "kiln/kiln.h"
#include "kiln/runtime.h"
#include "onnx/importer.h"
#include "onnx/tensor_file.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

/// The models, written once per test process; the code cache is shared between processes.
const fs::path& models() {
  static const fs::path dir = [] {
    fs::path d = fs::path(KILN_BUILD_DIR) / "test-tmp" / "if-types-api" /
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(d);
    fs::create_directories(d);
    const std::string command = "/usr/bin/python3 '" KILN_TESTS_DIR
                                "/if_types/make_if_type_models.py' '" +
                                d.string() + "'";
    if (std::system(command.c_str()) != 0) ADD_FAILURE() << "failed: " << command;
    return d;
  }();
  return dir;
}

/// The status's message (and frees it); "" for success.
std::string message_of(kiln_status* status) {
  std::string text = status == nullptr ? "" : kiln_status_message(status);
  kiln_status_free(status);
  return text;
}

/// A model library compiled from `name`/model.onnx and loaded.
struct Library {
  explicit Library(const std::string& name) : path(models() / (name + ".so")) {
    driver::LibraryOptions options;
    options.output = path;
    options.compile.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "if-types-api-cache";
    options.compile.autotune = autotune::AutotuneMode::kOff;
    driver::compile_library(onnx::import_model(models() / name / "model.onnx"), options);
    kiln_options load = kiln_default_options();
    EXPECT_EQ(message_of(kiln_model_load(options.output.c_str(), &load, &model)), "");
  }
  ~Library() { kiln_model_free(model); }

  kiln_value_info output_info(size_t index) const {
    kiln_value_info info{};
    EXPECT_EQ(message_of(kiln_model_output_info(model, index, &info)), "");
    return info;
  }

  fs::path path;
  kiln_model* model = nullptr;
};

graph::Tensor npy(const std::string& model, const std::string& name) {
  return onnx::read_tensor_file(models() / model / (name + ".npy"));
}

kiln_tensor tensor_of(const graph::Tensor& t) {
  kiln_tensor k{};
  k.data = const_cast<void*>(t.data());
  k.dtype = static_cast<int32_t>(t.dtype());
  k.rank = static_cast<int32_t>(t.rank());
  for (int64_t d = 0; d < t.rank(); ++d) k.dims[d] = t.dims()[d];
  return k;
}

/// Checks a library-allocated output against numpy's: dtype, rank, dims and values; frees it.
void expect_output(kiln_tensor& got, const graph::Tensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.dtype, static_cast<int32_t>(want.dtype()));
  ASSERT_EQ(got.rank, want.rank());
  for (int64_t d = 0; d < want.rank(); ++d) EXPECT_EQ(got.dims[d], want.dims()[d]) << "dim " << d;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (want.dtype() == graph::DType::kFloat32) {
      const float w = want.values<float>()[static_cast<size_t>(i)];
      EXPECT_NEAR(static_cast<const float*>(got.data)[i], w, 1e-5 + 1e-4 * std::fabs(w)) << i;
    } else {
      ASSERT_EQ(want.dtype(), graph::DType::kInt32);
      EXPECT_EQ(static_cast<const int32_t*>(got.data)[i], want.values<int32_t>()[i]) << i;
    }
  }
  kiln_free(got.data);
}

/// Runs `library` on x and the given extra inputs; checks the outputs against <name>_<tag>.npy.
void expect_run(const Library& library, const std::string& model, const std::string& tag,
                const std::vector<std::string>& inputs, const std::vector<std::string>& outputs) {
  std::vector<graph::Tensor> given = {npy(model, "x")};
  for (const std::string& input : inputs) given.push_back(npy(model, input));
  std::vector<kiln_tensor> in;
  for (const graph::Tensor& t : given) in.push_back(tensor_of(t));
  std::vector<kiln_tensor> out(outputs.size(), kiln_tensor{});
  ASSERT_EQ(message_of(kiln_model_run(library.model, in.data(), in.size(), out.data(), out.size())),
            "");
  for (size_t k = 0; k < outputs.size(); ++k) {
    expect_output(out[k], npy(model, outputs[k] + "_" + tag), model + " " + tag + " " + outputs[k]);
  }
}

TEST(IfTypes, RankKnownAfterARun) {
  Library library("rank");
  kiln_value_info y = library.output_info(0);
  EXPECT_STREQ(y.name, "y");
  EXPECT_EQ(y.rank, -1);
  EXPECT_EQ(y.dtype, KILN_FLOAT32);
  kiln_value_info s = library.output_info(1);
  EXPECT_EQ(s.rank, 0);
  expect_run(library, "rank", "hi", {"sr_hi"}, {"y", "s"});
  expect_run(library, "rank", "lo", {"sr_lo"}, {"y", "s"});
  expect_run(library, "rank", "hi", {"sr_hi"}, {"y", "s"});

  // The C++ API (include/kiln/kiln.h) over the same library.
  kiln::Model model = kiln::load(library.path.string());
  EXPECT_TRUE(model.outputs()[0].rank_known_after_run);
  EXPECT_TRUE(model.outputs()[0].dims.empty());
  EXPECT_FALSE(model.outputs()[1].rank_known_after_run);
  const graph::Tensor x = npy("rank", "x");
  const graph::Tensor y_lo = npy("rank", "y_lo");
  float sr = 8000.0f;
  std::vector<kiln::Tensor> out =
      model.run({kiln::Tensor::view(KILN_FLOAT32, {2, 3}, const_cast<void*>(x.data())),
                 kiln::Tensor::view(KILN_FLOAT32, {}, &sr)});
  EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{2, 3, 1}));
  for (int64_t i = 0; i < y_lo.numel(); ++i) {
    const float w = y_lo.values<float>()[static_cast<size_t>(i)];
    EXPECT_NEAR(out[0].data<float>()[i], w, 1e-5 + 1e-4 * std::fabs(w)) << i;
  }
}

TEST(IfTypes, RankInsideALoopBody) {
  Library library("loop");
  kiln_value_info y = library.output_info(0);
  EXPECT_EQ(y.rank, 1);
  EXPECT_EQ(y.dims[0], 3);
  expect_run(library, "loop", "hi", {"sr_hi"}, {"y"});
  expect_run(library, "loop", "lo", {"sr_lo"}, {"y"});
}

TEST(IfTypes, DtypeKnownAfterARun) {
  Library library("dtype");
  kiln_value_info y = library.output_info(0);
  EXPECT_EQ(y.rank, -1);
  EXPECT_EQ(y.dtype, KILN_UNDEFINED);
  kiln_value_info z = library.output_info(1);
  EXPECT_EQ(z.rank, 2);
  EXPECT_EQ(z.dtype, KILN_FLOAT32);
  expect_run(library, "dtype", "hi", {"sr_hi"}, {"y", "z"});
  expect_run(library, "dtype", "lo", {"sr_lo"}, {"y", "z"});
}

}  // namespace
}  // namespace kiln
