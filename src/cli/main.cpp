// The kiln command: a dispatcher over subcommands (commands.h) and the one place where errors
// become messages and exit codes: 0 success, 2 user error (bad model, bad arguments), 3 internal
// error (a bug in Kiln).
#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <string_view>

#include "cli/commands.h"
#include "support/error.h"

namespace kiln::cli {
namespace {

constexpr int kExitUserError = 2;
constexpr int kExitInternalError = 3;

/// Developer switch to exercise the internal-error path end to end (tests/errors/).
void maybe_raise_debug_internal_error() {
  const char* flag = std::getenv("KILN_DEBUG_INTERNAL_ERROR");
  if (flag != nullptr && std::string_view(flag) == "1") {
    internal_error("raised on purpose because KILN_DEBUG_INTERNAL_ERROR=1");
  }
}

int run(int argc, char** argv) {
  CLI::App app{"kiln: an ahead-of-time compiler for ONNX models", "kiln"};
  app.set_version_flag("--version", "kiln " KILN_VERSION);
  app.require_subcommand(1);
  CommandAction chosen;
  add_info_command(app, chosen);
  add_ops_command(app, chosen);
  add_run_command(app, chosen);
  add_compile_command(app, chosen);
  add_bench_command(app, chosen);
  add_autotune_command(app, chosen);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    fmt::print(stderr, "kiln: error: {}\nRun 'kiln --help' for usage.\n", e.what());
    return kExitUserError;
  }
  maybe_raise_debug_internal_error();
  if (!chosen) internal_error("no subcommand was chosen although one is required");
  return chosen();
}

}  // namespace
}  // namespace kiln::cli

int main(int argc, char** argv) {
  try {
    return kiln::cli::run(argc, argv);
  } catch (const kiln::UserError& e) {
    fmt::print(stderr, "kiln: error: {}\n", e.what());
    return kiln::cli::kExitUserError;
  } catch (const kiln::InternalError& e) {
    fmt::print(stderr, "kiln: internal error (a bug in Kiln, please report it): {}\n", e.what());
    return kiln::cli::kExitInternalError;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln: internal error (a bug in Kiln, please report it): {}\n", e.what());
    return kiln::cli::kExitInternalError;
  } catch (...) {
    fmt::print(stderr,
               "kiln: internal error (a bug in Kiln, please report it): unknown exception\n");
    return kiln::cli::kExitInternalError;
  }
}
