// Subcommand registry for the `pipeline` executable. Each tools/cmd_<name>.cpp registers
// one command with PIPELINE_COMMAND; main.cpp dispatches and prints the help.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace pipeline::cli {

/// A subcommand: `run(args)` gets the arguments after the command name and returns the
/// process exit code. `usage` is printed for `pipeline NAME --help`.
struct Command {
  std::string name;
  std::string summary;
  std::string usage;
  std::function<int(const std::vector<std::string>& args)> run;
};

std::vector<Command>& commands();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { commands().push_back(std::move(c)); }
};

/// True when args holds -h or --help.
bool wants_help(const std::vector<std::string>& args);

}  // namespace pipeline::cli

#define PIPELINE_CLI_CAT2(a, b) a##b
#define PIPELINE_CLI_CAT(a, b) PIPELINE_CLI_CAT2(a, b)
/// Example: PIPELINE_COMMAND({"tokenize", "encode text to GPT-2 ids", "usage...", &tokenize_main});
#define PIPELINE_COMMAND(...) \
  static ::pipeline::cli::CommandRegistrar PIPELINE_CLI_CAT(pipeline_cmd_, __LINE__){::pipeline::cli::Command __VA_ARGS__}
