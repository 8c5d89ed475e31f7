#include "autotune/conv_choice.h"

#include "autotune/depthwise_template.h"
#include "autotune/nhwc_conv_template.h"
#include "autotune/nhwc_direct_template.h"
#include "autotune/template_text.h"
#include "autotune/winograd_template.h"

#include <fmt/format.h>

#include <string_view>
#include <utility>

#include "support/error.h"
#include "support/hash.h"

namespace kiln::autotune {
namespace {

constexpr const char* kOpenblasInclude = "/usr/include/x86_64-linux-gnu/openblas-openmp";
constexpr const char* kOpenblasLibrary = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so";

// The problem's constants, as every library source names them.
constexpr std::string_view kConstants =
    R"(constexpr int64_t kN = @N@, kC = @C@, kH = @H@, kW = @W@, kM = @M@;
constexpr int64_t kKH = @KH@, kKW = @KW@, kSH = @SH@, kSW = @SW@, kDH = @DH@, kDW = @DW@;
constexpr int64_t kPT = @PT@, kPL = @PL@, kPB = @PB@, kPR = @PR@, kOH = @OH@, kOW = @OW@;
@GROUP@constexpr int64_t kDepth = @DEPTH@;
)";

// Bias and epilogue in one pass over Y (library choices: the call wrote the plain convolution).
constexpr std::string_view kBiasPass = R"(    // The bias and the epilogue, in a pass over Y.
    const float* bias = Wp + kM * kDepth;
    kiln_rt::parallel_for(kN * kM * kOH * kOW >= (int64_t{1} << 16), kN * kM * kOH,
                          [&](int64_t lo, int64_t hi) {
        for (int64_t m = lo; m < hi; ++m) {
            const float bq = bias[(m / kOH) % kM];
            float* y = Y + m * kOW;
            for (int64_t n = 0; n < kOW; ++n) {
                const float v = y[n] + bq;
                y[n] = @EXPR@;
            }
        }
    });
)";

// oneDNN, timed as a model runs it: through the runtime's convolution call site
// (kiln_rt_conv.h's ConvSite), which cuts the convolution into pieces for the requested threads
// and runs each as a single-threaded oneDNN call on Kiln's pool. (This source once ran the whole
// convolution as one single-threaded call, so at 2 or more threads the autotuner compared
// oneDNN on one thread with templates on all of them.) The site makes its primitives and
// reorders the weights at the first call, and again if the weight pointer changes; it
// serializes calls.
constexpr std::string_view kOnednnSource = R"(// Kiln convolution choice: oneDNN convolution_forward
// Y = epilogue(@PROBLEM@ + bias), @ACT@
#define KILN_RT_WITH_DNNL 1
#include "kiln_rt_conv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

@CONSTANTS@
}  // namespace

extern "C" void @NAME@(const float* X, const float* Wp, float* Y@PARAMS@) {
    static kiln_rt::ConvSite site;
    kiln_rt::ConvParams p;
    p.spatial = 2;
    p.n = kN; p.c = kC; p.m = kM; p.group = @GROUPS@;
    p.channels_last = @CHANNELS_LAST@;
    p.in[1] = kH; p.kernel[1] = kKH; p.out[1] = kOH;
    p.stride[1] = kSH; p.dilation[1] = kDH; p.pad_begin[1] = kPT; p.pad_end[1] = kPB;
    p.in[2] = kW; p.kernel[2] = kKW; p.out[2] = kOW;
    p.stride[2] = kSW; p.dilation[2] = kDW; p.pad_begin[2] = kPL; p.pad_end[2] = kPR;
    site.run(p, X, Wp, Wp + kM * kDepth, Y, true);
@EPILOGUE@}
)";

// im2col (Caffe's layout: one row of OH * OW per (channel, kernel row, kernel column)) then one
// sgemm per image, W [M, C*KH*KW] @ col [C*KH*KW, OH*OW] = Y[b] in NCHW as is.
constexpr std::string_view kIm2colSource = R"(// Kiln convolution choice: im2col + OpenBLAS sgemm
// Y = epilogue(@PROBLEM@ + bias), NCHW
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln_rt_pool.h"

// Concurrent runs of a model library serialize their BLAS products on this lock (the same
// inline variable as kiln_rt_blas.h's).
inline std::mutex kiln_blas_mutex;

namespace {

@CONSTANTS@
// A 1x1, stride-1, unpadded convolution is a GEMM on X as is.
constexpr bool kDirect = kKH == 1 && kKW == 1 && kSH == 1 && kSW == 1 && kPT == 0 && kPL == 0 &&
                         kPB == 0 && kPR == 0;

void im2col(const float* x, float* col) {
  kiln_rt::parallel_for(kDepth * kOH * kOW >= (int64_t{1} << 15), kDepth,
                        [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
        const int64_t ic = t / (kKH * kKW), kh = (t / kKW) % kKH, kw = t % kKW;
        float* dst = col + t * (kOH * kOW);
        for (int64_t oh = 0; oh < kOH; ++oh) {
            const int64_t ih = oh * kSH - kPT + kh * kDH;
            float* d = dst + oh * kOW;
            if (ih < 0 || ih >= kH) {
                std::fill_n(d, kOW, 0.0f);
                continue;
            }
            const float* src = x + (ic * kH + ih) * kW;
            for (int64_t ow = 0; ow < kOW; ++ow) {
                const int64_t iw = ow * kSW - kPL + kw * kDW;
                d[ow] = iw >= 0 && iw < kW ? src[iw] : 0.0f;
            }
        }
    }
  });
}

}  // namespace

extern "C" void @NAME@(const float* X, const float* Wp, float* Y@PARAMS@) {
    static thread_local std::vector<float> col;
    if (!kDirect) col.resize(kDepth * kOH * kOW);
    for (int64_t b = 0; b < kN; ++b) {
        const float* x = X + b * (kC * kH * kW);
        const float* B = x;
        if (!kDirect) {
            im2col(x, col.data());
            B = col.data();
        }
        std::lock_guard<std::mutex> lock(kiln_blas_mutex);
        // Blocks of Y's rows (or columns) as single-threaded calls on Kiln's pool.
        constexpr int64_t kP = kOH * kOW;
        float* y = Y + b * (kM * kP);
        kiln_rt::parallel_gemm(kM, kP, kDepth, [&](bool by_rows, int64_t first, int64_t last) {
            const int64_t rows = by_rows ? last - first : kM, cols = by_rows ? kP : last - first;
            const int64_t w_at = by_rows ? first * kDepth : 0, b_at = by_rows ? 0 : first;
            const int64_t y_at = by_rows ? first * kP : first;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows),
                        static_cast<blasint>(cols), static_cast<blasint>(kDepth), 1.0f, Wp + w_at,
                        static_cast<blasint>(kDepth), B + b_at, static_cast<blasint>(kP), 0.0f,
                        y + y_at, static_cast<blasint>(kP));
        });
    }
@EPILOGUE@}
)";

// The same pass over a channels-last Y: rows of M channels, one per output pixel.
constexpr std::string_view kBiasPassNhwc = R"(    // The bias and the epilogue, in a pass over Y.
    const float* bias = Wp + kM * kDepth;
    kiln_rt::parallel_for(kN * kM * kOH * kOW >= (int64_t{1} << 16), kN * kOH * kOW,
                          [&](int64_t lo, int64_t hi) {
        for (int64_t m = lo; m < hi; ++m) {
            float* y = Y + m * kM;
            for (int64_t n = 0; n < kM; ++n) {
                const float v = y[n] + bias[n];
                y[n] = @EXPR@;
            }
        }
    });
)";

std::vector<std::pair<std::string, std::string>> values(const ConvProblem& p,
                                                        const std::string& function_name,
                                                        const TemplateEpilogue& epilogue) {
  auto s = [](int64_t v) { return std::to_string(v); };
  std::vector<std::pair<std::string, std::string>> constants = {
      {"N", s(p.n)},           {"C", s(p.c)},           {"H", s(p.h)},
      {"W", s(p.w)},           {"M", s(p.m)},           {"KH", s(p.kh)},
      {"KW", s(p.kw)},         {"SH", s(p.stride_h)},   {"SW", s(p.stride_w)},
      {"DH", s(p.dilation_h)}, {"DW", s(p.dilation_w)}, {"PT", s(p.pad_top)},
      {"PL", s(p.pad_left)},   {"PB", s(p.pad_bottom)}, {"PR", s(p.pad_right)},
      {"OH", s(p.oh())},       {"OW", s(p.ow())}};
  // A grouped convolution's weight rows are C / G long.
  if (p.group == 1) {
    constants.insert(constants.end(), {{"GROUP", ""}, {"DEPTH", "kC * kKH * kKW"}});
  } else {
    constants.insert(constants.end(),
                     {{"GROUP", fmt::format("constexpr int64_t kG = {};\n", p.group)},
                      {"DEPTH", "kC / kG * kKH * kKW"}});
  }
  const std::string pass =
      substitute_placeholders(std::string(p.channels_last ? kBiasPassNhwc : kBiasPass),
                              {{"EXPR", epilogue_value(epilogue)}});
  return {{"CONSTANTS", substitute_placeholders(std::string(kConstants), constants)},
          {"WDIMS", p.group == 1 ? "{kM, kC, kKH, kKW}" : "{kG, kM / kG, kC / kG, kKH, kKW}"},
          {"WTAG", p.group == 1 ? "oihw" : "goihw"},
          {"PROBLEM", p.text()},
          {"ACT", p.channels_last ? "nhwc" : "nchw"},
          {"NAME", function_name},
          {"PARAMS", epilogue_params(epilogue)},
          {"EPILOGUE", pass}};
}

// Library choices read W [M, C*KH*KW] as is, the bias after it.
std::vector<float> plain_weight(const ConvProblem& p, const float* w, const float* bias) {
  std::vector<float> out(w, w + p.m * p.depth());
  if (bias != nullptr) {
    out.insert(out.end(), bias, bias + p.m);
  } else {
    out.resize(out.size() + static_cast<size_t>(p.m), 0.0f);
  }
  return out;
}

// The oneDNN source applies the bias itself; only the epilogue is a pass.
std::string onednn_epilogue(const ConvProblem& p, const TemplateEpilogue& epilogue) {
  if (epilogue.empty()) return "";
  if (p.channels_last) {
    return fmt::format(
        "    // The epilogue, in a pass over Y.\n"
        "    kiln_rt::parallel_for(kN * kM * kOH * kOW >= (int64_t{{1}} << 16), kN * kOH * kOW,\n"
        "                          [&](int64_t lo, int64_t hi) {{\n"
        "        for (int64_t m = lo; m < hi; ++m) {{\n"
        "            float* y = Y + m * kM;\n"
        "            for (int64_t n = 0; n < kM; ++n) {{\n"
        "                const float v = y[n];\n"
        "                y[n] = ({});\n"
        "            }}\n"
        "        }}\n"
        "    }});\n",
        epilogue.expr);
  }
  return fmt::format(
      "    // The epilogue, in a pass over Y.\n"
      "    kiln_rt::parallel_for(kN * kM * kOH * kOW >= (int64_t{{1}} << 16), kN * kM * kOH,\n"
      "                          [&](int64_t lo, int64_t hi) {{\n"
      "        for (int64_t m = lo; m < hi; ++m) {{\n"
      "            float* y = Y + m * kOW;\n"
      "            for (int64_t n = 0; n < kOW; ++n) {{\n"
      "                const float v = y[n];\n"
      "                y[n] = ({});\n"
      "            }}\n"
      "        }}\n"
      "    }});\n",
      epilogue.expr);
}

class LibraryChoice final : public ConvChoice {
 public:
  LibraryChoice(const ConvProblem& problem, bool onednn) : problem_(problem), onednn_(onednn) {
    check_conv_problem(problem);
    KILN_CHECK(onednn || problem.group == 1, "im2col choice: {} is grouped", problem.text());
    KILN_CHECK(onednn || !problem.channels_last, "im2col choice: {} is channels-last",
               problem.text());
  }
  std::string name() const override { return onednn_ ? "onednn" : "im2col-openblas"; }
  std::string backend() const override { return "extern"; }
  std::vector<float> prepare(const float* w, const float* bias) const override {
    return plain_weight(problem_, w, bias);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    auto v = values(problem_, function_name, epilogue);
    if (onednn_) {
      v.back().second = onednn_epilogue(problem_, epilogue);
      v.push_back({"GROUPS", std::to_string(problem_.group)});
      v.push_back({"CHANNELS_LAST", problem_.channels_last ? "1" : "0"});
      return substitute_placeholders(std::string(kOnednnSource), v);
    }
    return substitute_placeholders(std::string(kIm2colSource), v);
  }
  ChoiceLinkage linkage() const override {
    if (onednn_) return {{}, {"dnnl"}};
    return {{kOpenblasInclude}, {kOpenblasLibrary}};
  }
  const ConvProblem& problem() const override { return problem_; }

 private:
  ConvProblem problem_;
  bool onednn_;
};

class TemplateChoice final : public ConvChoice {
 public:
  TemplateChoice(const ConvConfig& config, const ConvProblem& problem)
      : config_(config), problem_(problem) {
    check_conv_config(config);
    check_conv_problem(problem);
    KILN_CHECK(!problem.channels_last, "conv template: {} is channels-last", problem.text());
  }
  std::string name() const override { return "template " + config_.name(); }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* w, const float* bias) const override {
    return prepack_conv_weights(config_, problem_, w, bias);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return render_conv(config_, problem_, function_name, epilogue);
  }
  const ConvConfig* template_config() const override { return &config_; }
  const ConvProblem& problem() const override { return problem_; }

 private:
  ConvConfig config_;
  ConvProblem problem_;
};

// The depthwise template (autotune/depthwise_template.h): W as it is, then the bias.
class DepthwiseChoice final : public ConvChoice {
 public:
  DepthwiseChoice(TemplateIsa isa, const ConvProblem& problem) : isa_(isa), problem_(problem) {
    check_conv_problem(problem);
    KILN_CHECK(problem.depthwise() && !problem.channels_last,
               "depthwise choice: {} is not a depthwise NCHW convolution", problem.text());
  }
  std::string name() const override { return std::string(kDepthwisePrefix) + isa_name(isa_); }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* w, const float* bias) const override {
    return plain_weight(problem_, w, bias);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return render_depthwise(isa_, problem_, function_name, epilogue);
  }
  const ConvProblem& problem() const override { return problem_; }

  static constexpr std::string_view kDepthwisePrefix = "depthwise ";

 private:
  TemplateIsa isa_;
  ConvProblem problem_;
};

// The Winograd template (autotune/winograd_template.h), F(4x4, 3x3) or ("-f2") F(2x2, 3x3), on
// NCHW or channels-last activations ("-nhwc"): W as it is, then the bias; the function
// transforms the weights on its first call.
class WinogradChoice final : public ConvChoice {
 public:
  WinogradChoice(TemplateIsa isa, int tile, const ConvProblem& problem)
      : isa_(isa), tile_(tile), problem_(problem) {
    check_conv_problem(problem);
    KILN_CHECK(winograd_applies(problem, tile),
               "winograd choice: {} is not a 3x3 stride-1 convolution", problem.text());
  }
  std::string name() const override {
    return std::string(prefix(tile_, problem_.channels_last)) + isa_name(isa_);
  }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* w, const float* bias) const override {
    return plain_weight(problem_, w, bias);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return render_winograd(isa_, tile_, problem_, function_name, epilogue);
  }
  const ConvProblem& problem() const override { return problem_; }

  static constexpr std::string_view prefix(int tile, bool channels_last) {
    if (tile == 2) return channels_last ? "winograd-f2-nhwc " : "winograd-f2 ";
    return channels_last ? "winograd-nhwc " : "winograd ";
  }

 private:
  TemplateIsa isa_;
  int tile_;
  ConvProblem problem_;
};

// The channels-last 1x1 convolution as the GEMM template (autotune/nhwc_conv_template.h): W^T
// packed for its config, then the bias.
class NhwcPointwiseChoice final : public ConvChoice {
 public:
  NhwcPointwiseChoice(const GemmConfig& config, const ConvProblem& problem)
      : config_(config), problem_(problem) {
    check_gemm_config(config);
    check_conv_problem(problem);
    KILN_CHECK(nhwc_pointwise_applies(problem),
               "pointwise choice: {} is not a channels-last 1x1 convolution", problem.text());
  }
  std::string name() const override { return std::string(kPrefix) + config_.name(); }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* w, const float* bias) const override {
    return prepack_nhwc_pointwise(config_, problem_, w, bias);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return render_nhwc_pointwise(config_, problem_, function_name, epilogue);
  }
  int64_t weight_offset(int64_t m, int64_t t) const override {
    return nhwc_pointwise_weight_offset(config_, problem_, m, t);
  }
  int64_t bias_offset(int64_t m) const override {
    return nhwc_pointwise_bias_offset(config_, problem_, m);
  }
  // Over more than one K block the GEMM keeps partial sums in Y.
  bool stores_once() const override { return problem_.c <= config_.kc; }
  bool takes_input_scale() const override { return problem_.n == 1; }
  std::string render_with_input_scale(const std::string& function_name,
                                      const TemplateEpilogue& epilogue) const override {
    return render_nhwc_pointwise_scaled(config_, problem_, function_name, epilogue);
  }
  std::string prologue_refusal(const ConvChoice& producer) const override;
  std::string render_with_prologue(const ConvChoice& producer,
                                   const TemplateEpilogue& producer_epilogue,
                                   const std::string& function_name,
                                   const TemplateEpilogue& epilogue) const override;
  // The projection after a depthwise prologue runs a row at a time.
  bool epilogue_reads_buffers_with_prologue() const override { return false; }
  const ConvProblem& problem() const override { return problem_; }
  const GemmConfig& config() const { return config_; }

  static constexpr std::string_view kPrefix = "pointwise-nhwc ";

 private:
  GemmConfig config_;
  ConvProblem problem_;
};

// The channels-last depthwise template (autotune/nhwc_conv_template.h): W tap-major, then the
// bias.
class NhwcDepthwiseChoice final : public ConvChoice {
 public:
  NhwcDepthwiseChoice(TemplateIsa isa, const ConvProblem& problem) : isa_(isa), problem_(problem) {
    check_conv_problem(problem);
    KILN_CHECK(nhwc_depthwise_applies(problem),
               "depthwise choice: {} is not a channels-last depthwise convolution", problem.text());
  }
  std::string name() const override { return std::string(kPrefix) + isa_name(isa_); }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* w, const float* bias) const override {
    return prepack_nhwc_depthwise(problem_, w, bias);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return render_nhwc_depthwise(isa_, problem_, function_name, epilogue);
  }
  int64_t weight_offset(int64_t m, int64_t t) const override { return t * problem_.m + m; }
  int64_t bias_offset(int64_t m) const override {
    return problem_.kh * problem_.kw * problem_.m + m;
  }
  std::string prologue_refusal(const ConvChoice& producer) const override {
    if (dynamic_cast<const NhwcPointwiseChoice*>(&producer) == nullptr) {
      return "its input is not computed by the pointwise template";
    }
    if (!nhwc_expand_depthwise_applies(producer.problem(), problem_)) {
      return fmt::format("{} does not feed {} row by row", producer.problem().text(),
                         problem_.text());
    }
    return "";
  }
  std::string render_with_prologue(const ConvChoice& producer,
                                   const TemplateEpilogue& producer_epilogue,
                                   const std::string& function_name,
                                   const TemplateEpilogue& epilogue) const override {
    KILN_CHECK(prologue_refusal(producer).empty(), "depthwise choice: {} as its prologue: {}",
               producer.name(), prologue_refusal(producer));
    const auto& pointwise = dynamic_cast<const NhwcPointwiseChoice&>(producer);
    return render_nhwc_expand_depthwise(pointwise.config(), pointwise.problem(), producer_epilogue,
                                        isa_, problem_, function_name, epilogue);
  }
  const ConvProblem& problem() const override { return problem_; }
  TemplateIsa isa() const { return isa_; }

  static constexpr std::string_view kPrefix = "depthwise-nhwc ";

 private:
  TemplateIsa isa_;
  ConvProblem problem_;
};

// A projection takes the depthwise convolution that computes its X as its prologue (the
// reverse of the depthwise template's expansion prologue: MobileNetV2's first block, whose
// depthwise output is 1.6 MB at 112 x 112).
std::string NhwcPointwiseChoice::prologue_refusal(const ConvChoice& producer) const {
  if (dynamic_cast<const NhwcDepthwiseChoice*>(&producer) == nullptr) {
    return "its input is not computed by the depthwise template";
  }
  if (!nhwc_depthwise_project_applies(producer.problem(), problem_)) {
    return fmt::format("{} does not feed {} pixel by pixel", producer.problem().text(),
                       problem_.text());
  }
  return "";
}

std::string NhwcPointwiseChoice::render_with_prologue(const ConvChoice& producer,
                                                      const TemplateEpilogue& producer_epilogue,
                                                      const std::string& function_name,
                                                      const TemplateEpilogue& epilogue) const {
  KILN_CHECK(prologue_refusal(producer).empty(), "pointwise choice: {} as its prologue: {}",
             producer.name(), prologue_refusal(producer));
  const auto& depthwise = dynamic_cast<const NhwcDepthwiseChoice&>(producer);
  return render_nhwc_depthwise_project(depthwise.isa(), depthwise.problem(), producer_epilogue,
                                       config_, problem_, function_name, epilogue);
}

// The channels-last direct template (autotune/nhwc_direct_template.h): W packed tap-major into
// its config's channel panels, then the bias.
class NhwcDirectChoice final : public ConvChoice {
 public:
  NhwcDirectChoice(const ConvConfig& config, const ConvProblem& problem)
      : config_(config), problem_(problem) {
    check_nhwc_direct(config, problem);
  }
  std::string name() const override { return std::string(kPrefix) + config_.name(); }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* w, const float* bias) const override {
    return prepack_nhwc_direct(config_, problem_, w, bias);
  }
  std::string render(const std::string& function_name,
                     const TemplateEpilogue& epilogue) const override {
    return render_nhwc_direct(config_, problem_, function_name, epilogue);
  }
  int64_t weight_offset(int64_t m, int64_t t) const override {
    return nhwc_direct_weight_offset(config_, problem_, m, t);
  }
  int64_t bias_offset(int64_t m) const override {
    return nhwc_direct_bias_offset(config_, problem_, m);
  }
  bool stores_once() const override { return true; }
  const ConvProblem& problem() const override { return problem_; }

  static constexpr std::string_view kPrefix = "direct-nhwc ";

 private:
  ConvConfig config_;
  ConvProblem problem_;
};

// "avx512" or "avx2" after `prefix` in a choice name.
TemplateIsa isa_after_prefix(const std::string& name, std::string_view prefix) {
  const std::string isa = name.substr(prefix.size());
  KILN_CHECK(isa == "avx2" || isa == "avx512", "unknown convolution choice '{}'", name);
  return isa == "avx512" ? TemplateIsa::kAvx512 : TemplateIsa::kAvx2;
}

// Grouped NCHW convolutions: the depthwise template first (it needs no reorder of the
// activations, where oneDNN's depthwise kernels reorder NCHW to channels-last and back around
// every call), then oneDNN. Other grouped NCHW convolutions have oneDNN only (channels-last ones
// have the direct template too).
std::vector<ConvChoicePtr> grouped_choices(const ConvProblem& problem, TemplateIsa isa) {
  std::vector<ConvChoicePtr> choices;
  if (problem.depthwise()) choices.push_back(std::make_shared<DepthwiseChoice>(isa, problem));
  choices.push_back(make_conv_onednn_choice(problem));
  return choices;
}

// Channels-last problems: the pointwise, depthwise, Winograd or direct template first, then
// oneDNN on nhwc, then the other configs of the pointwise and direct templates.
std::vector<ConvChoicePtr> channels_last_choices(const ConvProblem& problem, int threads,
                                                 TemplateIsa isa) {
  std::vector<ConvChoicePtr> choices;
  if (nhwc_depthwise_applies(problem)) {
    choices.push_back(std::make_shared<NhwcDepthwiseChoice>(isa, problem));
  }
  std::vector<GemmConfig> configs;
  if (nhwc_pointwise_applies(problem)) {
    const GemmConfig first = nhwc_pointwise_config(problem, threads, isa);
    choices.push_back(std::make_shared<NhwcPointwiseChoice>(first, problem));
    for (const GemmConfig& config : gemm_configs(problem.n * problem.h * problem.w,
                                                 {.n = problem.m, .k = problem.c}, threads, isa)) {
      if (!(config == first)) configs.push_back(config);
    }
  }
  // Winograd first for 3x3 stride-1 convolutions of 14 x 14 or more outputs with 32 or more
  // channels in and out whose transformed weights (36 * C * M floats, 4x W) take at most 16 MiB.
  // Alone, at ResNet's 56 x 56 x 64, 28 x 28 x 128 and 14 x 14 x 256 layers it ran 2.7x, 2.5x
  // and 1.9x faster than the direct template (2 threads of an AMD EPYC, both ISAs alike), and at
  // 7 x 7 x 512 (4 tiles, a third of them padding; 38 MB of transformed weights) 2x slower.
  // Within a network each layer's weights come from memory: the 9.4 MB of the 14 x 14 x 256
  // layer's took it from 0.55 ms alone to 0.73-0.83 within ResNet-50, still ahead of the direct
  // template's 1.0-1.1 at AVX-512 on that EPYC, which splits 512-bit FMAs in two halves (ResNet-50
  // 4-5 % faster, ResNet-18 7-8 %, `kiln bench --against`), and level with it on an AMX-capable
  // Xeon, whose full-width AVX-512 direct template is twice as fast (both models 1.00-1.01).
  const int64_t winograd_weight_bytes = int64_t{16} << 20;
  const int64_t outputs = problem.oh() * problem.ow();
  const int64_t f4_weight_bytes = 36 * problem.c * problem.m * 4;
  // But at AVX-512 F(4x4) can be bound by reading its transformed weights: each is read once a
  // call and serves every tile, and a layer of a network finds them in memory. With 16 tiles or
  // fewer (one image of 13 x 13 to 16 x 16 outputs) and 8 MiB or more of them, F(2x2), whose
  // weights are 16/36 the size and serve 3-4x the tiles, comes first. Timed by `--autotune max`
  // (weights evicted; Emerald Rapids Xeon, 2 threads): 14 x 14 x 256 (9.4 MB) F(2x2) 0.50 ms
  // against F(4x4)'s 0.60; 14 x 14 x 512 (38 MB) 1.91 against 2.36 and the direct template's
  // 2.88. Below the limits F(4x4) stays ahead: 14 x 14 x 192 (5.3 MB) 0.25 against 0.28, and
  // 20 x 20 x 256 (25 tiles) 0.63 against 0.87. Within ResNet-50 its five 14 x 14 x 256 layers
  // took 0.48-0.50 ms instead of 0.60-0.64, and the network ran 2-3.6 % faster (ResNet-18 3.6 %;
  // `kiln bench --against`, both orders). AVX2 keeps F(4x4): its multiply-adds, at half the
  // width, bound it (14 x 14 x 256: 0.66 ms against F(2x2)'s 0.83). On an AMD EPYC of the Zen 5
  // generation (full-width AVX-512) the two read level at 14 x 14 x 256 (0.32-0.40 ms against
  // 0.33-0.37). Not measured on a CPU that splits 512-bit FMAs in two, as Zen 4 does.
  const int64_t f4_tiles = problem.n * ceil_div(problem.oh(), 4) * ceil_div(problem.ow(), 4);
  const bool f4_reads_bound =
      isa == TemplateIsa::kAvx512 && f4_tiles <= 16 && f4_weight_bytes >= (int64_t{8} << 20);
  const bool winograd = winograd_applies(problem);
  const bool winograd_first = winograd && outputs >= 196 && problem.c >= 32 && problem.m >= 32 &&
                              !f4_reads_bound && f4_weight_bytes <= winograd_weight_bytes;
  if (winograd_first) choices.push_back(std::make_shared<WinogradChoice>(isa, 4, problem));
  // F(2x2, 3x3) first where F(4x4) is bound by its weights (above), and at AVX2 where F(4x4) is
  // not first over 7 x 7 to 13 x 13 outputs; both with 32 or more channels in and out and at most
  // 16 MiB of transformed weights (16 * C * M floats, 16/9 of W). At ResNet's 7 x 7 x 512 layers
  // its 16 tiles of 2x2 do 2.25x fewer multiply-adds than the direct template, with 1.3x the
  // output padded, and read 16 MiB instead of 9 (2 threads of the AMD EPYC, x86-64-v3 variant:
  // ResNet-50 2.9-4.4 % faster, ResNet-18 0.7 %). At AVX2, larger outputs where F(4x4) is not
  // first (14 x 14 x 512) keep the direct template: not measured. At AVX-512 the direct template
  // ran the 7 x 7 layers faster than F(2x2) (the networks 0.98-0.996 of their time with it), so
  // there it is a later choice.
  const bool winograd2 = winograd_applies(problem, 2);
  const bool winograd2_first = winograd2 && !winograd_first &&
                               ((f4_reads_bound && outputs >= 196) ||
                                (isa == TemplateIsa::kAvx2 && outputs >= 49 && outputs < 196)) &&
                               problem.c >= 32 && problem.m >= 32 &&
                               16 * problem.c * problem.m * 4 <= winograd_weight_bytes;
  if (winograd2_first) choices.push_back(std::make_shared<WinogradChoice>(isa, 2, problem));
  // The direct template's heuristic config before oneDNN: at ResNet-50's 3x3, 7x7 and strided
  // 1x1 layers oneDNN's channels-last convolutions, cut into single-threaded pieces on the pool,
  // ran slower (see the README's bench-ort section); its other configs after. So at ResNeXt-50's
  // grouped 3x3 layers (32 groups; AMD EPYC, 2 threads, AVX-512 variant, in the network):
  // 7 x 7 x 1024 (32 channels a group) 1.1 ms -> 0.17, 14 x 14 x 512 (16) 0.38 -> 0.16,
  // 28 x 28 x 256 (8) 0.31-0.38 -> 0.25, and 56 x 56 x 128 (4, merged in pairs) 0.44-0.56 ->
  // 0.43-0.53.
  // Except for a network's first convolution at AVX2 (at most 4 input channels: an image's): there
  // oneDNN's came first at every measurement (`--autotune max`, 2 threads): MobileNetV2's 3x3 /2
  // stem 0.134-0.163 ms against the direct template's 0.166-0.208 on an Intel Xeon, ResNet's 7x7
  // /2 stem 1.35-1.60 against 1.43-1.73 there and 1.04 against 1.11 on an AMD EPYC. (At AVX-512
  // the direct template stays first: on that Xeon it ran ResNet's stem 3 % faster, MobileNetV2's
  // 17 % slower.)
  const bool onednn_first = isa == TemplateIsa::kAvx2 && problem.group == 1 && problem.c <= 4;
  if (onednn_first) choices.push_back(make_conv_onednn_choice(problem));
  std::vector<ConvConfig> direct;
  if (nhwc_direct_applies(problem)) direct = nhwc_direct_configs(problem, isa);
  if (!direct.empty()) choices.push_back(std::make_shared<NhwcDirectChoice>(direct[0], problem));
  if (!onednn_first) choices.push_back(make_conv_onednn_choice(problem));
  for (const GemmConfig& config : configs) {
    choices.push_back(std::make_shared<NhwcPointwiseChoice>(config, problem));
  }
  if (winograd && !winograd_first) {
    choices.push_back(std::make_shared<WinogradChoice>(isa, 4, problem));
  }
  if (winograd2 && !winograd2_first) {
    choices.push_back(std::make_shared<WinogradChoice>(isa, 2, problem));
  }
  for (size_t i = 1; i < direct.size(); ++i) {
    choices.push_back(std::make_shared<NhwcDirectChoice>(direct[i], problem));
  }
  return choices;
}

// The pointwise choice whose config is named `config_name`: one of the configs gemm_configs
// proposes for some thread count and ISA (the name does not say which).
ConvChoicePtr pointwise_choice_named(const std::string& config_name, const ConvProblem& problem) {
  for (TemplateIsa isa : {TemplateIsa::kAvx512, TemplateIsa::kAvx2}) {
    for (int threads : {1, 2, 4, 8, 16, 32, 64, 128}) {
      for (const GemmConfig& config : gemm_configs(
               problem.n * problem.h * problem.w, {.n = problem.m, .k = problem.c}, threads, isa)) {
        if (config.name() == config_name) {
          return std::make_shared<NhwcPointwiseChoice>(config, problem);
        }
      }
    }
  }
  internal_error("unknown pointwise convolution config '{}'", config_name);
}

}  // namespace

int64_t ConvChoice::weight_offset(int64_t m, int64_t t) const {
  const ConvConfig* config = template_config();
  const int64_t ocb = config ? config->ocb : 1;
  return (m / ocb * problem().depth() + t) * ocb + m % ocb;
}

int64_t ConvChoice::bias_offset(int64_t m) const {
  const ConvConfig* config = template_config();
  const int64_t ocb = config ? config->ocb : 1;
  return ceil_div(problem().m, ocb) * ocb * problem().depth() + m;
}

std::string ConvChoice::prologue_refusal(const ConvChoice& /*producer*/) const {
  return fmt::format("the {} choice takes no prologue", name());
}

std::string ConvChoice::render_with_prologue(const ConvChoice& producer,
                                             const TemplateEpilogue& /*producer_epilogue*/,
                                             const std::string& /*function_name*/,
                                             const TemplateEpilogue& /*epilogue*/) const {
  internal_error("convolution choice {}: {} as its prologue", name(), producer.name());
}

std::string ConvChoice::render_with_input_scale(const std::string& /*function_name*/,
                                                const TemplateEpilogue& /*epilogue*/) const {
  internal_error("convolution choice {} takes no input scale", name());
}

std::string ConvChoice::hash_key() const {
  Sha256 hash;
  hash.update(name()).update("\n").update(backend()).update("\n");
  hash.update(render("kiln_conv_choice"));
  const ChoiceLinkage link = linkage();
  for (const std::string& dir : link.include_dirs) hash.update("\n-I").update(dir);
  for (const std::string& library : link.libraries) hash.update("\n-l").update(library);
  return hash.hex_digest();
}

ConvChoicePtr make_conv_onednn_choice(const ConvProblem& problem) {
  return std::make_shared<LibraryChoice>(problem, true);
}

ConvChoicePtr make_conv_im2col_choice(const ConvProblem& problem) {
  return std::make_shared<LibraryChoice>(problem, false);
}

ConvChoicePtr make_conv_template_choice(const ConvConfig& config, const ConvProblem& problem) {
  return std::make_shared<TemplateChoice>(config, problem);
}

std::vector<ConvChoicePtr> conv_choices(const ConvProblem& problem, int threads, TemplateIsa isa) {
  if (problem.channels_last) return channels_last_choices(problem, threads, isa);
  if (problem.group != 1) return grouped_choices(problem, isa);
  const std::vector<ConvConfig> configs = conv_configs(problem, threads, isa);
  // oneDNN is the heuristic for 1x1 convolutions over images of 28 x 28 or more: its blocked
  // layouts ran 1.2-1.7x faster than every template config at ResNet-50's 1x1 layers of that size
  // (bench/resnet_conv_bench.cpp, AVX-512, one core), where the template re-reads each input row
  // from memory for every channel block.
  const bool onednn_first =
      configs.empty() || (problem.kh == 1 && problem.kw == 1 && problem.oh() * problem.ow() >= 784);
  // Winograd is the heuristic for 3x3 stride-1 convolutions over 28 x 28 or more outputs with 32
  // or more channels in and out: at ResNet-50's 56 x 56 x 64 and 28 x 28 x 128 layers it ran
  // 1.14-1.23x faster than the best template config and 1.28-1.55x faster than the default one
  // (bench/resnet_conv_bench.cpp, AVX-512 Xeon, 2 cores), while at 14 x 14 and 7 x 7 its few
  // tiles make small products that lose (0.75x and 0.54x).
  const bool winograd = winograd_applies(problem);
  const bool winograd_first =
      winograd && problem.oh() * problem.ow() >= 784 && problem.c >= 32 && problem.m >= 32;
  std::vector<ConvChoicePtr> choices;
  if (winograd_first) choices.push_back(std::make_shared<WinogradChoice>(isa, 4, problem));
  if (onednn_first) choices.push_back(make_conv_onednn_choice(problem));
  if (!configs.empty()) choices.push_back(make_conv_template_choice(configs.front(), problem));
  if (!onednn_first) choices.push_back(make_conv_onednn_choice(problem));
  choices.push_back(make_conv_im2col_choice(problem));
  if (winograd && !winograd_first) {
    choices.push_back(std::make_shared<WinogradChoice>(isa, 4, problem));
  }
  if (winograd_applies(problem, 2)) {
    choices.push_back(std::make_shared<WinogradChoice>(isa, 2, problem));
  }
  for (size_t i = 1; i < configs.size(); ++i) {
    choices.push_back(make_conv_template_choice(configs[i], problem));
  }
  return choices;
}

ConvChoicePtr make_conv_choice(const std::string& name, const ConvProblem& problem) {
  constexpr std::string_view kTemplate = "template ";
  if (name == "onednn") return make_conv_onednn_choice(problem);
  if (name == "im2col-openblas") return make_conv_im2col_choice(problem);
  if (name.rfind(DepthwiseChoice::kDepthwisePrefix, 0) == 0) {
    return std::make_shared<DepthwiseChoice>(
        isa_after_prefix(name, DepthwiseChoice::kDepthwisePrefix), problem);
  }
  if (name.rfind(NhwcDepthwiseChoice::kPrefix, 0) == 0) {
    return std::make_shared<NhwcDepthwiseChoice>(
        isa_after_prefix(name, NhwcDepthwiseChoice::kPrefix), problem);
  }
  if (name.rfind(NhwcPointwiseChoice::kPrefix, 0) == 0) {
    return pointwise_choice_named(name.substr(NhwcPointwiseChoice::kPrefix.size()), problem);
  }
  if (name.rfind(NhwcDirectChoice::kPrefix, 0) == 0) {
    ConvConfig config = decode_conv_config(name.substr(NhwcDirectChoice::kPrefix.size()));
    return std::make_shared<NhwcDirectChoice>(config, problem);
  }
  for (int tile : {4, 2}) {
    for (bool channels_last : {false, true}) {
      const std::string_view prefix = WinogradChoice::prefix(tile, channels_last);
      if (name.rfind(prefix, 0) != 0) continue;
      auto choice = std::make_shared<WinogradChoice>(isa_after_prefix(name, prefix), tile, problem);
      KILN_CHECK(choice->name() == name, "convolution choice '{}' does not apply to {}", name,
                 problem.text());
      return choice;
    }
  }
  KILN_CHECK(name.rfind(kTemplate, 0) == 0, "unknown convolution choice '{}'", name);
  return make_conv_template_choice(decode_conv_config(name.substr(kTemplate.size())), problem);
}

}  // namespace kiln::autotune
