#pragma once
/// The kiln subcommands. Each lives in its own <name>_command.cpp and registers itself on the
/// top-level CLI11 app; when the user picks it, parsing stores its action in `chosen`, which
/// main() then runs.
/// Actions throw UserError / InternalError; main() turns those into messages and exit codes.

#include <CLI/CLI.hpp>

#include <functional>

namespace kiln::cli {

/// What a chosen subcommand does; returns the process exit status.
using CommandAction = std::function<int()>;

/// `kiln info MODEL`: what a model holds and which of its ops Kiln cannot compile yet.
void add_info_command(CLI::App& app, CommandAction& chosen);

/// `kiln ops`: every op Kiln compiles with its opset range, one per line (for docs/ops.md).
void add_ops_command(CLI::App& app, CommandAction& chosen);

/// `kiln autotune-bench REQUEST.json` (hidden): the benchmark helper the autotuner starts as a
/// child process (src/autotune/benchmark_helper.h).
void add_autotune_command(CLI::App& app, CommandAction& chosen);

/// `kiln bench MODEL --threads N --iters N ...`: latency percentiles and throughput of a model.
void add_bench_command(CLI::App& app, CommandAction& chosen);

/// `kiln run MODEL --input NAME=FILE ...`: compile (or hit the code cache), run, write outputs.
void add_run_command(CLI::App& app, CommandAction& chosen);

/// `kiln compile MODEL -o model.so`: a self-contained model library with a C API.
void add_compile_command(CLI::App& app, CommandAction& chosen);

}  // namespace kiln::cli
