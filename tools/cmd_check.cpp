// `pipeline check CONFIG`: resolves a config as `pipeline run` would and prints every setting,
// without LibTorch: the device is named as the config asks for it ("auto" is resolved at run time).
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "model/checkpoint/checkpoint_file.h"
#include "run_request.h"
#include "runner/run_resolve.h"

namespace pipeline::cli {
namespace {

int check_main(const std::vector<std::string>& args) {
  const stages::RunRequest req = parse_run_request(args, "check");
  const stages::ResolvedRun run = stages::resolve_run(req);
  print_run_header(std::cout, run.config_path, run.cfg.run.device, req.resume, run.model, run.sections());
  if (!req.resume.empty()) {
    if (!std::filesystem::is_directory(req.resume))
      throw std::runtime_error(req.resume.string() + ": no such run directory");
    const auto ckpt = stages::checkpoint_file(req.resume);  // throws when the run has none
    model::CheckpointFileReader reader(ckpt.string());      // the header is checked, not the tensors
    std::cout << "resumes from " << ckpt.string() << " at step " << reader.header().step << "\n";
  } else if (req.resume_auto || run.cfg.run.resume == "auto") {
    if (run.cfg.run.dir.empty())
      throw std::runtime_error(run.config_path.string() + ": --resume auto needs [run] dir: a restarted run finds its "
                               "checkpoints there");
    const auto ckpt = stages::latest_checkpoint(run.cfg.run.dir);
    if (ckpt.empty())
      std::cout << "resume auto: " << run.cfg.run.dir << " holds no checkpoint yet; the run starts there\n";
    else
      std::cout << "resume auto: continues from " << ckpt.string() << "\n";
  }
  std::cout << "ok: " << run.spec.stages.size() << " stages, configuration valid\n";
  return 0;
}

PIPELINE_COMMAND({"check", "validate a config and print every resolved setting",
                  "usage: pipeline check CONFIG [--set section.key=value ...] [--resume RUN_DIR | --resume auto]\n\n"
                  "Resolves the whole configuration as `pipeline run` would (defaults, --set, dataset path,\n"
                  "model preset, the stage graph), prints it as a table, and exits non-zero on any error.",
                  &check_main});

}  // namespace
}  // namespace pipeline::cli
