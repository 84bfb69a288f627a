// `pipeline graph CONFIG`: validates the [stages.*] sections of a config and prints the graph
// as Graphviz DOT; with --out FILE it writes FILE and, when `dot` is installed, FILE.svg; with
// --text it draws the graph as text.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "base/atomic_file.h"
#include "base/config.h"
#include "graph/engine.h"

namespace {

constexpr const char* kGraphUsage =
    "pipeline graph CONFIG [--set section.key=value]... [--out FILE.dot | --text]";

int graph_main(const std::vector<std::string>& args) {
  std::string config_name, out;
  std::vector<std::string> overrides;
  bool text = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (auto set = pipeline::cli::set_argument(args, i, "graph"))
      overrides.push_back(*set);
    else if (a == "--out")
      out = pipeline::cli::option_value(args, i, "graph");
    else if (a == "--text")
      text = true;
    else if (a.rfind("--", 0) == 0)
      throw std::invalid_argument("unknown option " + a + " (see pipeline graph --help)");
    else if (config_name.empty())
      config_name = a;
    else
      throw std::invalid_argument("one config file expected, got a second: " + a);
  }
  if (config_name.empty()) throw std::invalid_argument("no config given (" + std::string(kGraphUsage) + ")");
  auto path = pipeline::config::find_config(config_name, PIPELINE_SOURCE_DIR);
  auto doc = pipeline::config::Document::load(path, overrides);
  const auto spec = pipeline::graph::GraphSpec::from_config(doc);
  if (text) {
    if (!out.empty()) throw std::invalid_argument("--text prints the graph; --out writes DOT: give one of them");
    std::cout << pipeline::graph::to_text(spec);
    return 0;
  }
  std::string dot = pipeline::graph::to_dot(spec);
  if (out.empty()) {
    std::cout << dot;
    return 0;
  }
  pipeline::write_file_atomic(out, dot);
  std::cout << "wrote " << out << "\n";
  if (std::system("command -v dot >/dev/null 2>&1") == 0) {
    std::string svg = std::filesystem::path(out).replace_extension(".svg").string();
    std::string cmd = "dot -Tsvg '" + out + "' -o '" + svg + "'";
    if (std::system(cmd.c_str()) == 0) std::cout << "wrote " << svg << "\n";
  } else {
    std::cout << "(install graphviz for an SVG: dot -Tsvg " << out << ")\n";
  }
  return 0;
}

PIPELINE_COMMAND({"graph", "print a pipeline config's stage graph as Graphviz DOT, or as text",
                  std::string("usage: ") + kGraphUsage + "\n"
                  "Validates the [stages.*] sections (types, inputs, port types, cycles, options) and\n"
                  "prints DOT; --out writes it to FILE.dot and renders FILE.svg when `dot` is installed;\n"
                  "--text draws it as text, a stage a line: its type and workers, and each edge's port and\n"
                  "capacity.",
                  &graph_main});

}  // namespace
