// Fuzzes the config layer: the input is `--set` overrides (one per line) up to the first NUL
// byte, then TOML. Any input either resolves or raises config::ConfigError; the stage graph is
// built from it as `pipeline check` does; a resolved section written back with to_toml()
// resolves to the same values.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "base/config.h"
#include "graph/engine.h"

namespace cfg = pipeline::config;

namespace {

const cfg::Schema& test_schema() {
  static const cfg::Schema s = [] {
    cfg::Schema x("model");
    x.string("preset", "tiny", "preset", {"tiny", "gpt2"})
        .integer("n_layer", 2, "layers", 1, 128)
        .floating("dropout", 0.0, "dropout", 0.0, 1.0)
        .boolean("bias", true, "bias")
        .string("prompt", "\n", "any string")
        .string_list("input", std::vector<std::string>{}, "list");
    return x;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto all = fuzz_util::as_text(data, size);
  std::vector<std::string> overrides;
  std::string toml(all);
  if (auto nul = all.find('\0'); nul != std::string_view::npos) {
    std::string sets(all.substr(0, nul));
    toml = std::string(all.substr(nul + 1));
    std::istringstream lines(sets);
    for (std::string line; std::getline(lines, line);) overrides.push_back(line);
  }
  cfg::Section model;
  try {
    auto doc = cfg::Document::parse(toml, "fuzz.toml", overrides);
    model = doc.resolve("model", test_schema());
    try {
      auto spec = pipeline::graph::GraphSpec::from_config(doc);
      pipeline::graph::validate(spec);
    } catch (const cfg::ConfigError&) {
    }
    doc.check_all_used();
  } catch (const cfg::ConfigError&) {
    if (model.name().empty()) return 0;
  }
  // What we write back reads back to the same values.
  const std::string text = cfg::to_toml({model});
  try {
    auto again = cfg::Document::parse(text, "rewritten.toml").resolve("model", test_schema());
    if (cfg::to_toml({again}) != text) fuzz_util::broken("to_toml round trip changed the values:\n" + text);
  } catch (const cfg::ConfigError& e) {
    fuzz_util::broken(std::string("to_toml wrote what does not read back: ") + e.what() + "\n" + text);
  }
  return 0;
}
