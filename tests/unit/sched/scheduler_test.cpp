#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "sched/dependencies.h"
#include "test_programs.h"

namespace kiln::sched {
namespace {

using graph::DType;
using ir::OpCode;
using sym::Expr;
using testing::ProgramBuilder;
using testing::rvar;
using testing::var;

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::vector<std::string> names(const ScheduleItem& item) {
  std::vector<std::string> out;
  for (const ir::Buffer* b : item.buffers) out.push_back(b->name);
  return out;
}

bool has_refusal(const Schedule& s, const std::string& reason_part) {
  return std::any_of(s.decisions.begin(), s.decisions.end(), [&](const FusionDecision& d) {
    return !d.fused && d.reason.find(reason_part) != std::string::npos;
  });
}

TEST(Dependencies, MemoryAndStarDeps) {
  ProgramBuilder p;
  p.input("x", DType::kFloat32, {8, 16});
  p.input("idx", DType::kInt64, {8});
  ir::Buffer& g = p.computed("g", DType::kFloat32, {8, 16});
  auto t = g.body.indirect(g.body.load("idx", DType::kInt64, var(g, 0)), 8);
  auto sym_t = g.body.op(t).symbol;
  auto v = g.body.load("x", DType::kFloat32, sym_t * 16 + var(g, 1));
  p.store(g, v);
  ReadWrites rw = extract_read_writes(g);
  ASSERT_EQ(rw.reads.size(), 2u);
  EXPECT_EQ(rw.reads[0].buffer, "idx");
  EXPECT_EQ(rw.reads[0].kind, DepKind::kMemory);
  EXPECT_EQ(rw.reads[0].index, var(g, 0));
  EXPECT_EQ(rw.reads[0].sizes, (std::vector<Expr>{8, 16}));
  EXPECT_EQ(rw.reads[1].buffer, "x");
  EXPECT_EQ(rw.reads[1].kind, DepKind::kStar);
  ASSERT_EQ(rw.writes.size(), 1u);
  EXPECT_EQ(rw.writes[0].index, var(g, 0) * 16 + var(g, 1));

  ir::Buffer& e = p.extern_call("e", DType::kFloat32, {8, 16}, {"x", "g"});
  ReadWrites erw = extract_read_writes(e);
  ASSERT_EQ(erw.reads.size(), 2u);
  EXPECT_EQ(erw.reads[0].kind, DepKind::kStar);
  EXPECT_EQ(erw.read_names(), (std::vector<std::string>{"g", "x"}));
}

TEST(Scheduler, DeadNodeElimination) {
  ir::Program prog = testing::add_relu_mul_program(8, 16);
  ProgramBuilder p;
  p.program = std::move(prog);
  ir::Buffer& dead = p.computed("dead", DType::kFloat32, {8, 16}, {}, "Exp");
  p.store(dead, dead.body.unary(OpCode::kExp,
                                dead.body.load("x", DType::kFloat32, p.at("x", dead.body.vars()))));
  Schedule s = schedule(p.program, GenericBackend(), SchedulerOptions{.fuse = false});
  ASSERT_EQ(s.items.size(), 3u);
  for (const ScheduleItem& item : s.items) EXPECT_NE(item.buffers[0]->name, "dead");
  EXPECT_EQ(s.before_fusion_text.find("dead"), std::string::npos);
}

TEST(Scheduler, TopologicalOrderIsDeterministic) {
  ProgramBuilder p;
  p.input("x", DType::kFloat32, {4});
  // Listed out of dependency order: c reads b, which comes later in the program.
  ir::Buffer& b = p.computed("b", DType::kFloat32, {4});
  p.store(b, b.body.unary(OpCode::kExp, b.body.load("x", DType::kFloat32, var(b, 0))));
  ir::Buffer& c = p.computed("c", DType::kFloat32, {4});
  p.store(c, c.body.unary(OpCode::kNeg, c.body.load("b", DType::kFloat32, 3 - var(c, 0))));
  p.output("c");
  Schedule s = schedule(p.program, GenericBackend(), SchedulerOptions{.fuse = false});
  ASSERT_EQ(s.items.size(), 2u);
  EXPECT_EQ(s.items[0].buffers[0]->name, "b");
  EXPECT_EQ(s.items[1].buffers[0]->name, "c");
}

TEST(Scheduler, PointwiseChainFusesIntoOneKernel) {
  ir::Program prog = testing::add_relu_mul_program(Expr::symbol("s0"), 16);
  Schedule s = schedule(prog, GenericBackend());
  ASSERT_EQ(s.items.size(), 1u);
  const ScheduleItem& k = s.items[0];
  EXPECT_EQ(names(k), (std::vector<std::string>{"a", "r", "m"}));
  EXPECT_EQ(k.name, "kernel_fused_add_relu_mul_0");
  EXPECT_TRUE(has(k.kernel_local, "a"));
  EXPECT_TRUE(has(k.kernel_local, "r"));
  EXPECT_FALSE(has(k.kernel_local, "m"));  // a graph output
  EXPECT_TRUE(k.inplace.empty());
  EXPECT_TRUE(k.last_use.empty());  // only graph inputs and kernel-local buffers die here
  EXPECT_EQ(k.onnx_nodes.size(), 3u);
}

TEST(Scheduler, OutputsAreNeverKernelLocal) {
  ir::Program prog = testing::add_relu_mul_program(8, 16);
  prog.outputs.push_back(ir::OutputSpec{"r", "r", DType::kFloat32, {8, 16}});
  Schedule s = schedule(prog, GenericBackend());
  ASSERT_EQ(s.items.size(), 1u);
  EXPECT_TRUE(has(s.items[0].kernel_local, "a"));
  EXPECT_FALSE(has(s.items[0].kernel_local, "r"));
}

TEST(Scheduler, SoftmaxIsOneKernel) {
  ir::Program prog = testing::softmax_program(Expr::symbol("s0"), Expr::symbol("s1"));
  Schedule s = schedule(prog, GenericBackend());
  ASSERT_EQ(s.items.size(), 1u) << s.after_fusion_text << s.decisions_text();
  const ScheduleItem& k = s.items[0];
  EXPECT_EQ(names(k), (std::vector<std::string>{"mx", "e", "s", "out"}));
  ASSERT_EQ(k.members.size(), 4u);
  EXPECT_EQ(k.members[0].kind, MemberKind::kReduction);
  EXPECT_EQ(k.members[1].kind, MemberKind::kPointwiseInner);
  EXPECT_EQ(k.members[2].kind, MemberKind::kReduction);
  EXPECT_EQ(k.members[3].kind, MemberKind::kPointwiseInner);
  EXPECT_EQ(k.group.str(), "[s0] x [s1]");
  EXPECT_EQ(k.kernel_local, (std::vector<std::string>{"mx", "e", "s"}));
}

TEST(Scheduler, LayerNormGeluIsOneKernel) {
  ir::Program prog = testing::layernorm_gelu_program(Expr::symbol("s0"), 32);
  Schedule s = schedule(prog, GenericBackend());
  ASSERT_EQ(s.items.size(), 1u) << s.after_fusion_text << s.decisions_text();
  EXPECT_EQ(names(s.items[0]), (std::vector<std::string>{"mean", "var", "y", "g"}));
  EXPECT_EQ(s.items[0].name, "kernel_fused_layer_normalization_gelu_0");
}

TEST(Scheduler, FlattenedPointwiseJoinsReduction) {
  // The pointwise consumer iterates [rows * cols] flat, the reduction [rows] x [cols].
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {6, 10});
  ir::Buffer& mx = p.computed("mx", f, {6}, {10});
  p.store(mx, mx.body.reduction(ir::ReductionType::kMax,
                                mx.body.load("x", f, p.at("x", {var(mx, 0), rvar(mx, 0)})), f));
  ir::Buffer& d = p.computed("d", f, {60});
  auto i = var(d, 0);
  p.store(d, d.body.binary(OpCode::kSub, d.body.load("x", f, i),
                           d.body.load("mx", f, sym::floor_div(i, 10))));
  p.output("d");
  Schedule s = schedule(p.program, GenericBackend());
  ASSERT_EQ(s.items.size(), 1u) << s.decisions_text();
  EXPECT_EQ(s.items[0].members[1].kind, MemberKind::kPointwiseInner);
}

TEST(Scheduler, RefusesSizeMismatch) {
  ProgramBuilder p;
  p.input("x", DType::kFloat32, {8});
  ir::Buffer& a = p.computed("a", DType::kFloat32, {8});
  p.store(a, a.body.unary(OpCode::kExp, a.body.load("x", DType::kFloat32, var(a, 0))));
  ir::Buffer& b = p.computed("b", DType::kFloat32, {4});
  p.store(b, b.body.unary(OpCode::kNeg, b.body.load("x", DType::kFloat32, var(b, 0))));
  p.output("a");
  p.output("b");
  Schedule s = schedule(p.program, GenericBackend());
  EXPECT_EQ(s.items.size(), 2u);
  EXPECT_TRUE(has_refusal(s, "size mismatch")) << s.decisions_text();
}

TEST(Scheduler, RefusesMismatchedIndexAndIntermediateNodes) {
  ProgramBuilder p;
  p.input("x", DType::kFloat32, {8});
  ir::Buffer& a = p.computed("a", DType::kFloat32, {8});
  p.store(a, a.body.unary(OpCode::kExp, a.body.load("x", DType::kFloat32, var(a, 0))));
  ir::Buffer& c = p.computed("c", DType::kFloat32, {8});  // reads a reversed
  p.store(c, c.body.unary(OpCode::kNeg, c.body.load("a", DType::kFloat32, 7 - var(c, 0))));
  ir::Buffer& d = p.computed("d", DType::kFloat32, {8});
  p.store(d, d.body.binary(OpCode::kAdd, d.body.load("a", DType::kFloat32, var(d, 0)),
                           d.body.load("c", DType::kFloat32, var(d, 0))));
  p.output("d");
  Schedule s = schedule(p.program, GenericBackend());
  EXPECT_EQ(s.items.size(), 2u);
  EXPECT_TRUE(has_refusal(s, "memory deps did not match")) << s.decisions_text();
  EXPECT_TRUE(has_refusal(s, "intermediate nodes")) << s.decisions_text();
}

TEST(Scheduler, RefusesCycle) {
  // B reads A reversed, D reads C reversed; B and C share y, A and D share x. Fusing {B, C}
  // first makes {A, D} a cycle through it.
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {8});
  p.input("y", f, {8});
  ir::Buffer& a = p.computed("A", f, {8});
  p.store(a, a.body.unary(OpCode::kExp, a.body.load("x", f, var(a, 0))));
  ir::Buffer& b = p.computed("B", f, {8});
  p.store(b, b.body.binary(OpCode::kAdd, b.body.load("A", f, 7 - var(b, 0)),
                           b.body.load("y", f, var(b, 0))));
  ir::Buffer& c = p.computed("C", f, {8});
  p.store(c, c.body.unary(OpCode::kNeg, c.body.load("y", f, var(c, 0))));
  ir::Buffer& d = p.computed("D", f, {8});
  p.store(d, d.body.binary(OpCode::kAdd, d.body.load("C", f, 7 - var(d, 0)),
                           d.body.load("x", f, var(d, 0))));
  p.output("B");
  p.output("D");
  Schedule s = schedule(p.program, GenericBackend());
  EXPECT_TRUE(has_refusal(s, "would create a cycle")) << s.decisions_text();
  EXPECT_EQ(s.items.size(), 3u) << s.decisions_text();
}

TEST(Scheduler, RefusesDistantHorizontalFusion) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {8});
  p.input("z", f, {16});
  ir::Buffer& a = p.computed("a", f, {8});
  p.store(a, a.body.unary(OpCode::kExp, a.body.load("x", f, var(a, 0))));
  p.output("a");
  std::string prev = "z";
  for (int k = 0; k < 70; ++k) {  // a chain in between, reversing each time so nothing fuses
    ir::Buffer& c = p.computed(fmt::format("c{}", k), f, {16});
    p.store(c, c.body.unary(OpCode::kNeg, c.body.load(prev, f, 15 - var(c, 0))));
    prev = c.name;
  }
  p.output(prev);
  ir::Buffer& b = p.computed("b", f, {8});
  p.store(b, b.body.unary(OpCode::kNeg, b.body.load("x", f, var(b, 0))));
  p.output("b");
  Schedule s = schedule(p.program, GenericBackend());
  EXPECT_TRUE(has_refusal(s, "will increase peak memory")) << s.decisions_text();
  EXPECT_EQ(s.items.size(), 72u);
}

TEST(Scheduler, InPlaceReuseOfDyingInput) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {8, 4});
  p.extern_call("e", f, {8, 4}, {"x"});
  ir::Buffer& k = p.computed("k", f, {8, 4}, {}, "Relu");
  p.store(k, k.body.unary(OpCode::kRelu, k.body.load("e", f, p.at("e", k.body.vars()))));
  p.extern_call("out", f, {8, 4}, {"k"});
  p.output("out");
  Schedule s = schedule(p.program, GenericBackend());
  ASSERT_EQ(s.items.size(), 3u);
  EXPECT_EQ(s.items[0].kind, ItemKind::kExtern);
  EXPECT_EQ(s.items[0].name, "det");  // named after its library call
  const ScheduleItem& item = s.items[1];
  ASSERT_EQ(item.inplace.size(), 1u);
  EXPECT_EQ(item.inplace[0], std::make_pair(std::string("k"), std::string("e")));
  EXPECT_FALSE(has(item.last_use, "e"));  // its memory lives on as k
  EXPECT_TRUE(has(s.items[2].last_use, "k"));
}

TEST(Scheduler, NoInPlaceForOutputsOrMismatchedIndex) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {8});
  p.extern_call("e", f, {8}, {"x"});
  ir::Buffer& k = p.computed("k", f, {8});
  p.store(k, k.body.unary(OpCode::kRelu, k.body.load("e", f, var(k, 0))));
  p.output("k");  // an output is never written into another buffer's memory
  p.extern_call("e2", f, {8}, {"x"});
  ir::Buffer& k2 = p.computed("k2", f, {8});
  p.store(k2, k2.body.unary(OpCode::kRelu, k2.body.load("e2", f, 7 - var(k2, 0))));
  p.extern_call("out", f, {8}, {"k2"});
  p.output("out");
  p.output("e2");  // and an output's memory is never reused
  Schedule s = schedule(p.program, GenericBackend());
  for (const ScheduleItem& item : s.items) EXPECT_TRUE(item.inplace.empty()) << item.name;
}

TEST(Scheduler, ExternsNeverFuse) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {8});
  p.extern_call("e", f, {8}, {"x"});
  ir::Buffer& k = p.computed("k", f, {8});
  p.store(k, k.body.unary(OpCode::kRelu, k.body.load("e", f, var(k, 0))));
  p.output("k");
  Schedule s = schedule(p.program, GenericBackend());
  EXPECT_EQ(s.items.size(), 2u);
  EXPECT_TRUE(has_refusal(s, "extern")) << s.decisions_text();
}

}  // namespace
}  // namespace kiln::sched
