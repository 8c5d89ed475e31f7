#pragma once
/// Hand-built ir::Programs for the scheduler and codegen tests (lowering is not used, so these
/// tests do not depend on it). Every builder returns a Program with contiguous layouts.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/buffer.h"

namespace kiln::testing {

using graph::DType;
using ir::OpCode;
using ir::ValueId;
using sym::Expr;

/// Builds a Program one buffer at a time.
class ProgramBuilder {
 public:
  ir::Buffer& input(const std::string& name, DType dtype, std::vector<Expr> sizes) {
    ir::Buffer& b = add(name, ir::BufferKind::kInput, dtype, sizes);
    program.inputs.push_back(ir::InputSpec{name, name, dtype, sizes});
    return b;
  }

  /// A computed buffer over `sizes` (and `reduce_sizes`); fill its body, then store.
  ir::Buffer& computed(const std::string& name, DType dtype, std::vector<Expr> sizes,
                       std::vector<Expr> reduce_sizes = {}, const std::string& op_type = "") {
    std::vector<Expr> layout_sizes = sizes;
    ir::Buffer& b = add(name, ir::BufferKind::kComputed, dtype, layout_sizes);
    b.body = ir::LoopBody(std::move(sizes), std::move(reduce_sizes));
    if (!op_type.empty()) b.add_origin(ir::Origin{name + "_node", op_type});
    return b;
  }

  /// An extern call computing `name` from whole buffers.
  ir::Buffer& extern_call(const std::string& name, DType dtype, std::vector<Expr> sizes,
                          const std::vector<std::string>& inputs) {
    ir::Buffer& b = add(name, ir::BufferKind::kExtern, dtype, sizes);
    b.call.op = ir::DetCall{};  // any library call
    for (const std::string& in : inputs) {
      const ir::Buffer* src = program.find(in);
      b.call.inputs.push_back(ir::View{in, src->dtype, src->layout});
    }
    return b;
  }

  void output(const std::string& name) {
    const ir::Buffer* b = program.find(name);
    program.outputs.push_back(ir::OutputSpec{name, name, b->dtype, b->layout.sizes});
  }

  /// The contiguous flat index of `name` at `indices`.
  Expr at(const std::string& name, const std::vector<Expr>& indices) const {
    return program.find(name)->layout.index(indices);
  }

  /// Stores `value` into `b` at its contiguous index over its own pointwise variables.
  void store(ir::Buffer& b, ValueId value) {
    b.body.store(b.name, b.dtype, b.layout.index(b.body.vars()), value);
  }

  ir::Program program;

 private:
  ir::Buffer& add(const std::string& name, ir::BufferKind kind, DType dtype,
                  const std::vector<Expr>& sizes) {
    auto b = std::make_unique<ir::Buffer>();
    b->name = name;
    b->kind = kind;
    b->dtype = dtype;
    b->layout = ir::Layout::contiguous(sizes);
    program.buffers.push_back(std::move(b));
    return *program.buffers.back();
  }
};

inline Expr var(const ir::Buffer& b, int k) { return b.body.vars().at(k); }
inline Expr rvar(const ir::Buffer& b, int k) { return b.body.reduce_vars().at(k); }

/// out = Relu(Add(x, y)) * 2 with `a` = x + y and `r` = relu(a) materialized, over [rows, cols].
inline ir::Program add_relu_mul_program(Expr rows, Expr cols, DType dtype = DType::kFloat32) {
  ProgramBuilder p;
  p.input("x", dtype, {rows, cols});
  p.input("y", dtype, {rows, cols});
  ir::Buffer& a = p.computed("a", dtype, {rows, cols}, {}, "Add");
  auto ia = p.at("x", a.body.vars());
  p.store(a, a.body.binary(OpCode::kAdd, a.body.load("x", dtype, ia), a.body.load("y", dtype, ia)));
  ir::Buffer& r = p.computed("r", dtype, {rows, cols}, {}, "Relu");
  p.store(r, r.body.unary(OpCode::kRelu, r.body.load("a", dtype, p.at("a", r.body.vars()))));
  ir::Buffer& m = p.computed("m", dtype, {rows, cols}, {}, "Mul");
  auto v = m.body.load("r", dtype, p.at("r", m.body.vars()));
  p.store(m, m.body.binary(OpCode::kMul, v, m.body.constant(2, dtype)));
  p.output("m");
  return std::move(p.program);
}

/// Softmax over the last dim of x [rows, cols]: max, exp(x - max), sum, div.
inline ir::Program softmax_program(Expr rows, Expr cols) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {rows, cols});
  ir::Buffer& mx = p.computed("mx", f, {rows}, {cols}, "ReduceMax");
  auto xv = mx.body.load("x", f, p.at("x", {var(mx, 0), rvar(mx, 0)}));
  p.store(mx, mx.body.reduction(ir::ReductionType::kMax, xv, f));
  ir::Buffer& e = p.computed("e", f, {rows, cols}, {}, "Exp");
  auto d = e.body.binary(OpCode::kSub, e.body.load("x", f, p.at("x", e.body.vars())),
                         e.body.load("mx", f, var(e, 0)));
  p.store(e, e.body.unary(OpCode::kExp, d));
  ir::Buffer& s = p.computed("s", f, {rows}, {cols}, "ReduceSum");
  auto ev = s.body.load("e", f, p.at("e", {var(s, 0), rvar(s, 0)}));
  p.store(s, s.body.reduction(ir::ReductionType::kSum, ev, f));
  ir::Buffer& out = p.computed("out", f, {rows, cols}, {}, "Div");
  p.store(out, out.body.binary(OpCode::kDiv, out.body.load("e", f, p.at("e", out.body.vars())),
                               out.body.load("s", f, var(out, 0))));
  p.output("out");
  return std::move(p.program);
}

/// LayerNormalization over the last dim of x [rows, cols] followed by Gelu (erf form).
inline ir::Program layernorm_gelu_program(Expr rows, Expr cols) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {rows, cols});
  p.input("gamma", f, {cols});
  p.input("beta", f, {cols});
  ir::Buffer& mean = p.computed("mean", f, {rows}, {cols}, "LayerNormalization");
  p.store(mean,
          mean.body.reduction(ir::ReductionType::kWelfordMean,
                              mean.body.load("x", f, p.at("x", {var(mean, 0), rvar(mean, 0)})), f));
  ir::Buffer& var_ = p.computed("var", f, {rows}, {cols}, "LayerNormalization");
  p.store(var_,
          var_.body.reduction(ir::ReductionType::kWelfordVar,
                              var_.body.load("x", f, p.at("x", {var(var_, 0), rvar(var_, 0)})), f));
  ir::Buffer& y = p.computed("y", f, {rows, cols}, {}, "LayerNormalization");
  {
    ir::LoopBody& b = y.body;
    auto centered =
        b.binary(OpCode::kSub, b.load("x", f, p.at("x", b.vars())), b.load("mean", f, var(y, 0)));
    auto denom = b.unary(OpCode::kRsqrt,
                         b.binary(OpCode::kAdd, b.load("var", f, var(y, 0)), b.constant(1e-5, f)));
    auto scaled = b.binary(OpCode::kMul, b.binary(OpCode::kMul, centered, denom),
                           b.load("gamma", f, var(y, 1)));
    p.store(y, b.binary(OpCode::kAdd, scaled, b.load("beta", f, var(y, 1))));
  }
  ir::Buffer& g = p.computed("g", f, {rows, cols}, {}, "Gelu");
  {
    ir::LoopBody& b = g.body;
    auto v = b.load("y", f, p.at("y", b.vars()));
    auto erf = b.unary(OpCode::kErf, b.binary(OpCode::kMul, v, b.constant(0.7071067811865476, f)));
    auto half = b.binary(OpCode::kMul, v, b.constant(0.5, f));
    p.store(g, b.binary(OpCode::kMul, half, b.binary(OpCode::kAdd, erf, b.constant(1, f))));
  }
  p.output("g");
  return std::move(p.program);
}

}  // namespace kiln::testing
