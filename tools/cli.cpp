// The command registry and the call of one command, shared by both halves of `pipeline` (cli.h).
#include "cli.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <stdexcept>

namespace pipeline::cli {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

bool wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; });
}

const std::string& option_value(const std::vector<std::string>& args, size_t& i, const std::string& command) {
  if (i + 1 >= args.size())
    throw std::invalid_argument(args[i] + " needs a value (see pipeline " + command + " --help)");
  return args[++i];
}

std::optional<std::string> set_argument(const std::vector<std::string>& args, size_t& i, const std::string& command) {
  std::string arg;
  if (args[i] == "--set")
    arg = option_value(args, i, command);
  else if (args[i].rfind("--set=", 0) == 0)
    arg = args[i].substr(6);
  else
    return std::nullopt;
  if (arg.find('=') == std::string::npos) {
    // `--set training.steps 3`, as torchtitan's `--training.steps 3` is written: the value is the
    // next argument, which would otherwise be taken for a second config file.
    const bool next_is_value = i + 1 < args.size() && !args[i + 1].starts_with("-");
    throw std::invalid_argument("--set " + arg + ": expected section.key=value, with '=' and no space" +
                                (next_is_value ? " (write --set " + arg + "=" + args[i + 1] + ")" : std::string()));
  }
  return arg;
}

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < lo || x > hi)
    throw std::invalid_argument(flag + " " + v + ": expected an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  return x;
}

int run_command(const Command& c, const std::vector<std::string>& args) {
  if (wants_help(args) && !c.usage.empty()) {
    std::cout << c.usage;
    if (c.usage.back() != '\n') std::cout << '\n';
    return 0;
  }
  try {
    return c.run(args);
  } catch (const std::exception& e) {
    std::cerr << "pipeline " << c.name << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace pipeline::cli
