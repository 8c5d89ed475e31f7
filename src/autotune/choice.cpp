#include "autotune/choice.h"

#include "autotune/runtime_headers.h"
#include "autotune/template_text.h"

#include <fmt/format.h>

#include <string_view>
#include <utility>

#include "support/error.h"
#include "support/hash.h"
#include "support/image_path.h"
#include "support/log.h"

namespace kiln::autotune {
namespace {

constexpr const char* kOpenblasInclude = "/usr/include/x86_64-linux-gnu/openblas-openmp";
constexpr const char* kOpenblasLibrary = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so";

void check_problem(const GemmProblem& problem) {
  KILN_CHECK(problem.n > 0 && problem.k >= 0,
             "gemm problem: expected N > 0 and K >= 0, found N {}, K {}", problem.n, problem.k);
}

// The placeholders every library source shares.
std::vector<std::pair<std::string, std::string>> common_values(const GemmProblem& problem,
                                                               const std::string& function_name,
                                                               const TemplateEpilogue& epilogue) {
  return {{"NAME", function_name},
          {"PARAMS", epilogue_params(epilogue)},
          {"N", std::to_string(problem.n)},
          {"K", std::to_string(problem.k)},
          {"EPILOGUE", render_epilogue_pass(problem, epilogue)}};
}

// Library choices read B as is: prepare copies it.
std::vector<float> copy_weight(const GemmProblem& problem, const float* b, int64_t k, int64_t n) {
  KILN_CHECK(k == problem.k && n == problem.n, "gemm prepare: expected B {}x{}, found {}x{}",
             problem.k, problem.n, k, n);
  return std::vector<float>(b, b + k * n);
}

constexpr std::string_view kOpenblasSource = R"(// Kiln GEMM choice: OpenBLAS cblas_sgemm
// C[M, @N@] = epilogue(A[M, @K@] @ B[@K@, @N@]), all row-major
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "kiln_rt_pool.h"

// Concurrent runs of a model library serialize their BLAS products on this lock (the same
// inline variable as kiln_rt_blas.h's); the blocks of one product are single-threaded calls on
// Kiln's pool.
inline std::mutex kiln_blas_mutex;

extern "C" void @NAME@(int64_t M, const float* A, const float* B, float* C@PARAMS@) {
    constexpr int64_t kN = @N@, kK = @K@;
    if (M <= 0) return;
    if (kK == 0) {
        std::fill_n(C, M * kN, 0.0f);
    } else {
        std::lock_guard<std::mutex> lock(kiln_blas_mutex);
        kiln_rt::parallel_gemm(M, kN, kK, [&](bool by_rows, int64_t first, int64_t last) {
            const int64_t rows = by_rows ? last - first : M, cols = by_rows ? kN : last - first;
            const int64_t a_at = by_rows ? first * kK : 0, b_at = by_rows ? 0 : first;
            const int64_t c_at = by_rows ? first * kN : first;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows),
                        static_cast<blasint>(cols), static_cast<blasint>(kK), 1.0f, A + a_at,
                        static_cast<blasint>(kK), B + b_at, static_cast<blasint>(kN), 0.0f,
                        C + c_at, static_cast<blasint>(kN));
        });
    }
@EPILOGUE@}
)";

// oneDNN 2.x: one primitive per M, created on first use under a mutex and kept for the life of
// the library (executing one primitive from several threads at once is allowed), on B as is or
// on B reordered once into the layout the primitive prefers (its blocked layout: format_tag::any,
// the counterpart of the template's prepacked B). @STATE@ and @CALL@ are the two variants'.
constexpr std::string_view kOnednnSource = R"(// Kiln GEMM choice: oneDNN matmul, @VARIANT@
// C[M, @N@] = epilogue(A[M, @K@] @ B[@K@, @N@]), all row-major
#include <dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln_rt_pool.h"

namespace {

@STATE@
}  // namespace

extern "C" void @NAME@(int64_t M, const float* A, const float* B, float* C@PARAMS@) {
    constexpr int64_t kN = @N@, kK = @K@;
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    if (M <= 0) return;
    if (kK == 0) {
        std::fill_n(C, M * kN, 0.0f);
    } else {
        static GemmState state;
        const dnnl::memory::desc a_md({M, kK}, dt::f32, tag::ab);
        const dnnl::memory::desc b_md({kK, kN}, dt::f32, tag::ab);
        const dnnl::memory::desc c_md({M, kN}, dt::f32, tag::ab);
        // oneDNN (OpenMP build) would start an OpenMP team beside Kiln's pool: it creates and
        // runs the primitive on this thread alone.
        kiln_rt::SingleThreadedCall single;
        dnnl::stream stream(state.engine);
@CALL@        stream.wait();
    }
@EPILOGUE@}
)";

constexpr std::string_view kOnednnPlainState = R"(struct GemmState {
    dnnl::engine engine{dnnl::engine::kind::cpu, 0};
    std::mutex mutex;
    std::map<int64_t, dnnl::matmul> by_m;
};
)";

constexpr std::string_view kOnednnPlainCall = R"(        dnnl::matmul matmul;
        {
            std::lock_guard<std::mutex> lock(state.mutex);
            auto found = state.by_m.find(M);
            if (found == state.by_m.end()) {
                const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md),
                                                      state.engine);
                found = state.by_m.emplace(M, dnnl::matmul(pd)).first;
            }
            matmul = found->second;
        }
        dnnl::memory a(a_md, state.engine, const_cast<float*>(A));
        dnnl::memory b(b_md, state.engine, const_cast<float*>(B));
        dnnl::memory c(c_md, state.engine, C);
        matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
)";

constexpr std::string_view kOnednnPackedState =
    R"(// Per M: the primitive, and B reordered once into the layout it chose.
struct Packed {
    dnnl::matmul matmul;
    const float* source = nullptr;
    dnnl::memory weights;
};

struct GemmState {
    dnnl::engine engine{dnnl::engine::kind::cpu, 0};
    std::mutex mutex;
    std::map<int64_t, Packed> by_m;
};
)";

constexpr std::string_view kOnednnPackedCall =
    R"(        const dnnl::memory::desc any_md({kK, kN}, dt::f32, tag::any);
        dnnl::matmul matmul;
        dnnl::memory weights;
        {
            std::lock_guard<std::mutex> lock(state.mutex);
            Packed& p = state.by_m[M];
            if (!p.matmul) {
                const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, any_md, c_md),
                                                      state.engine);
                p.matmul = dnnl::matmul(pd);
                p.weights = dnnl::memory(pd.weights_desc(), state.engine);
            }
            if (p.source != B) {  // a constant weight: reordered on the first call only
                dnnl::memory plain(b_md, state.engine, const_cast<float*>(B));
                dnnl::reorder(plain, p.weights).execute(stream, plain, p.weights);
                stream.wait();
                p.source = B;
            }
            matmul = p.matmul;
            weights = p.weights;
        }
        dnnl::memory a(a_md, state.engine, const_cast<float*>(A));
        dnnl::memory c(c_md, state.engine, C);
        matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, c}});
)";

class OpenblasChoice final : public GemmChoice {
 public:
  explicit OpenblasChoice(const GemmProblem& problem) : problem_(problem) {
    check_problem(problem);
  }
  std::string name() const override { return "openblas"; }
  std::string backend() const override { return "extern"; }
  std::vector<float> prepare(const float* b, int64_t k, int64_t n) const override {
    return copy_weight(problem_, b, k, n);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return substitute_placeholders(std::string(kOpenblasSource),
                                   common_values(problem_, function_name, epilogue));
  }
  ChoiceLinkage linkage() const override { return {{kOpenblasInclude}, {kOpenblasLibrary}}; }

 private:
  GemmProblem problem_;
};

class OnednnChoice final : public GemmChoice {
 public:
  OnednnChoice(const GemmProblem& problem, bool packed) : problem_(problem), packed_(packed) {
    check_problem(problem);
  }
  std::string name() const override { return packed_ ? "onednn-packed" : "onednn"; }
  std::string backend() const override { return "extern"; }
  std::vector<float> prepare(const float* b, int64_t k, int64_t n) const override {
    return copy_weight(problem_, b, k, n);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    std::vector<std::pair<std::string, std::string>> values =
        common_values(problem_, function_name, epilogue);
    values.emplace_back("VARIANT", packed_ ? "B in its blocked layout" : "B plain");
    values.emplace_back("STATE", packed_ ? kOnednnPackedState : kOnednnPlainState);
    values.emplace_back("CALL", packed_ ? kOnednnPackedCall : kOnednnPlainCall);
    return substitute_placeholders(std::string(kOnednnSource), values);
  }
  ChoiceLinkage linkage() const override { return {{}, {"dnnl"}}; }

 private:
  GemmProblem problem_;
  bool packed_;
};

class TemplateChoice final : public GemmChoice {
 public:
  TemplateChoice(const GemmConfig& config, const GemmProblem& problem)
      : config_(config), problem_(problem) {
    check_gemm_config(config);
    check_problem(problem);
  }
  std::string name() const override { return "template " + config_.name(); }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* b, int64_t k, int64_t n) const override {
    KILN_CHECK(k == problem_.k && n == problem_.n, "gemm prepare: expected B {}x{}, found {}x{}",
               problem_.k, problem_.n, k, n);
    return prepack_b(config_, problem_, b);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return render_gemm(config_, problem_, function_name, epilogue);
  }
  const GemmConfig* template_config() const override { return &config_; }
  // Over more than one K block the template keeps partial sums in C.
  bool stores_once() const override { return problem_.k <= config_.kc; }

 private:
  GemmConfig config_;
  GemmProblem problem_;
};

}  // namespace

std::string substitute_placeholders(
    std::string text, const std::vector<std::pair<std::string, std::string>>& values) {
  for (const auto& [key, value] : values) {
    const std::string token = "@" + key + "@";
    for (size_t at = text.find(token); at != std::string::npos;
         at = text.find(token, at + value.size())) {
      text.replace(at, token.size(), value);
    }
  }
  return text;
}

std::string GemmChoice::hash_key() const {
  Sha256 hash;
  hash.update(name()).update("\n").update(backend()).update("\n");
  hash.update(render("kiln_gemm_choice"));
  const ChoiceLinkage link = linkage();
  for (const std::string& dir : link.include_dirs) hash.update("\n-I").update(dir);
  for (const std::string& library : link.libraries) hash.update("\n-l").update(library);
  return hash.hex_digest();
}

GemmChoicePtr make_openblas_choice(const GemmProblem& problem) {
  return std::make_shared<OpenblasChoice>(problem);
}

GemmChoicePtr make_onednn_choice(const GemmProblem& problem, bool packed) {
  return std::make_shared<OnednnChoice>(problem, packed);
}

GemmChoicePtr make_template_choice(const GemmConfig& config, const GemmProblem& problem) {
  return std::make_shared<TemplateChoice>(config, problem);
}

std::vector<GemmChoicePtr> gemm_choices(int64_t m_hint, const GemmProblem& problem, int threads,
                                        TemplateIsa isa) {
  const std::vector<GemmConfig> configs = gemm_configs(m_hint, problem, threads, isa);
  std::vector<GemmChoicePtr> choices;
  choices.push_back(make_template_choice(configs.front(), problem));
  choices.push_back(make_openblas_choice(problem));
  choices.push_back(make_onednn_choice(problem));
  choices.push_back(make_onednn_choice(problem, /*packed=*/true));
  for (size_t i = 1; i < configs.size(); ++i) {
    choices.push_back(make_template_choice(configs[i], problem));
  }
  return choices;
}

// An installed Kiln (PREFIX/bin/kiln, PREFIX/lib/libkiln.so) uses the headers installed beside
// it, so it keeps working when the source tree it was built from is gone; a build tree has no
// such folders and uses the source tree's.
std::filesystem::path runtime_include_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path installed = installed_path("share/kiln/runtime");
    if (installed.empty()) installed = KILN_RUNTIME_INCLUDE_DIR;
    log::write(log::Category::kCompile, "runtime headers: {}", installed.string());
    return installed;
  }();
  return dir;
}

void add_runtime(codecache::CompilerConfig& config) {
  config.include_dirs.push_back(runtime_include_dir());
  config.shared_sources.push_back(runtime_include_dir() / "kiln_rt.cpp");
  config.shared_sources.push_back(runtime_include_dir() / "kiln_rt_pool.cpp");
}

std::string render_epilogue_pass(const GemmProblem& problem, const TemplateEpilogue& epilogue) {
  if (epilogue.empty()) return "";
  return fmt::format(
      "    // The epilogue, in a pass over C.\n"
      "    kiln_rt::parallel_for(M * {0} >= (int64_t{{1}} << 16), M, [&](int64_t lo, int64_t hi) "
      "{{\n"
      "        for (int64_t m = lo; m < hi; ++m) {{\n"
      "            #pragma omp simd\n"
      "            for (int64_t n = 0; n < {0}; ++n) {{\n"
      "                const float v = C[m * {0} + n];\n"
      "                C[m * {0} + n] = ({1});\n"
      "            }}\n"
      "        }}\n"
      "    }});\n",
      problem.n, epilogue.expr);
}

}  // namespace kiln::autotune
