// Concurrent streams and CUDA graph segments (issue 19): the side stream of a residual block's
// projection shortcut in the generated wrapper, the memory plan around it, and, with a GPU, runs
// of such a block and of a model with a host fallback in the middle against references in
// double, with graphs and the side stream each on and off.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "graph/graph.h"
#include "model_builder.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

using namespace cuda_test;  // NOLINT: the shared fixtures
using graph::DType;

graph::Tensor random_tensor(std::vector<int64_t> dims, std::mt19937& rng, float scale = 1) {
  graph::Tensor t(DType::kFloat32, std::move(dims));
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (float& v : t.mutable_values<float>()) v = dist(rng);
  return t;
}

std::vector<double> doubles(const graph::Tensor& t) {
  return {t.values<float>().begin(), t.values<float>().end()};
}

/// A convolution in double: x [C, H, W] (batch 1), w [M, C, K, K], bias [M], square stride and
/// padding; returns [M, OH, OW].
std::vector<double> conv_ref(const std::vector<double>& x, int64_t c, int64_t h, int64_t w,
                             const std::vector<double>& wt, const std::vector<double>& bias,
                             int64_t m, int64_t k, int64_t stride, int64_t pad, bool relu) {
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  std::vector<double> y(static_cast<size_t>(m * oh * ow));
  for (int64_t o = 0; o < m; ++o) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double acc = bias[static_cast<size_t>(o)];
        for (int64_t ci = 0; ci < c; ++ci) {
          for (int64_t di = 0; di < k; ++di) {
            for (int64_t dj = 0; dj < k; ++dj) {
              const int64_t yi = i * stride - pad + di, xj = j * stride - pad + dj;
              if (yi < 0 || yi >= h || xj < 0 || xj >= w) continue;
              acc += x[static_cast<size_t>((ci * h + yi) * w + xj)] *
                     wt[static_cast<size_t>(((o * c + ci) * k + di) * k + dj)];
            }
          }
        }
        y[static_cast<size_t>((o * oh + i) * ow + j)] = relu ? std::max(acc, 0.0) : acc;
      }
    }
  }
  return y;
}

double max_relative_error(const graph::Tensor& got, const std::vector<double>& want) {
  double scale = 0, err = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  const auto g = got.values<float>();
  EXPECT_EQ(g.size(), want.size());
  for (size_t i = 0; i < std::min(g.size(), want.size()); ++i)
    err = std::max(err, std::abs(g[i] - want[i]));
  return err / std::max(scale, 1e-30);
}

/// A ResNet bottleneck with a projection shortcut: x [1, 16, 8, 8]; the main branch Conv 1x1
/// (16 -> 8) + Relu, Conv 3x3 stride 2 (8 -> 8) + Relu, Conv 1x1 (8 -> 32); the shortcut Conv
/// 1x1 stride 2 (16 -> 32); then Relu(main + shortcut), [1, 32, 4, 4]. `weights` gets the
/// weights and biases in that order (w1, b1, w2, b2, w3, b3, ws, bs).
graph::Model bottleneck(std::mt19937& rng, std::vector<std::vector<double>>& weights) {
  test_models::ModelBuilder b;
  graph::Value* x = b.input("x", DType::kFloat32, {1, 16, 8, 8});
  auto conv = [&](graph::Value* in, int64_t m, int64_t c, int64_t k, int64_t stride) {
    graph::Tensor w = random_tensor({m, c, k, k}, rng, 1.0f / std::sqrt(static_cast<float>(c * k)));
    graph::Tensor bias = random_tensor({m}, rng, 0.1f);
    weights.push_back(doubles(w));
    weights.push_back(doubles(bias));
    const int64_t pad = k / 2;
    return b.op("Conv", {in, b.constant(std::move(w)), b.constant(std::move(bias))},
                {{"strides", std::vector<int64_t>{stride, stride}},
                 {"pads", std::vector<int64_t>{pad, pad, pad, pad}}});
  };
  graph::Value* c1 = b.op("Relu", {conv(x, 8, 16, 1, 1)});
  graph::Value* c2 = b.op("Relu", {conv(c1, 8, 8, 3, 2)});
  graph::Value* c3 = conv(c2, 32, 8, 1, 1);
  graph::Value* shortcut = conv(x, 32, 16, 1, 2);
  b.output(b.op("Relu", {b.op("Add", {c3, shortcut})}));
  return std::move(b.model);
}

std::vector<double> bottleneck_ref(const std::vector<double>& x,
                                   const std::vector<std::vector<double>>& p) {
  std::vector<double> c1 = conv_ref(x, 16, 8, 8, p[0], p[1], 8, 1, 1, 0, true);
  std::vector<double> c2 = conv_ref(c1, 8, 8, 8, p[2], p[3], 8, 3, 2, 1, true);
  std::vector<double> c3 = conv_ref(c2, 8, 4, 4, p[4], p[5], 32, 1, 1, 0, false);
  std::vector<double> s = conv_ref(x, 16, 8, 8, p[6], p[7], 32, 1, 2, 0, false);
  for (size_t i = 0; i < c3.size(); ++i) c3[i] = std::max(c3[i] + s[i], 0.0);
  return c3;
}

/// The lines of `text`.
std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// The first line of `wrapper` at or after `from` holding `needle` (its index), or npos.
size_t line_with(const std::vector<std::string>& wrapper, const std::string& needle,
                 size_t from = 0) {
  for (size_t i = from; i < wrapper.size(); ++i) {
    if (wrapper[i].find(needle) != std::string::npos) return i;
  }
  return std::string::npos;
}

// The shortcut's chain and the main branch's fork at x: one fork, its side stream's calls
// between a side(fork0, true) and side(fork0, false), the join before the call that reads the
// chain's result (the residual), a second library workspace for the side stream's cuDNN calls.
TEST(CudaStreams, ProjectionShortcutRunsOnTheSideStreamUntilTheResidual) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  std::mt19937 rng(19);
  std::vector<std::vector<double>> weights;
  TempDir dir;
  Compiled c = compile_cuda_dumped(bottleneck(rng, weights), dir.path, ir::Precision::kFp32);
  const std::string streams = files::read(dir.path / "dump" / "4_streams.txt");
  EXPECT_EQ(count(streams, "fork "), 1u) << streams;
  EXPECT_EQ(count(c.wrapper, "state.cuda.fork(profile == nullptr)"), 1u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "state.cuda.join(fork0)"), 1u) << c.wrapper;
  EXPECT_NE(c.wrapper.find("state.cuda.reserve_library_workspace(2);"), std::string::npos)
      << c.wrapper;
  // Four convolutions, each a cuDNN call.
  EXPECT_EQ(count(c.wrapper, "state.cuda.conv<float>("), 4u) << c.wrapper;
  const std::vector<std::string> w = lines(c.wrapper);
  const size_t fork = line_with(w, "const bool fork0 = state.cuda.fork(");
  const size_t join = line_with(w, "state.cuda.join(fork0)");
  ASSERT_NE(fork, std::string::npos);
  ASSERT_NE(join, std::string::npos);
  ASSERT_LT(fork, join);
  // Between fork and join: every convolution on the side stream is bracketed, and at least one
  // runs on each stream (the overlap).
  size_t side_convs = 0, main_convs = 0;
  bool on_side = false;
  for (size_t i = fork; i < join; ++i) {
    if (w[i].find("state.cuda.side(fork0, true)") != std::string::npos) on_side = true;
    if (w[i].find("state.cuda.side(fork0, false)") != std::string::npos) on_side = false;
    if (w[i].find("state.cuda.conv<float>(") != std::string::npos)
      ++(on_side ? side_convs : main_convs);
  }
  EXPECT_FALSE(on_side);
  // The shortcut alone on the side stream (the shortest chain), the main branch's first two
  // convolutions beside it.
  EXPECT_EQ(side_convs, 1u) << c.wrapper;
  EXPECT_EQ(main_convs, 2u) << c.wrapper;
  // The join's call is the last convolution: it adds the residual (the chain's result).
  const size_t last = line_with(w, "state.cuda.conv<float>(", join);
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(line_with(w, "state.cuda.conv<float>(", last + 1), std::string::npos);
  EXPECT_EQ(w[last].find(", nullptr, kiln_cuda::ConvActivation"), std::string::npos) << w[last];
  // --print-kernels reads the fork's comment.
  EXPECT_NE(c.wrapper.find("// fork 0: "), std::string::npos);
  std::printf("%s", streams.c_str());
}

// A plain chain of convolutions (each reads the one before) has no fork.
TEST(CudaStreams, APlainChainGetsNoSideStream) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  std::mt19937 rng(20);
  test_models::ModelBuilder b;
  graph::Value* v = b.input("x", DType::kFloat32, {1, 8, 8, 8});
  for (int k = 0; k < 3; ++k) {
    v = b.op("Relu", {b.op("Conv", {v, b.constant(random_tensor({8, 8, 3, 3}, rng, 0.2f))},
                           {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})});
  }
  b.output(v);
  TempDir dir;
  Compiled c = compile_cuda_dumped(b.model, dir.path, ir::Precision::kFp32);
  EXPECT_EQ(count(c.wrapper, "state.cuda.fork("), 0u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "state.cuda.side("), 0u) << c.wrapper;
  EXPECT_NE(c.wrapper.find("state.cuda.reserve_library_workspace();"), std::string::npos);
  EXPECT_EQ(files::read(dir.path / "dump" / "4_streams.txt"), "");
}

// No fork's window holds a host fallback: its wait would end a graph segment with the side
// stream unjoined. Here x -> MatMul -> Relu = h feeds a product on one branch and TopK on the
// other (indices on the host, then a kernel gathering the values on the GPU, then a product);
// the two meet in an Add. The side chain that would fork right after h (the lone product) is
// refused, since the TopK lies in its window; the one that forks after the TopK (the gather
// kernel, beside the lone product) is taken. With a Sigmoid in TopK's place, nothing waits: the
// fork comes right after h.
TEST(CudaStreams, NoForkWindowHoldsAHostFallback) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  for (const bool host_fallback : {true, false}) {
    std::mt19937 rng(24);
    test_models::ModelBuilder b;
    graph::Value* x = b.input("x", DType::kFloat32, {8, 32});
    graph::Value* h = b.op("Relu", {b.op("MatMul", {x, b.constant(random_tensor({32, 64}, rng))})});
    graph::Value* main = h;
    if (host_fallback) {
      graph::Value* values = b.model.graph->add_value("topk_values", graph::Type());
      graph::Value* indices = b.model.graph->add_value("topk_indices", graph::Type());
      b.model.graph->add_node("topk", "TopK", "", 13, {h, b.ints({64}, {1})}, {values, indices},
                              {{"axis", int64_t{-1}}});
      main = values;
    } else {
      main = b.op("Sigmoid", {h});
    }
    main = b.op("MatMul", {main, b.constant(random_tensor({64, 16}, rng))});
    graph::Value* side = b.op("MatMul", {h, b.constant(random_tensor({64, 16}, rng))});
    b.output(b.op("Add", {main, side}));
    TempDir dir;
    Compiled c = compile_cuda_dumped(b.model, dir.path, ir::Precision::kFp32);
    const std::string streams = files::read(dir.path / "dump" / "4_streams.txt");
    const std::vector<std::string> w = lines(c.wrapper);
    const size_t host = line_with(w, "// on the host: TopK");
    EXPECT_EQ(host != std::string::npos, host_fallback);
    ASSERT_EQ(count(c.wrapper, "state.cuda.fork("), 1u) << streams;
    const size_t fork = line_with(w, "const bool fork0 = state.cuda.fork(");
    const size_t join = line_with(w, "state.cuda.join(fork0)");
    ASSERT_LT(fork, join);
    for (size_t i = fork; i < join; ++i) EXPECT_EQ(w[i].find("// on the host"), std::string::npos);
    if (host_fallback) {
      EXPECT_LT(host, fork) << streams;
      EXPECT_NE(streams.find("side stream [#2 cuda_fused_top_k"), std::string::npos) << streams;
    } else {
      // Nothing waits: the fork comes right after h (one branch's first call on the side).
      EXPECT_NE(streams.find("(before #1): side stream [#"), std::string::npos) << streams;
    }
  }
}

/// An arena slot of 4_arena.txt: bytes [offset, offset + bytes), live over items first..last.
struct Slot {
  std::string storage;
  int64_t offset = 0, bytes = 0;
  size_t first = 0, last = 0;
};

std::vector<Slot> arena_slots(const std::string& text) {
  std::vector<Slot> slots;
  const std::regex re(R"(^  (\S+) offset=(\d+) bytes=(\d+) items (\d+)\.\.(\d+)$)");
  for (const std::string& line : lines(text)) {
    std::smatch m;
    if (!std::regex_match(line, m, re)) continue;
    slots.push_back({m[1], std::stoll(m[2]), std::stoll(m[3]), std::stoul(m[4]), std::stoul(m[5])});
  }
  return slots;
}

// The memory plan around a fork: no buffer is freed between the fork and the join (each last
// use there waits for the join's call), so no storage is handed to another buffer while either
// stream may still use it; in the arena, two slots that share bytes never have the earlier one
// end inside the window. The model has a longer main branch, so that the window frees and
// allocates buffers of one size on the main stream while the side stream runs.
TEST(CudaStreams, NoStorageUsedInAWindowIsReusedBeforeTheJoin) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  std::mt19937 rng(21);
  test_models::ModelBuilder b;
  graph::Value* x = b.input("x", DType::kFloat32, {1, 8, 8, 8});
  graph::Value* main = x;
  for (int k = 0; k < 4; ++k) {
    main = b.op("Relu", {b.op("Conv", {main, b.constant(random_tensor({8, 8, 3, 3}, rng, 0.2f))},
                              {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})});
  }
  graph::Value* shortcut = b.op("Conv", {x, b.constant(random_tensor({8, 8, 1, 1}, rng, 0.2f))});
  b.output(b.op("Add", {main, shortcut}));
  TempDir dir;
  Compiled c = compile_cuda_dumped(b.model, dir.path, ir::Precision::kFp32);
  const std::string streams = files::read(dir.path / "dump" / "4_streams.txt");
  ASSERT_EQ(count(streams, "fork "), 1u) << streams;
  // The window [fork, join) by item number (4_streams.txt); the memory plan's calls, in item
  // order.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(streams, m, std::regex(R"(\(before #(\d+)\))"))) << streams;
  const size_t fork_item = std::stoul(m[1].str());
  ASSERT_TRUE(std::regex_search(streams, m, std::regex(R"(join before #(\d+) )"))) << streams;
  const size_t join_item = std::stoul(m[1].str());
  const std::string plan = files::read(dir.path / "dump" / "4_memory_plan.txt");
  std::vector<std::string> plan_lines = lines(plan);
  std::vector<size_t> calls;  // line of each call, in item order
  for (size_t i = 0; i < plan_lines.size(); ++i) {
    if (plan_lines[i].rfind("call ", 0) == 0) calls.push_back(i);
  }
  ASSERT_LT(join_item, calls.size()) << plan;
  ASSERT_LT(fork_item, join_item) << plan;
  EXPECT_GE(join_item - fork_item, 3u) << "the window holds the side call and 2+ main calls";
  for (size_t line = calls[fork_item]; line < calls[join_item]; ++line)
    EXPECT_NE(plan_lines[line].rfind("free ", 0), 0u) << "freed inside the window: " << plan;
  const std::vector<Slot> slots = arena_slots(files::read(dir.path / "dump" / "4_arena.txt"));
  ASSERT_GE(slots.size(), 3u);
  for (const Slot& a : slots) {
    for (const Slot& o : slots) {
      const bool share = a.offset < o.offset + o.bytes && o.offset < a.offset + a.bytes;
      if (&a == &o || !share) continue;
      EXPECT_TRUE(a.last < o.first || o.last < a.first) << a.storage << " and " << o.storage;
      if (a.last < o.first) {
        EXPECT_TRUE(a.last < fork_item || a.last >= join_item)
            << a.storage << " ends inside the window and " << o.storage << " takes its bytes";
      }
    }
  }
  (void)c;
}

// With a GPU: the bottleneck run 5 times with graphs on and off and with the side stream on and
// off (KILN_CUDA_STREAMS=1), each run within 1e-4 (relative to the largest output; fp32 without
// tensor cores) of the reference in double; with graphs, one segment captured by the second run
// (the first makes the libraries' plans directly) and launched again by each later run, without
// a new capture.
TEST(CudaStreams, BottleneckRunsMatchADoubleReferenceWithGraphsAndStreamsOnAndOff) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  std::mt19937 rng(22);
  std::vector<std::vector<double>> weights;
  const graph::Model model = bottleneck(rng, weights);
  graph::Tensor x = random_tensor({1, 16, 8, 8}, rng);
  const std::vector<double> want = bottleneck_ref(doubles(x), weights);
  for (const char* graphs : {"1", "0"}) {
    for (const char* streams : {"2", "1"}) {
      Env g("KILN_CUDA_GRAPHS", graphs), s("KILN_CUDA_STREAMS", streams);
      TempDir dir;
      Compiled c = compile_cuda_dumped(model, dir.path, ir::Precision::kFp32);
      std::pair<int64_t, int64_t> after_second;
      for (int run = 0; run < 5; ++run) {
        std::vector<graph::Tensor> y = c.model.run({x});
        ASSERT_EQ(y.size(), 1u);
        const double err = max_relative_error(y[0], want);
        EXPECT_LT(err, 1e-4) << "graphs " << graphs << ", streams " << streams << ", run " << run;
        if (run == 1) after_second = c.model.cuda_graph_segments();
      }
      const auto [captured, launched] = c.model.cuda_graph_segments();
      std::printf(
          "bottleneck: KILN_CUDA_GRAPHS=%s KILN_CUDA_STREAMS=%s: %lld segments captured, "
          "%lld launched\n",
          graphs, streams, static_cast<long long>(captured), static_cast<long long>(launched));
      const bool on = graphs[0] == '1';
      EXPECT_EQ(after_second.first, on ? 1 : 0);
      EXPECT_EQ(after_second.second, on ? 1 : 0);
      EXPECT_EQ(captured, on ? 1 : 0);
      EXPECT_EQ(launched, on ? 4 : 0);  // the capture's launch, then runs 3 to 5 replay
    }
  }
}

/// x [8, 32] -> MatMul [32, 64] -> Relu -> TopK(k = 8, last axis, on the host) -> MatMul [8, 16]:
/// device work on both sides of a host fallback.
graph::Model topk_between_products(std::mt19937& rng, std::vector<double>& w1,
                                   std::vector<double>& w2) {
  test_models::ModelBuilder b;
  graph::Value* x = b.input("x", DType::kFloat32, {8, 32});
  graph::Tensor t1 = random_tensor({32, 64}, rng, 0.3f), t2 = random_tensor({8, 16}, rng, 0.3f);
  w1 = doubles(t1);
  w2 = doubles(t2);
  graph::Value* h = b.op("Relu", {b.op("MatMul", {x, b.constant(std::move(t1))})});
  graph::Value* values = b.model.graph->add_value("topk_values", graph::Type());
  graph::Value* indices = b.model.graph->add_value("topk_indices", graph::Type());
  b.model.graph->add_node("topk", "TopK", "", 13, {h, b.ints({8}, {1})}, {values, indices},
                          {{"axis", int64_t{-1}}});
  b.output(b.op("MatMul", {values, b.constant(std::move(t2))}));
  return std::move(b.model);
}

// With a GPU: the host fallback splits each run into two graph segments, both captured by the
// second run and launched again by every later run, all runs within 1e-4 of the
// reference in double (fp32 products; TopK picks the same elements: the test's values have no
// near ties).
TEST(CudaGraphSegments, AHostFallbackInTheMiddleGetsGraphsOnBothSides) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  std::mt19937 rng(23);
  std::vector<double> w1, w2;
  const graph::Model model = topk_between_products(rng, w1, w2);
  {
    TempDir dir;
    Compiled c = compile_cuda_dumped(model, dir.path, ir::Precision::kFp32);
    EXPECT_NE(c.wrapper.find("// on the host: TopK"), std::string::npos) << c.wrapper;
    EXPECT_NE(c.wrapper.find("static constexpr bool kCudaGraphs = true;"), std::string::npos);
  }
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the wrapper compiled)";
  graph::Tensor x = random_tensor({8, 32}, rng);
  const std::vector<double> xv = doubles(x);
  std::vector<double> want(8 * 16, 0.0);
  for (int i = 0; i < 8; ++i) {
    std::vector<double> h(64, 0.0);
    for (int j = 0; j < 64; ++j) {
      for (int k = 0; k < 32; ++k) h[j] += xv[i * 32 + k] * w1[k * 64 + j];
      h[j] = std::max(h[j], 0.0);
    }
    std::sort(h.begin(), h.end(), std::greater<>());
    for (int j = 0; j < 16; ++j) {
      for (int k = 0; k < 8; ++k) want[i * 16 + j] += h[k] * w2[k * 16 + j];
    }
  }
  for (const char* graphs : {"1", "0"}) {
    Env g("KILN_CUDA_GRAPHS", graphs);
    TempDir dir;
    Compiled c = compile_cuda_dumped(model, dir.path, ir::Precision::kFp32);
    std::pair<int64_t, int64_t> after_second;
    for (int run = 0; run < 5; ++run) {
      std::vector<graph::Tensor> y = c.model.run({x});
      ASSERT_EQ(y.size(), 1u);
      EXPECT_LT(max_relative_error(y[0], want), 1e-4) << "graphs " << graphs << ", run " << run;
      if (run == 1) after_second = c.model.cuda_graph_segments();
    }
    const auto [captured, launched] = c.model.cuda_graph_segments();
    std::printf(
        "TopK between products: KILN_CUDA_GRAPHS=%s: %lld segments captured, %lld "
        "launched\n",
        graphs, static_cast<long long>(captured), static_cast<long long>(launched));
    const bool on = graphs[0] == '1';
    EXPECT_EQ(after_second.first, on ? 2 : 0);
    EXPECT_EQ(after_second.second, on ? 2 : 0);
    EXPECT_EQ(captured, on ? 2 : 0);
    EXPECT_EQ(launched, on ? 8 : 0);  // the capture's two launches, then runs 3 to 5 replay both
  }
}

}  // namespace
}  // namespace kiln::driver
