// `pipeline stages`: every registered stage type (graph/'s built-ins and the training stages
// declared in stages/catalog.cpp), with its ports, threading rules and documented options.
#include <cstdio>
#include <iostream>
#include <string>
#include <typeindex>
#include <vector>

#include "base/short_number.h"
#include "cli.h"
#include "graph/stage.h"

namespace {

// Ports connect by name. The C++ type behind a name is shown when this program links the stage's
// code; the training stages are only declared here (stages/catalog.cpp), their payloads are in
// stages/types.h.
std::string port_text(const pipeline::graph::PortType& p, const char* none) {
  if (p.none()) return none;
  if (p.any()) return "any (passes its input type through)";
  if (p.type == std::type_index(typeid(void))) return p.name;
  return p.name + " (" + pipeline::graph::type_name_of(p.type) + ")";
}

void print_options(const pipeline::config::Schema& schema, const std::string& indent) {
  for (const auto& o : schema.options()) {
    std::string def = o.default_value ? pipeline::config::value_to_string(*o.default_value) : "required";
    std::cout << indent << o.key << " (" << pipeline::config::value_type_name(o.type) << ", default " << def;
    if (o.min || o.max) {
      std::cout << ", range [" << (o.min ? pipeline::short_number(*o.min) : std::string("-inf")) << ", "
                << (o.max ? pipeline::short_number(*o.max) : std::string("inf")) << "]";
    }
    if (!o.choices.empty()) {
      std::cout << ", one of";
      for (const auto& c : o.choices) std::cout << " " << c;
    }
    std::cout << "): " << o.doc << "\n";
  }
}

int stages_main(const std::vector<std::string>& args) {
  bool brief = !args.empty() && args[0] == "--brief";
  auto types = pipeline::graph::stage_types();
  if (brief) {
    for (const auto* t : types) std::cout << t->name << "\n";
    return 0;
  }
  std::cout << "Every [stages.NAME] section accepts:\n";
  print_options(pipeline::graph::common_stage_schema(), "  ");
  std::cout << "\n" << types.size() << " stage types:\n";
  for (const auto* t : types) {
    std::cout << "\n" << t->name << ": " << t->doc << "\n";
    std::cout << "  input:  " << port_text(t->input, "none (a source)") << "\n";
    std::cout << "  output: " << port_text(t->output, "none (a sink)") << "\n";
    std::string rules;
    if (t->own_thread) rules += " runs on its own thread;";
    if (t->ordered) rules += " needs ordered input;";
    if (t->max_workers > 0) rules += " workers <= " + std::to_string(t->max_workers) + ";";
    if (t->on_stop == pipeline::graph::OnStop::discard) rules += " discards queued items on stop;";
    if (!rules.empty()) std::cout << "  rules: " << rules.substr(1) << "\n";
    if (t->options.options().empty())
      std::cout << "  options: none\n";
    else {
      std::cout << "  options:\n";
      print_options(t->options, "    ");
    }
  }
  return 0;
}

PIPELINE_COMMAND({"stages", "list the registered stage types, their ports and options",
                  "usage: pipeline stages [--brief]\n"
                  "Lists every stage type usable as `type = \"...\"` in a [stages.NAME] section:\n"
                  "its input and output port types, threading rules and options with defaults.\n"
                  "--brief prints only the names.",
                  &stages_main});

}  // namespace
