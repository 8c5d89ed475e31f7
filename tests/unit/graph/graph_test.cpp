// Graph construction, attribute access, verify() errors and dump() text.
#include "graph/graph.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/error.h"

namespace kiln::graph {
namespace {

Type f32(std::vector<sym::Expr> dims) { return Type::tensor(DType::kFloat32, std::move(dims)); }

/// The message of the UserError that verify() throws, or "" when it passes.
std::string verify_error(const Graph& graph) {
  try {
    verify(graph, "model.onnx");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(GraphTest, TypeStrings) {
  sym::Expr batch = sym::Expr::symbol("batch");
  EXPECT_EQ(f32({batch, 3}).str(), "float32[batch, 3]");
  EXPECT_EQ(Type::tensor(DType::kInt64, Shape{}).str(), "int64[]");
  EXPECT_EQ(Type::tensor(DType::kFloat32, std::nullopt).str(), "float32[?]");
  EXPECT_EQ(Type().str(), "?[?]");
  Type seq;
  seq.kind = ValueKind::kSequence;
  seq.element = std::make_shared<const Type>(Type::tensor(DType::kFloat32, std::nullopt));
  EXPECT_EQ(seq.str(), "seq(float32[?])");
  Type opt;
  opt.kind = ValueKind::kOptional;
  opt.element = std::make_shared<const Type>(Type::tensor(DType::kInt64, Shape{}));
  EXPECT_EQ(opt.str(), "optional(int64[])");
  EXPECT_EQ(shape_str({}), "[]");
}

TEST(GraphTest, AddNodeWiresProducersAndUsers) {
  Graph g("main");
  Value* x = g.add_value("x", f32({2}));
  Value* y = g.add_value("y", f32({2}));
  g.add_input(x);
  Node* relu = g.add_node("relu", "Relu", "", 13, {x}, {y}, {});
  Node* add = g.add_node("add", "Add", "", 13, {x, y}, {g.add_value("z", f32({2}))}, {});
  g.add_output(add->output(0));
  EXPECT_EQ(y->producer(), relu);
  EXPECT_EQ(x->producer(), nullptr);
  ASSERT_EQ(x->users().size(), 2u);
  EXPECT_EQ(x->users()[0], relu);
  EXPECT_EQ(x->users()[1], add);
  EXPECT_EQ(g.find_value("z"), add->output(0));
  EXPECT_EQ(g.find_value("nope"), nullptr);
  EXPECT_EQ(relu->input(5), nullptr);
  EXPECT_EQ(verify_error(g), "");
}

TEST(GraphTest, FindValueLooksInEnclosingGraphs) {
  Graph outer("main");
  Value* x = outer.add_value("x", f32({2}));
  Graph inner("body", &outer);
  Value* local = inner.add_value("x_local", f32({2}));
  EXPECT_EQ(inner.find_value("x"), x);
  EXPECT_EQ(inner.find_value("x_local"), local);
  EXPECT_EQ(outer.find_value("x_local"), nullptr);
  EXPECT_EQ(inner.parent(), &outer);
}

TEST(GraphTest, TypedAttributes) {
  Graph g("main");
  Value* x = g.add_value("x", f32({2}));
  g.add_input(x);
  std::map<std::string, AttributeValue> attrs;
  attrs["axis"] = int64_t{1};
  attrs["alpha"] = 0.5f;
  attrs["mode"] = std::string("constant");
  attrs["perm"] = std::vector<int64_t>{1, 0};
  attrs["scales"] = std::vector<float>{1.5f};
  Node* n = g.add_node("conv1", "Conv", "", 13, {x}, {g.add_value("y", f32({2}))}, attrs);
  EXPECT_EQ(n->attr_int("axis", 0), 1);
  EXPECT_EQ(n->attr_int("missing", 7), 7);
  EXPECT_FLOAT_EQ(n->attr_float("alpha", 0), 0.5f);
  EXPECT_EQ(n->attr_string("mode", ""), "constant");
  EXPECT_EQ(n->attr_ints("perm", {}), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(n->attr_floats("scales", {}), (std::vector<float>{1.5f}));
  EXPECT_EQ(n->attr_tensor("value"), nullptr);
  EXPECT_EQ(n->attr_graph("body"), nullptr);
  EXPECT_TRUE(n->has_attribute("axis"));
  EXPECT_EQ(n->describe(), "node 'conv1' (Conv)");
  try {
    n->attr_int("mode", 0);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "node 'conv1' (Conv): attribute 'mode' should be of type int, found string");
  }
  EXPECT_THROW(n->attr_ints("axis", {}), UserError);
}

TEST(GraphTest, DescribeNamesTheDomain) {
  Graph g("main");
  Node* n = g.add_node("ada", "Adagrad", "ai.onnx.preview.training", 1, {}, {}, {});
  EXPECT_EQ(n->describe(), "node 'ada' (ai.onnx.preview.training:Adagrad)");
}

TEST(GraphTest, VerifyReportsUndefinedInput) {
  Graph g("main");
  Value* x = g.add_value("x", f32({2}));
  g.add_input(x);
  Value* ghost = g.add_value("ghost", Type());
  Value* y = g.add_value("y", f32({2}));
  g.add_node("n3", "Add", "", 13, {x, ghost}, {y}, {});
  g.add_output(y);
  EXPECT_EQ(verify_error(g), "model.onnx: node 'n3' (Add): input 'ghost' is not defined");
}

TEST(GraphTest, VerifyReportsCycleFromTheFirstNodeOnIt) {
  Graph g("main");
  Value* x = g.add_value("x", f32({2}));
  g.add_input(x);
  Value* a = g.add_value("a", f32({2}));
  Value* b = g.add_value("b", f32({2}));
  Value* c = g.add_value("c", f32({2}));
  g.add_node("add_a", "Add", "", 13, {x, c}, {a}, {});
  g.add_node("relu_b", "Relu", "", 13, {a}, {b}, {});
  g.add_node("neg_c", "Neg", "", 13, {b}, {c}, {});
  g.add_output(c);
  EXPECT_EQ(verify_error(g),
            "model.onnx: node 'add_a' (Add): the graph has a cycle: 'add_a' -> 'relu_b' -> "
            "'neg_c' -> 'add_a'");
}

TEST(GraphTest, VerifyReportsSelfLoop) {
  Graph g("main");
  Value* a = g.add_value("a", f32({2}));
  g.add_node("loop", "Relu", "", 13, {a}, {a}, {});
  EXPECT_EQ(verify_error(g),
            "model.onnx: node 'loop' (Relu): the graph has a cycle: 'loop' -> 'loop'");
}

TEST(GraphTest, VerifyReportsOutOfOrderNodes) {
  Graph g("main");
  Value* x = g.add_value("x", f32({2}));
  g.add_input(x);
  Value* a = g.add_value("a", f32({2}));
  Value* b = g.add_value("b", f32({2}));
  g.add_node("second", "Relu", "", 13, {a}, {b}, {});
  g.add_node("first", "Relu", "", 13, {x}, {a}, {});
  g.add_output(b);
  EXPECT_EQ(verify_error(g),
            "model.onnx: node 'second' (Relu): input 'a' is produced by a later node 'first' "
            "(Relu); expected nodes in topological order");
}

TEST(GraphTest, VerifyReportsTwoProducers) {
  Graph g("main");
  Value* x = g.add_value("x", f32({2}));
  g.add_input(x);
  Value* y = g.add_value("y", f32({2}));
  g.add_node("p1", "Relu", "", 13, {x}, {y}, {});
  g.add_node("p2", "Neg", "", 13, {x}, {y}, {});
  g.add_output(y);
  EXPECT_EQ(verify_error(g),
            "model.onnx: node 'p2' (Neg): output 'y' is already produced by node 'p1' (Relu); "
            "expected one producer per value");
}

TEST(GraphTest, VerifyReportsNodeOverwritingAnInput) {
  Graph g("main");
  Value* x = g.add_value("x", f32({2}));
  g.add_input(x);
  g.add_node("w", "Relu", "", 13, {x}, {x}, {});
  EXPECT_EQ(verify_error(g),
            "model.onnx: node 'w' (Relu): output 'x' is already defined as a graph input or "
            "initializer");
  Graph h("main");
  Value* i = h.add_value("i", f32({2}));
  Value* o = h.add_value("o", f32({2}));
  h.add_input(i);
  h.add_input(o);
  h.add_node("w", "Relu", "", 13, {i}, {o}, {});
  EXPECT_EQ(verify_error(h),
            "model.onnx: node 'w' (Relu): output 'o' is already defined as a graph input or "
            "initializer");
}

TEST(GraphTest, VerifyReportsUndefinedOutput) {
  Graph g("main");
  g.add_output(g.add_value("y", f32({2})));
  EXPECT_EQ(verify_error(g), "model.onnx: graph 'main': output 'y' is not defined");
}

/// main: x -> If(cond) { then: Neg(x) ; else: Identity(x) } -> y, subgraphs reading x from main.
std::unique_ptr<Graph> make_if_graph(bool read_later_value) {
  auto g = std::make_unique<Graph>("main");
  Value* x = g->add_value("x", f32({2}));
  Value* cond = g->add_value("cond", Type::tensor(DType::kBool, Shape{}));
  g->add_input(x);
  g->add_input(cond);
  Value* y = g->add_value("y", f32({2}));
  Value* late = g->add_value("late", f32({2}));
  auto then_graph = std::make_shared<Graph>("then", g.get());
  Value* t = then_graph->add_value("t", f32({2}));
  then_graph->add_node("neg", "Neg", "", 13, {read_later_value ? late : x}, {t}, {});
  then_graph->add_output(t);
  auto else_graph = std::make_shared<Graph>("else", g.get());
  Value* e = else_graph->add_value("e", f32({2}));
  else_graph->add_node("id", "Identity", "", 13, {x}, {e}, {});
  else_graph->add_output(e);
  std::map<std::string, AttributeValue> attrs;
  attrs["then_branch"] = then_graph;
  attrs["else_branch"] = else_graph;
  attrs["note"] = std::string("hi");
  g->add_node("if", "If", "", 13, {cond}, {y}, attrs);
  g->add_node("after", "Relu", "", 13, {y}, {late}, {});
  g->add_output(late);
  return g;
}

TEST(GraphTest, VerifyAcceptsSubgraphsReadingOuterValues) {
  auto g = make_if_graph(false);
  EXPECT_EQ(verify_error(*g), "");
  ASSERT_EQ(g->nodes()[0]->subgraphs().size(), 2u);
  EXPECT_EQ(g->nodes()[0]->subgraphs()[0]->name(), "else");  // attribute name order
}

TEST(GraphTest, VerifyReportsSubgraphReadingALaterOuterValue) {
  // 'if' reads 'late' through its then-branch, and 'after' reads the output of 'if': a cycle
  // that only exists through the subgraph.
  auto g = make_if_graph(true);
  EXPECT_EQ(verify_error(*g),
            "model.onnx: node 'if' (If): the graph has a cycle: 'if' -> 'after' -> 'if'");
}

TEST(GraphTest, DumpShowsInputsNodesAttributesAndSubgraphs) {
  auto g = make_if_graph(false);
  EXPECT_EQ(dump(*g),
            "graph 'main'\n"
            "input %x: float32[2]\n"
            "input %cond: bool[]\n"
            "%y = If(%cond) {note=\"hi\"}  # if\n"
            "    else_branch:\n"
            "        graph 'else'\n"
            "        %e = Identity(%x)  # id\n"
            "        output %e: float32[2]\n"
            "    then_branch:\n"
            "        graph 'then'\n"
            "        %t = Neg(%x)  # neg\n"
            "        output %t: float32[2]\n"
            "%late = Relu(%y)  # after\n"
            "output %late: float32[2]\n");
}

TEST(GraphTest, DumpShowsInitializersAndOmittedInputs) {
  Graph g("main");
  Value* x = g.add_value("x", f32({sym::Expr::symbol("n"), 4}));
  g.add_input(x);
  Value* w = g.add_value("w", f32({4}));
  auto data = std::make_shared<Tensor>(DType::kFloat32, std::vector<int64_t>{4});
  g.set_initializer(w, data);
  Value* y = g.add_value("y", f32({sym::Expr::symbol("n"), 4}));
  std::map<std::string, AttributeValue> attrs;
  attrs["perm"] = std::vector<int64_t>{1, 0};
  attrs["value"] = Tensor(DType::kInt64, {1});
  g.add_node("clip", "Clip", "", 13, {x, nullptr, w}, {y}, attrs);
  g.add_output(y);
  EXPECT_EQ(g.initializers().size(), 1u);
  EXPECT_EQ(w->initializer(), data.get());
  EXPECT_EQ(dump(g),
            "graph 'main'\n"
            "input %x: float32[n, 4]\n"
            "initializer %w: float32[4] (16 bytes)\n"
            "%y = Clip(%x, none, %w) {perm=[1, 0], value=tensor<int64[1]>(0)}  # clip\n"
            "output %y: float32[n, 4]\n");
}

}  // namespace
}  // namespace kiln::graph
