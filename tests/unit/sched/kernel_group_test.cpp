#include "sched/kernel_group.h"

#include <gtest/gtest.h>

#include <string>

#include "test_programs.h"

namespace kiln::sched {
namespace {

using graph::DType;
using sym::Expr;
using testing::ProgramBuilder;

TEST(KernelGroup, MergeRules) {
  sym::Analyzer facts;
  Expr n = Expr::symbol("s0");
  KernelGroup red = make_group({n}, {16});
  std::string reason;
  EXPECT_TRUE(merge_groups(make_group({n, 16}, {}), red, facts, &reason).has_value());
  EXPECT_TRUE(merge_groups(make_group({n * 16}, {}), red, facts, &reason).has_value());
  EXPECT_TRUE(merge_groups(make_group({n}, {}), red, facts, &reason).has_value());
  EXPECT_FALSE(merge_groups(make_group({n, 8}, {}), red, facts, &reason).has_value());
  EXPECT_NE(reason.find("fits neither"), std::string::npos) << reason;
  EXPECT_FALSE(merge_groups(make_group({n}, {8}), red, facts, &reason).has_value());
  EXPECT_EQ(merge_groups(make_group({n * 16}, {}), red, facts, &reason)->str(), "[s0] x [16]");
}

TEST(KernelGroup, MapsMembersDirectlyOrByFlattening) {
  ProgramBuilder p;
  Expr n = Expr::symbol("s0");
  p.input("x", DType::kFloat32, {n, 16});
  ir::Buffer& direct = p.computed("d", DType::kFloat32, {n, 16});
  ir::Buffer& flat = p.computed("f", DType::kFloat32, {n * 16});
  ir::Buffer& outer = p.computed("o", DType::kFloat32, {n, 1});
  KernelGroup g = make_group({n}, {16});
  sym::Analyzer ga = g.analyzer(p.program.analyzer);

  auto md = map_member(direct, g, p.program.analyzer);
  ASSERT_TRUE(md.has_value());
  EXPECT_EQ(md->kind, MemberKind::kPointwiseInner);
  EXPECT_EQ(to_group_index(testing::var(direct, 0) * 16 + testing::var(direct, 1), *md, ga),
            g.vars[0] * 16 + g.reduce_vars[0]);

  auto mf = map_member(flat, g, p.program.analyzer);
  ASSERT_TRUE(mf.has_value());
  EXPECT_EQ(mf->kind, MemberKind::kPointwiseInner);
  EXPECT_EQ(to_group_index(testing::var(flat, 0), *mf, ga), g.vars[0] * 16 + g.reduce_vars[0]);

  auto mo = map_member(outer, g, p.program.analyzer);
  ASSERT_TRUE(mo.has_value());
  EXPECT_EQ(mo->kind, MemberKind::kPointwiseOuter);
  EXPECT_EQ(to_group_index(testing::var(outer, 0) + testing::var(outer, 1), *mo, ga), g.vars[0]);
}

}  // namespace
}  // namespace kiln::sched
