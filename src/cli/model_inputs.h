#pragma once
/// Inputs of the commands that run a model (`kiln run`, `kiln bench`): NAME=VALUE arguments,
/// seeded random tensors in each input's valid range, and shapes as text.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "graph/tensor.h"
#include "sym/expr.h"

namespace kiln::cli {

/// Splits "NAME=VALUE"; a UserError naming the option `what` when there is no '=' or no name.
/// ONNX names may hold '=': with `names` (the names NAME may take) it splits at the first '='
/// whose left part is one of them, else at the first '='; without, at the last '=' (for values
/// that hold none: dims, integers).
std::pair<std::string, std::string> split_assignment(const std::string& text, const char* what,
                                                     const std::vector<std::string>& names = {});

/// A model input as `--input` reads it: its name and declared type.
struct DeclaredInput {
  std::string name;
  graph::Type type;
};

/// The inputs given as NAME=FILE (`kiln run --input`, `kiln bench --input`), read before
/// compiling so that the compile can specialize on them.
struct GivenInputs {
  /// Each given tensor by its flat name: an input's own name, or "NAME[i]" for the i-th element
  /// of a sequence.
  std::map<std::string, std::shared_ptr<const graph::Tensor>> tensors;
  /// Sequences and optionals (a .pb SequenceProto or OptionalProto): their length and presence
  /// are fixed when compiling.
  std::map<std::string, graph::IoValue> structured;

  /// Adds them to the lowering options: small integer tensors (shape arguments) are specialized
  /// on their values, which the compiled model checks at run time; structured values fix their
  /// length and presence.
  void specialize(lower::LoweringOptions& options) const;
};

/// Reads the NAME=FILE items (`option` names the command line option in errors) against the
/// model's inputs: a UserError for an unknown name, an input given twice, or a file that does
/// not hold a value of the input's type.
GivenInputs read_given_inputs(const std::vector<std::string>& items,
                              const std::vector<DeclaredInput>& inputs, const char* option);

/// The inputs of an imported model, as read_given_inputs takes them.
std::vector<DeclaredInput> declared_inputs(const graph::Model& model);

/// Seeded random values in the input's valid range: floats in [-1, 1), booleans, integers in
/// [0, bound) (`bound` at least 1).
graph::Tensor random_tensor(graph::DType dtype, const std::vector<int64_t>& dims, int64_t bound,
                            std::mt19937_64& rng);

/// The size of the axis that an index input (read Gather-style) of `model` indexes; nullopt for
/// other inputs.
std::optional<sym::Expr> indexed_axis_size(const driver::CompiledModel& model,
                                           const ir::InputSpec& spec);

/// The bound of random integers for an input: the size of the axis it indexes (under
/// `binding`), else 10.
int64_t random_integer_bound(const std::optional<sym::Expr>& indexed_axis,
                             const sym::Binding& binding);

/// The dims of a shape under `binding`; symbols not yet bound are bound to 1 first.
std::vector<int64_t> concrete_dims(const std::vector<sym::Expr>& shape, sym::Binding& binding);

/// "[1, 3, 224, 224]".
std::string dims_text(const std::vector<int64_t>& dims);

}  // namespace kiln::cli
