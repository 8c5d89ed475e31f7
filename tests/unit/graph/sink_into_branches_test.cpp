// sink_into_branches: which nodes move into an If's branches (by the longest path, up to the
// depth), what the merged If returns, and that the result is a verified, topologically ordered
// copy even when a moved node reads a value made after the If.
#include "graph/sink_into_branches.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "support/error.h"

namespace kiln::graph {
namespace {

Type f32() { return Type::tensor(DType::kFloat32, Shape{sym::Expr(2)}); }

/// A branch returning `op`(x) for the outer value x.
std::shared_ptr<Graph> branch(Graph& parent, const std::string& name, const std::string& op,
                              Value* x) {
  auto g = std::make_shared<Graph>(name, &parent);
  Value* out = g->add_value(name + "_out", Type());
  g->add_node(name + "_node", op, "", 13, {x}, {out}, {});
  g->add_output(out);
  return g;
}

std::vector<std::string> op_types(const Graph& g) {
  std::vector<std::string> ops;
  for (const auto& node : g.nodes()) ops.push_back(node->op_type());
  return ops;
}

std::vector<std::string> names(const std::vector<Value*>& values) {
  std::vector<std::string> out;
  for (const Value* v : values) out.push_back(v->name());
  return out;
}

/// main: v = If(c) {Relu(x)} {Neg(x)}; z = Abs(x) (after the If); w = Add(v, z); u = Sqrt(w);
/// outputs u and z.
struct Model {
  Graph g{"main"};
  Node* if_node = nullptr;

  Model() {
    Value* c = g.add_value("c", Type::tensor(DType::kBool, Shape{}));
    Value* x = g.add_value("x", f32());
    g.add_input(c);
    g.add_input(x);
    Value* v = g.add_value("v", Type());
    if_node = g.add_node("choose", "If", "", 13, {c}, {v},
                         {{"then_branch", branch(g, "then", "Relu", x)},
                          {"else_branch", branch(g, "else", "Neg", x)}});
    Value* z = g.add_value("z", f32());
    g.add_node("abs", "Abs", "", 13, {x}, {z}, {});
    Value* w = g.add_value("w", f32());
    g.add_node("add", "Add", "", 13, {v, z}, {w}, {});
    Value* u = g.add_value("u", f32());
    g.add_node("sqrt", "Sqrt", "", 13, {w}, {u}, {});
    g.add_output(u);
    g.add_output(z);
  }
};

TEST(SinkIntoBranches, OneStepMovesTheDirectReaderAfterWhatItReads) {
  Model m;
  SunkGraph sunk = sink_into_branches(m.g, *m.if_node, 1);
  const Graph& g = *sunk.graph;
  EXPECT_NO_THROW(verify(g, "model.onnx"));
  // Add moved into the If, which now stands after Abs (Add reads z).
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Abs", "If", "Sqrt"}));
  ASSERT_EQ(sunk.merged, g.nodes()[1].get());
  EXPECT_EQ(names(sunk.merged->outputs()), (std::vector<std::string>{"w"}));
  for (const char* name : {"then_branch", "else_branch"}) {
    std::shared_ptr<Graph> b = sunk.merged->attr_graph(name);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(op_types(*b)[1], "Add");
    ASSERT_EQ(b->outputs().size(), 1u);
    EXPECT_EQ(b->outputs()[0]->producer()->op_type(), "Add");
    // The moved Add reads the branch's own result and the outer z of the copy.
    const Node& add = *b->nodes()[1];
    EXPECT_EQ(add.input(0), b->nodes()[0]->output(0));
    EXPECT_EQ(add.input(1), g.find_value("z"));
    EXPECT_EQ(add.output(0)->type().dtype, DType::kUndefined);  // declared for one branch
  }
  EXPECT_EQ(names(g.outputs()), (std::vector<std::string>{"u", "z"}));
  EXPECT_EQ(sunk.copied_from.at(sunk.merged), m.if_node);
  // The input graph is untouched.
  EXPECT_EQ(op_types(m.g), (std::vector<std::string>{"If", "Abs", "Add", "Sqrt"}));
}

TEST(SinkIntoBranches, TwoStepsReachTheGraphOutput) {
  Model m;
  SunkGraph sunk = sink_into_branches(m.g, *m.if_node, 2);
  const Graph& g = *sunk.graph;
  EXPECT_NO_THROW(verify(g, "model.onnx"));
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Abs", "If"}));
  EXPECT_EQ(names(sunk.merged->outputs()), (std::vector<std::string>{"u"}));
  EXPECT_EQ(g.outputs()[0], sunk.merged->output(0));
  EXPECT_EQ(op_types(*sunk.merged->attr_graph("else_branch")),
            (std::vector<std::string>{"Neg", "Add", "Sqrt"}));
}

TEST(SinkIntoBranches, RejectsANodeThatIsNotAnIf) {
  Model m;
  EXPECT_THROW(sink_into_branches(m.g, *m.g.nodes()[1], 1), InternalError);
}

}  // namespace
}  // namespace kiln::graph
