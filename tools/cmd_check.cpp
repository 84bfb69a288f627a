// `pipeline check CONFIG`: a dry run of `pipeline run`, without LibTorch. It resolves the config
// as run does and prints every setting, then makes what run makes before its first step, short
// of the model: the run directory's checks (or the checkpoint a resume continues, against the
// config), and each stage's dry run (stages/dry_run.h: the datasets opened, the validation set
// read, HellaSwag's items checked). The device is named as the config asks for it: "auto" is
// resolved, and what depends on it checked, when a run starts.
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "model/checkpoint/checkpoint_file.h"
#include "run_request.h"
#include "runner/run_resolve.h"
#include "stages/dry_run.h"

namespace pipeline::cli {
namespace {

// The checkpoint a resume continues, held against the config as `run` holds it: the model and the
// seed it was trained with, and the steps left. False when the run has nothing left to train.
bool check_resume(const std::filesystem::path& ckpt, const stages::ResolvedRun& run, const std::filesystem::path& dir) {
  model::CheckpointFileReader reader(ckpt.string());  // the header and metadata are checked, not the tensors
  const int64_t step = static_cast<int64_t>(reader.header().step);
  stages::check_resumable(reader.read_metadata(), run.cfg, run.model, ckpt.string());
  std::cout << "resumes from " << ckpt.string() << " at step " << step << "\n";
  const auto none = stages::nothing_to_train(run.cfg, step, ckpt.string(), dir);
  if (none && none->past) throw std::runtime_error(none->message);
  if (none) std::cout << none->message << "\n";
  return !none;
}

int check_main(const std::vector<std::string>& args) {
  const stages::RunRequest req = parse_run_request(args, "check");
  const stages::ResolvedRun run = stages::resolve_run(req);
  bool resumes = false;
  print_run_header(std::cout, run.config_path, run.cfg.run.device, req.resume, run.model, run.sections(),
                   run.doc.removed());
  if (!req.resume.empty()) {
    if (!std::filesystem::is_directory(req.resume))
      throw std::runtime_error(req.resume.string() + ": no such run directory");
    if (!check_resume(stages::checkpoint_file(req.resume), run, req.resume)) return 0;  // (throws when it has none)
    resumes = true;
  } else if (req.resume_auto || run.cfg.run.resume == "auto") {
    if (run.cfg.run.dir.empty())
      throw std::runtime_error(run.config_path.string() + ": --resume auto needs [run] dir: a restarted run finds its "
                               "checkpoints there");
    const auto ckpt = stages::latest_checkpoint(run.cfg.run.dir);
    if (ckpt.empty()) {
      std::cout << "resume auto: " << run.cfg.run.dir << " holds no checkpoint yet; the run starts there\n";
      stages::check_new_run_dir(run.cfg.run.dir, false, /*probe=*/true);
    } else {
      std::cout << "resume auto: continues from " << ckpt.string() << "\n";
      if (!check_resume(ckpt, run, run.cfg.run.dir)) return 0;
      resumes = true;
    }
  } else {
    const bool default_place = run.cfg.run.dir.empty();
    stages::check_new_run_dir(default_place ? std::filesystem::path("runs") / (run.cfg.run.name + "-TIMESTAMP")
                                            : std::filesystem::path(run.cfg.run.dir),
                              default_place, /*probe=*/true);
  }
  // What building the stages opens and checks (a fresh start's data position: a resumed run's
  // comes from its checkpoint's tensors, which check does not read).
  graph::dry_run(run.spec, std::make_shared<const stages::RunPreview>(stages::RunPreview{run.cfg, run.model, resumes}));
  std::cout << "ok: " << run.spec.stages.size() << " stages, configuration valid (a dry run: the datasets opened, "
            << "the stages checked as `pipeline run` builds them)\n";
  return 0;
}

PIPELINE_COMMAND({"check", "validate a config and print every resolved setting (a dry run of `run`)",
                  "usage: pipeline check CONFIG [--set section.key=value ...] [--resume RUN_DIR | --resume auto]\n\n"
                  "Resolves the whole configuration as `pipeline run` would (defaults, --set, dataset path,\n"
                  "model preset, the stage graph), prints it as a table, then makes what `run` makes before\n"
                  "its first step, short of the model: the run directory's checks, the checkpoint a resume\n"
                  "continues (its model, seed and step against the config), and each stage's dry run (the\n"
                  "datasets opened, the validation split read, HellaSwag's items checked). Exits 0 when a\n"
                  "run would start (or, resuming a run that is complete, when it would have nothing to do),\n"
                  "non-zero on any error.",
                  &check_main});

}  // namespace
}  // namespace pipeline::cli
