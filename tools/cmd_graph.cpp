// `pipeline graph CONFIG`: validates the [stages.*] sections of a config and prints the graph
// as Graphviz DOT; with --out FILE it writes FILE and, when `dot` is installed, FILE.svg.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "base/atomic_file.h"
#include "base/config.h"
#include "graph/engine.h"

namespace {

int graph_main(const std::vector<std::string>& args) {
  std::string config_name, out;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "--set" || a == "--out") && i + 1 >= args.size()) {
      std::cerr << "pipeline graph: " << a << " needs a value\n";
      return 2;
    }
    if (a == "--set")
      overrides.push_back(args[++i]);
    else if (a.rfind("--set=", 0) == 0)
      overrides.push_back(a.substr(6));
    else if (a == "--out")
      out = args[++i];
    else if (a.rfind("--", 0) == 0) {
      std::cerr << "pipeline graph: unknown option " << a << "\n";
      return 2;
    } else if (config_name.empty())
      config_name = a;
    else {
      std::cerr << "pipeline graph: unexpected argument " << a << "\n";
      return 2;
    }
  }
  if (config_name.empty()) {
    std::cerr << "usage: pipeline graph CONFIG [--set section.key=value]... [--out FILE.dot]\n";
    return 2;
  }
  auto path = pipeline::config::find_config(config_name, PIPELINE_SOURCE_DIR);
  auto doc = pipeline::config::Document::load(path, overrides);
  std::string dot = pipeline::graph::to_dot(pipeline::graph::GraphSpec::from_config(doc));
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

PIPELINE_COMMAND({"graph", "print a pipeline config's stage graph as Graphviz DOT",
                  "usage: pipeline graph CONFIG [--set section.key=value]... [--out FILE.dot]\n"
                  "Validates the [stages.*] sections (types, inputs, port types, cycles, options) and\n"
                  "prints DOT; --out writes it to FILE.dot and renders FILE.svg when `dot` is installed.",
                  &graph_main});

}  // namespace
