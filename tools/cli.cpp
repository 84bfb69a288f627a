// The command registry and the call of one command, shared by both halves of `pipeline` (cli.h).
#include "cli.h"

#include <algorithm>
#include <exception>
#include <iostream>

namespace pipeline::cli {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

bool wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; });
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
