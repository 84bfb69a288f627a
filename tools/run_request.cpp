// See run_request.h.
#include "run_request.h"

#include <stdexcept>

#include "cli.h"
#include "graph/observe/listen_address.h"
#include "model/device/cpu_advice.h"

namespace pipeline::cli {

stages::RunRequest parse_run_request(const std::vector<std::string>& args, const char* cmd) {
  stages::RunRequest req;
  req.source_dir = PIPELINE_SOURCE_DIR;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& s = args[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (s.size() > flag.size() && s.compare(0, flag.size() + 1, flag + "=") == 0) return s.substr(flag.size() + 1);
      if (i + 1 >= args.size()) throw std::invalid_argument(flag + " needs a value (see pipeline " + cmd + " --help)");
      return args[++i];
    };
    if (auto set = set_argument(args, i, cmd))
      req.overrides.push_back(*set);
    else if (s == "--resume" || s.rfind("--resume=", 0) == 0) {
      // "auto" is the keyword; a run directory of that name is ./auto.
      const std::string v = value("--resume");
      req.resume_auto = v == "auto";
      req.resume = req.resume_auto ? std::filesystem::path() : std::filesystem::path(v);
    }
    else if (std::string(cmd) == "run" && (s == "--serve" || s.rfind("--serve=", 0) == 0)) {
      req.serve = value("--serve");
      try {
        graph::parse_listen_address(req.serve);  // a malformed one stops here, before anything is made
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("--serve: ") + e.what());
      }
    }
    else if (!s.empty() && s[0] == '-')
      throw std::invalid_argument("unknown option " + s + " (see pipeline " + cmd + " --help)");
    else if (req.config.empty())
      req.config = s;
    else
      throw std::invalid_argument("one config file expected, got a second: " + s);
  }
  if (req.resume_auto && req.config.empty())
    throw std::invalid_argument(std::string("--resume auto needs a CONFIG (usage: pipeline ") + cmd +
                                " CONFIG --resume auto): its [run] dir is the run directory it continues");
  if (req.config.empty() && req.resume.empty())
    throw std::invalid_argument(std::string("no config given (usage: pipeline ") + cmd + " CONFIG [--set section.key=value ...])");
  return req;
}

void print_run_header(std::ostream& os, const std::filesystem::path& config_path, const std::string& device,
                      const std::filesystem::path& run_dir, const model::GPTConfig& model,
                      const std::vector<config::Section>& sections, const std::vector<std::string>& removed) {
  os << "pipeline " PIPELINE_VERSION " | config " << config_path.string() << " | device " << device;
  if (!run_dir.empty()) os << " | run dir " << run_dir.string();
  os << "\nmodel: " << model.n_layer << " layers, " << model.n_head << " heads, width " << model.n_embd << ", context "
     << model.block_size << ", vocab " << model.vocab_size << " (padded " << model.padded_vocab_size << "), "
     << model.num_parameters() << " parameters\n";
  config::print_table(os, sections);
  for (const auto& r : removed) os << "removed: [" << r.substr(0, r.size() - 1) << "] (--set " << r << ")\n";
  if (device == "cpu" && model::large_for_cpu(model)) os << model::cpu_warning(model) << "\n";
}

}  // namespace pipeline::cli
