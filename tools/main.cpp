// The `pipeline` command line: `pipeline COMMAND [ARGS]`. Subcommands live in cmd_*.cpp; those that
// need LibTorch are loaded on demand (cli.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"

namespace {

void print_help() {
  auto cmds = pipeline::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::cout << "pipeline " PIPELINE_VERSION " - train GPT-2 style models as a graph of bounded stages\n\n"
               "usage: pipeline COMMAND [ARGS...]\n"
               "       pipeline COMMAND --help\n"
               "       pipeline --version\n\ncommands:\n";
  for (const auto& c : cmds) std::printf("  %-10s %s\n", c.name.c_str(), c.summary.c_str());
}

// A process started with standard input, output or error closed (`pipeline run ... >&-`, some
// service managers) would hand that descriptor number to the next file it opens, and everything
// printed would land in that file (metrics.jsonl). /dev/null takes each closed one first, so
// printing goes nowhere and the run directory's run.log keeps every line.
void fill_closed_std_streams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // The lowest free number: `fd` itself, as the lower ones are open or were filled already.
    open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
  }
}

}  // namespace

int main(int argc, char** argv) {
  fill_closed_std_streams();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    print_help();
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "-V") {
    std::cout << "pipeline " PIPELINE_VERSION "\n";
    return 0;
  }
  for (const auto& c : pipeline::cli::commands()) {
    if (c.name != args[0]) continue;
    return pipeline::cli::run_command(c, std::vector<std::string>(args.begin() + 1, args.end()));
  }
  std::cerr << "pipeline: unknown command '" << args[0] << "' (see pipeline --help)\n";
  return 2;
}
