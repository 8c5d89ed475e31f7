#include "codegen/cpp/cpp_ops.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/error.h"

namespace kiln::codegen {
namespace {

using ir::OpCode;

constexpr CppOpTemplates kStructural{};

CppOpTemplates entry(const char* scalar, const char* vector) { return {scalar, vector, false}; }
CppOpTemplates logical(const char* scalar, const char* vector) { return {scalar, vector, true}; }

}  // namespace

const CppOpTemplates& cpp_op_templates(OpCode code) {
  // One entry per op; -Wswitch flags any op of ops.def missing here.
  static const CppOpTemplates kNeg = entry("kiln::neg({0})", "(-{0})");
  static const CppOpTemplates kAbs = entry("kiln::abs({0})", "kiln::vec::abs({0})");
  static const CppOpTemplates kExp = entry("std::exp({0})", "kiln::vec::exp({0})");
  static const CppOpTemplates kLog = entry("std::log({0})", "kiln::vec::log({0})");
  static const CppOpTemplates kSqrt = entry("std::sqrt({0})", "kiln::vec::sqrt({0})");
  static const CppOpTemplates kRsqrt = entry("kiln::rsqrt({0})", "kiln::vec::rsqrt({0})");
  static const CppOpTemplates kRecip = entry("kiln::reciprocal({0})", "kiln::vec::reciprocal({0})");
  static const CppOpTemplates kTanh = entry("std::tanh({0})", "kiln::vec::tanh({0})");
  static const CppOpTemplates kSigmoid = entry("kiln::sigmoid({0})", "kiln::vec::sigmoid({0})");
  static const CppOpTemplates kErf = entry("std::erf({0})", "kiln::vec::erf({0})");
  static const CppOpTemplates kRelu = entry("kiln::relu({0})", "kiln::vec::relu({0})");
  static const CppOpTemplates kFloor = entry("kiln::floor({0})", "kiln::vec::floor({0})");
  static const CppOpTemplates kCeil = entry("kiln::ceil({0})", "kiln::vec::ceil({0})");
  static const CppOpTemplates kRound = entry("kiln::round_even({0})", "kiln::vec::round_even({0})");
  static const CppOpTemplates kSign = entry("kiln::sign({0})", "kiln::vec::sign({0})");
  static const CppOpTemplates kSin = entry("std::sin({0})", "kiln::vec::sin({0})");
  static const CppOpTemplates kCos = entry("std::cos({0})", "kiln::vec::cos({0})");
  static const CppOpTemplates kTan = entry("std::tan({0})", "kiln::vec::tan({0})");
  static const CppOpTemplates kAsin = entry("std::asin({0})", "kiln::vec::asin({0})");
  static const CppOpTemplates kAcos = entry("std::acos({0})", "kiln::vec::acos({0})");
  static const CppOpTemplates kAtan = entry("std::atan({0})", "kiln::vec::atan({0})");
  static const CppOpTemplates kSinh = entry("std::sinh({0})", "kiln::vec::sinh({0})");
  static const CppOpTemplates kCosh = entry("std::cosh({0})", "kiln::vec::cosh({0})");
  static const CppOpTemplates kAsinh = entry("std::asinh({0})", "kiln::vec::asinh({0})");
  static const CppOpTemplates kAcosh = entry("std::acosh({0})", "kiln::vec::acosh({0})");
  static const CppOpTemplates kAtanh = entry("std::atanh({0})", "kiln::vec::atanh({0})");
  static const CppOpTemplates kLog1p = entry("std::log1p({0})", "kiln::vec::log1p({0})");
  static const CppOpTemplates kExpm1 = entry("std::expm1({0})", "kiln::vec::expm1({0})");
  static const CppOpTemplates kSoftplus = entry("kiln::softplus({0})", "kiln::vec::softplus({0})");
  static const CppOpTemplates kNot = logical("(!{0})", "kiln::vec::lnot({0})");
  static const CppOpTemplates kBitNot = entry("kiln::bit_not({0})", nullptr);
  static const CppOpTemplates kIsNan = entry("kiln::isnan({0})", "kiln::vec::isnan({0})");
  static const CppOpTemplates kIsPosInf = entry("kiln::isposinf({0})", "kiln::vec::isposinf({0})");
  static const CppOpTemplates kIsNegInf = entry("kiln::isneginf({0})", "kiln::vec::isneginf({0})");
  static const CppOpTemplates kAdd = entry("({0} + {1})", "({0} + {1})");
  static const CppOpTemplates kSub = entry("({0} - {1})", "({0} - {1})");
  static const CppOpTemplates kMul = entry("({0} * {1})", "({0} * {1})");
  static const CppOpTemplates kDiv = entry("kiln::div({0}, {1})", "({0} / {1})");
  static const CppOpTemplates kPow = entry("kiln::pow({0}, {1})", "kiln::vec::pow({0}, {1})");
  static const CppOpTemplates kMin =
      entry("kiln::minimum({0}, {1})", "kiln::vec::minimum({0}, {1})");
  static const CppOpTemplates kMax =
      entry("kiln::maximum({0}, {1})", "kiln::vec::maximum({0}, {1})");
  static const CppOpTemplates kFmod = entry("kiln::fmod({0}, {1})", "kiln::vec::fmod({0}, {1})");
  static const CppOpTemplates kFloorMod =
      entry("kiln::floor_mod({0}, {1})", "kiln::vec::floor_mod({0}, {1})");
  static const CppOpTemplates kAnd = logical("({0} && {1})", "kiln::vec::land({0}, {1})");
  static const CppOpTemplates kOr = logical("({0} || {1})", "kiln::vec::lor({0}, {1})");
  static const CppOpTemplates kXor = logical("({0} != {1})", "kiln::vec::lxor({0}, {1})");
  static const CppOpTemplates kBitAnd = entry("({0} & {1})", nullptr);
  static const CppOpTemplates kBitOr = entry("({0} | {1})", nullptr);
  static const CppOpTemplates kBitXor = entry("({0} ^ {1})", nullptr);
  static const CppOpTemplates kShl = entry("kiln::shl({0}, {1})", nullptr);
  static const CppOpTemplates kShr = entry("kiln::shr({0}, {1})", nullptr);
  static const CppOpTemplates kEq = entry("({0} == {1})", "kiln::vec::eq({0}, {1})");
  static const CppOpTemplates kNe = entry("({0} != {1})", "kiln::vec::ne({0}, {1})");
  static const CppOpTemplates kLt = entry("({0} < {1})", "kiln::vec::lt({0}, {1})");
  static const CppOpTemplates kLe = entry("({0} <= {1})", "kiln::vec::le({0}, {1})");
  static const CppOpTemplates kGt = entry("({0} > {1})", "kiln::vec::gt({0}, {1})");
  static const CppOpTemplates kGe = entry("({0} >= {1})", "kiln::vec::ge({0}, {1})");
  switch (code) {
    case OpCode::kLoad:
    case OpCode::kStore:
    case OpCode::kConstant:
    case OpCode::kIndexExpr:
    case OpCode::kIndirect:
    case OpCode::kCast:
    case OpCode::kBitCast:
    case OpCode::kWhere:
    case OpCode::kReduction:
      return kStructural;
    case OpCode::kNeg:
      return kNeg;
    case OpCode::kAbs:
      return kAbs;
    case OpCode::kExp:
      return kExp;
    case OpCode::kLog:
      return kLog;
    case OpCode::kSqrt:
      return kSqrt;
    case OpCode::kRsqrt:
      return kRsqrt;
    case OpCode::kReciprocal:
      return kRecip;
    case OpCode::kTanh:
      return kTanh;
    case OpCode::kSigmoid:
      return kSigmoid;
    case OpCode::kErf:
      return kErf;
    case OpCode::kRelu:
      return kRelu;
    case OpCode::kFloor:
      return kFloor;
    case OpCode::kCeil:
      return kCeil;
    case OpCode::kRound:
      return kRound;
    case OpCode::kSign:
      return kSign;
    case OpCode::kSin:
      return kSin;
    case OpCode::kCos:
      return kCos;
    case OpCode::kTan:
      return kTan;
    case OpCode::kAsin:
      return kAsin;
    case OpCode::kAcos:
      return kAcos;
    case OpCode::kAtan:
      return kAtan;
    case OpCode::kSinh:
      return kSinh;
    case OpCode::kCosh:
      return kCosh;
    case OpCode::kAsinh:
      return kAsinh;
    case OpCode::kAcosh:
      return kAcosh;
    case OpCode::kAtanh:
      return kAtanh;
    case OpCode::kLog1p:
      return kLog1p;
    case OpCode::kExpm1:
      return kExpm1;
    case OpCode::kSoftplus:
      return kSoftplus;
    case OpCode::kNot:
      return kNot;
    case OpCode::kBitNot:
      return kBitNot;
    case OpCode::kIsNan:
      return kIsNan;
    case OpCode::kIsPosInf:
      return kIsPosInf;
    case OpCode::kIsNegInf:
      return kIsNegInf;
    case OpCode::kAdd:
      return kAdd;
    case OpCode::kSub:
      return kSub;
    case OpCode::kMul:
      return kMul;
    case OpCode::kDiv:
      return kDiv;
    case OpCode::kPow:
      return kPow;
    case OpCode::kMinimum:
      return kMin;
    case OpCode::kMaximum:
      return kMax;
    case OpCode::kFmod:
      return kFmod;
    case OpCode::kFloorMod:
      return kFloorMod;
    case OpCode::kAnd:
      return kAnd;
    case OpCode::kOr:
      return kOr;
    case OpCode::kXor:
      return kXor;
    case OpCode::kBitAnd:
      return kBitAnd;
    case OpCode::kBitOr:
      return kBitOr;
    case OpCode::kBitXor:
      return kBitXor;
    case OpCode::kShl:
      return kShl;
    case OpCode::kShr:
      return kShr;
    case OpCode::kEq:
      return kEq;
    case OpCode::kNe:
      return kNe;
    case OpCode::kLt:
      return kLt;
    case OpCode::kLe:
      return kLe;
    case OpCode::kGt:
      return kGt;
    case OpCode::kGe:
      return kGe;
  }
  internal_error("no C++ template for op {}", static_cast<int>(code));
}

std::string_view cpp_compute_type(graph::DType dtype) {
  switch (dtype) {
    case graph::DType::kFloat16:
    case graph::DType::kBFloat16:
      return "float";
    case graph::DType::kBool:
      return "bool";
    default:
      break;
  }
  std::string_view t = graph::dtype_cpp_storage(dtype);
  KILN_CHECK(!t.empty(), "no C++ type for dtype {}", graph::dtype_name(dtype));
  return t;
}

namespace {

std::string float_literal(double v, graph::DType dtype) {
  std::string_view type = cpp_compute_type(dtype);
  if (std::isnan(v)) return fmt::format("std::numeric_limits<{}>::quiet_NaN()", type);
  if (std::isinf(v)) {
    return fmt::format("{}std::numeric_limits<{}>::infinity()", v < 0 ? "-" : "", type);
  }
  bool is_double = dtype == graph::DType::kFloat64;
  std::string text =
      is_double ? fmt::format("{:.17g}", v) : fmt::format("{:.9g}", static_cast<float>(v));
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  if (!is_double) text += 'f';
  return text;
}

}  // namespace

std::string format_op(const char* tmpl, const std::vector<std::string>& args) {
  switch (args.size()) {
    case 1:
      return fmt::format(fmt::runtime(tmpl), args[0]);
    case 2:
      return fmt::format(fmt::runtime(tmpl), args[0], args[1]);
    default:
      return fmt::format(fmt::runtime(tmpl), args.at(0), args.at(1), args.at(2));
  }
}

std::optional<std::string> format_number_bound(const ir::Op& op, const std::vector<ir::Op>& ops,
                                               const std::vector<std::string>& args, OpForm form) {
  const bool max = op.code == OpCode::kMaximum;
  if ((!max && op.code != OpCode::kMinimum) || !graph::is_floating(op.dtype)) return std::nullopt;
  if (form != OpForm::kScalar && op.dtype != graph::DType::kFloat32) return std::nullopt;
  auto is_number = [&](int k) {
    const ir::ValueId id = op.operands[static_cast<size_t>(k)];
    if (id == ir::kNoValue || static_cast<size_t>(id) >= ops.size()) return false;
    const ir::Op& operand = ops[static_cast<size_t>(id)];
    return operand.code == OpCode::kConstant && graph::is_floating(operand.dtype) &&
           !std::isnan(operand.float_value);
  };
  const int bound = is_number(1) ? 1 : is_number(0) ? 0 : -1;
  if (bound < 0) return std::nullopt;
  const char* name = form == OpForm::kKv ? (max ? "kv_max_num" : "kv_min_num")
                     : form == OpForm::kVec
                         ? (max ? "kiln::vec::maximum_num" : "kiln::vec::minimum_num")
                         : (max ? "kiln::maximum_num" : "kiln::minimum_num");
  return fmt::format("{}({}, {})", name, args.at(static_cast<size_t>(1 - bound)),
                     args.at(static_cast<size_t>(bound)));
}

std::string cpp_literal(const ir::Op& op) {
  graph::DType dtype = op.dtype;
  if (dtype == graph::DType::kBool) return op.int_value != 0 ? "true" : "false";
  if (graph::is_floating(dtype)) return float_literal(op.float_value, dtype);
  std::string_view type = cpp_compute_type(dtype);
  if (dtype == graph::DType::kInt64 && op.int_value == std::numeric_limits<int64_t>::min()) {
    return "std::numeric_limits<int64_t>::min()";
  }
  if (dtype == graph::DType::kUInt64) {
    return fmt::format("static_cast<uint64_t>(UINT64_C({}))", static_cast<uint64_t>(op.int_value));
  }
  return fmt::format("static_cast<{}>(INT64_C({}))", type, op.int_value);
}

std::string cpp_reduction_init(ir::ReductionType type, graph::DType dtype) {
  std::string_view t = cpp_compute_type(dtype);
  bool fp = graph::is_floating(dtype);
  switch (type) {
    case ir::ReductionType::kSum:
      return fmt::format("static_cast<{}>(0)", t);
    case ir::ReductionType::kProd:
      return fmt::format("static_cast<{}>(1)", t);
    case ir::ReductionType::kMax:
      return fp ? fmt::format("-std::numeric_limits<{}>::infinity()", t)
                : fmt::format("std::numeric_limits<{}>::lowest()", t);
    case ir::ReductionType::kMin:
      return fp ? fmt::format("std::numeric_limits<{}>::infinity()", t)
                : fmt::format("std::numeric_limits<{}>::max()", t);
    case ir::ReductionType::kAny:
      return "false";
    case ir::ReductionType::kAll:
      return "true";
    case ir::ReductionType::kArgMax:
    case ir::ReductionType::kArgMin:
    case ir::ReductionType::kWelfordMean:
    case ir::ReductionType::kWelfordVar:
      return "{}";
  }
  return "{}";
}

const char* cpp_simd_math_form(const ir::Op& op) {
  if (op.dtype != graph::DType::kFloat32) return nullptr;
  switch (op.code) {
    case OpCode::kExp:
      return "kiln_simd_exp({0})";
    case OpCode::kLog:
      return "kiln_simd_log({0})";
    case OpCode::kTanh:
      return "kiln_fast_tanh({0})";
    case OpCode::kErf:
      return "kiln_fast_erf({0})";
    case OpCode::kSigmoid:
      return "(1.0f / (1.0f + kiln_simd_exp(-{0})))";
    default:
      return nullptr;
  }
}

}  // namespace kiln::codegen
