// Subcommand registry for the `pipeline` executable. Each tools/cmd_<name>.cpp registers
// one command with PIPELINE_COMMAND; main.cpp dispatches and prints the help.
//
// The program comes in two halves. The executable itself holds every command that needs no
// tensors, so they start at once without LibTorch. The commands that do (run, generate, export, eval)
// live in the LibTorch half, libpipeline_torch.so next to the executable: they register there
// with PIPELINE_COMMAND_IMPL (name and function), and the executable describes them
// (tools/torch_commands.cpp) and loads that library when one of them is called.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
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

/// `v`, the value of option `flag`, as an integer in [lo, hi]; std::invalid_argument naming the
/// option and the range otherwise.
int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi);

/// The value that follows the option args[i] (i moves onto it); std::invalid_argument
/// "OPTION needs a value (see pipeline COMMAND --help)" when args ends there.
const std::string& option_value(const std::vector<std::string>& args, size_t& i, const std::string& command);

/// The argument of `--set ARG` or `--set=ARG` at args[i] (i moves past what it used), or nullopt when
/// args[i] is neither. ARG must hold '=' (section.key=value, or TABLE= that removes a table):
/// `--set training.steps 3` is std::invalid_argument that says to write training.steps=3.
std::optional<std::string> set_argument(const std::vector<std::string>& args, size_t& i, const std::string& command);

/// Runs a command: its usage for --help, else its function, with an exception turned into
/// "pipeline NAME: error: ..." on stderr and exit code 1.
int run_command(const Command& c, const std::vector<std::string>& args);

/// The LibTorch half's file name, and its entry point: runs the command `name` registered there
/// with `argc` arguments (those after the command name). Returns the exit code.
inline constexpr const char* kTorchLibrary = "libpipeline_torch.so";
inline constexpr const char* kTorchEntry = "pipeline_torch_command";
using TorchEntry = int (*)(const char* name, int argc, const char* const* argv);

}  // namespace pipeline::cli

// Registrars are named by __COUNTER__, not __LINE__: a unity batch puts several cmd_*.cpp in one
// translation unit, where two registrations on the same line number would collide.
#define PIPELINE_CLI_CAT2(a, b) a##b
#define PIPELINE_CLI_CAT(a, b) PIPELINE_CLI_CAT2(a, b)
/// Example: PIPELINE_COMMAND({"tokenize", "encode text to GPT-2 ids", "usage...", &tokenize_main});
#define PIPELINE_COMMAND(...) \
  static ::pipeline::cli::CommandRegistrar PIPELINE_CLI_CAT(pipeline_cmd_, __COUNTER__){::pipeline::cli::Command __VA_ARGS__}
/// In the LibTorch half: PIPELINE_COMMAND_IMPL(run, &run_main); summary and usage are the
/// executable's (tools/torch_commands.cpp).
#define PIPELINE_COMMAND_IMPL(name, fn) \
  static ::pipeline::cli::CommandRegistrar PIPELINE_CLI_CAT(pipeline_cmd_, __COUNTER__){::pipeline::cli::Command{#name, "", "", fn}}
