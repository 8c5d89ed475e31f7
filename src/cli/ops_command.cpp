// `kiln ops`: the ops Kiln compiles, each with the opset versions it lowers, as tab-separated
// lines `OP<TAB>MIN<TAB>MAX` (OP is `domain:Op` outside ai.onnx). tests/onnx/gen_ops_doc.py
// turns this into docs/ops.md.
#include <fmt/format.h>

#include "cli/commands.h"
#include "lower/supported_ops.h"

namespace kiln::cli {

void add_ops_command(CLI::App& app, CommandAction& chosen) {
  CLI::App* cmd = app.add_subcommand("ops", "List the ops Kiln compiles and their opset ranges");
  cmd->callback([&chosen] {
    chosen = [] {
      for (const lower::SupportedOp& op : lower::supported_op_table()) {
        fmt::print("{}\t{}\t{}\n", op.name, op.min_opset, op.max_opset);
      }
      return 0;
    };
  });
}

}  // namespace kiln::cli
