// `pipeline check CONFIG`: a dry run of `pipeline run`, without LibTorch. It resolves the config
// as run does and prints every setting, then makes what run makes before its first step, short
// of the model: the run directory's checks (or the checkpoint a resume continues, against the
// config), the data order (runner/lane_setup.h: in the lanes order K against the step's rows of
// one process, or a resume's order and K from its checkpoint), and each stage's dry run
// (stages/dry_run.h: the datasets opened in that order, the validation set read, HellaSwag's
// items checked). The device is named as the config asks for it: "auto" is resolved, and what
// depends on it checked, when a run starts; so are the ranks a run has under torchrun.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "model/checkpoint/checkpoint_file.h"
#include "run_request.h"
#include "runner/lane_setup.h"
#include "runner/run_resolve.h"
#include "stages/dry_run.h"

namespace pipeline::cli {
namespace {

// The checkpoint a resume continues, held against the config as `run` holds it: the model and the
// seed it was trained with, the steps left, and the data order it was written in, which becomes
// `cfg`'s (the rows of its steps are checked when a run knows its ranks). False when the run has
// nothing left to train.
bool check_resume(const std::filesystem::path& ckpt, const stages::ResolvedRun& run, const stages::RunRequest& req,
                  stages::RunConfig& cfg, const std::filesystem::path& dir) {
  model::CheckpointFileReader reader(ckpt.string());  // the header and metadata are checked, not the tensors
  const int64_t step = static_cast<int64_t>(reader.header().step);
  const std::string metadata = reader.read_metadata();
  stages::check_resumable(metadata, run.cfg, run.model, ckpt.string());
  stages::apply_checkpoint_order(stages::checkpoint_order(metadata, ckpt.string()), req, cfg, std::nullopt,
                                 ckpt.string());
  std::cout << "resumes from " << ckpt.string() << " at step " << step << "\n";
  const auto none = stages::nothing_to_train(run.cfg, step, ckpt.string(), dir);
  if (none && none->past) throw std::runtime_error(none->message);
  if (none) std::cout << none->message << "\n";
  return !none;
}

int check_main(const std::vector<std::string>& args) {
  const stages::RunRequest req = parse_run_request(args, "check");
  const stages::ResolvedRun run = stages::resolve_run(req);
  stages::RunConfig cfg = run.cfg;  // a resume's data order from its checkpoint
  bool resumes = false;
  print_run_header(std::cout, run.config_path, run.cfg.run.device, req.resume, run.model, run.sections(),
                   run.doc.removed());
  if (!req.resume.empty()) {
    if (!std::filesystem::is_directory(req.resume))
      throw std::runtime_error(req.resume.string() + ": no such run directory");
    if (!check_resume(stages::checkpoint_file(req.resume), run, req, cfg, req.resume)) return 0;  // (throws when it has none)
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
      if (!check_resume(ckpt, run, req, cfg, run.cfg.run.dir)) return 0;
      resumes = true;
    }
  } else {
    const bool default_place = run.cfg.run.dir.empty();
    stages::check_new_run_dir(default_place ? std::filesystem::path("runs") / (run.cfg.run.name + "-TIMESTAMP")
                                            : std::filesystem::path(run.cfg.run.dir),
                              default_place, /*probe=*/true);
  }
  // The lanes order's K: a resume's from its checkpoint; a fresh run's settled as run settles it,
  // here for one process (under torchrun, the ranks are checked against K when the run starts).
  uint32_t lanes = 0;
  if (cfg.data.order == "lanes")
    lanes = resumes ? static_cast<uint32_t>(cfg.data.lanes) : stages::lane_session(cfg, 0, 1, {})->lanes;
  // What building the stages opens and checks (a fresh start's data position: a resumed run's
  // comes from its checkpoint's tensors, which check does not read).
  graph::dry_run(run.spec,
                 std::make_shared<const stages::RunPreview>(stages::RunPreview{cfg, run.model, resumes, lanes}));
  std::cout << "ok: " << run.spec.stages.size() << " stages, configuration valid (a dry run: the datasets opened, "
            << "the stages checked as `pipeline run` builds them)\n";
  return 0;
}

PIPELINE_COMMAND({"check", "validate a config and print every resolved setting (a dry run of `run`)",
                  "usage: pipeline check CONFIG [--set section.key=value ...] [--resume RUN_DIR | --resume auto]\n\n"
                  "Resolves the whole configuration as `pipeline run` would (defaults, --set, dataset path,\n"
                  "model preset, the stage graph), prints it as a table, then makes what `run` makes before\n"
                  "its first step, short of the model: the run directory's checks, the checkpoint a resume\n"
                  "continues (its model, seed, step and data order against the config), the lanes order's K\n"
                  "against the step's rows (of one process), and each stage's dry run (the datasets opened in\n"
                  "the run's data order, the validation split read, HellaSwag's items checked). Exits 0 when a\n"
                  "run would start (or, resuming a run that is complete, when it would have nothing to do),\n"
                  "non-zero on any error.",
                  &check_main});

}  // namespace
}  // namespace pipeline::cli
