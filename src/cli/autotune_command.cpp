// `kiln autotune-bench REQUEST.json`: the hidden benchmark helper. Autotuning (src/autotune/
// select.h) starts the kiln binary itself with this subcommand, so that each GEMM choice runs in
// a separate process: one that crashes or hangs takes down the helper, never the compiler. Not
// for users; it has no help entry (an empty group hides it).
#include <memory>
#include <string>

#include "autotune/benchmark_helper.h"
#include "cli/commands.h"

namespace kiln::cli {

void add_autotune_command(CLI::App& app, CommandAction& chosen) {
  CLI::App* cmd = app.add_subcommand("autotune-bench", "Time GEMM choices (internal)");
  cmd->group("");
  auto request = std::make_shared<std::string>();
  cmd->add_option("request", *request, "The benchmark request (JSON) written by the autotuner")
      ->required();
  cmd->callback([&chosen, request] {
    chosen = [request] { return autotune::run_benchmark_helper(*request); };
  });
}

}  // namespace kiln::cli
