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
#include "datasets/io/store.h"
#include "datasets/io/url.h"
#include "runner/run_config.h"
#include "runner/run_resolve.h"

namespace pipeline::cli {
namespace {

// The run's remote sources ([data] dataset, a stage's own dataset, mix entries): where each is and
// how it is reached (the endpoint, the region, where the keys come from; never a key), resolved
// without the network; with --probe, each listed through it.
void check_remote(const stages::ResolvedRun& run, bool probe) {
  bool any = false;
  for (const auto& [key, source] : stages::run_sources(run.cfg, run.spec)) {
    if (!datasets::io::is_remote_source(source)) continue;
    any = true;
    auto store = datasets::io::open_store(source, stages::store_options_of(run.cfg, run.spec));
    std::cout << "data: " << key << " = " << datasets::io::redact_urls(source) << ": " << store->describe() << "\n";
    if (!probe) continue;
    const auto files = store->list(source);
    uint64_t bytes = 0;
    for (const auto& f : files) bytes += f.size;
    std::cout << "probe: " << key << ": " << files.size() << " file" << (files.size() == 1 ? "" : "s") << ", " << bytes
              << " bytes; first " << datasets::io::redact_urls(files.front().uri) << "\n";
  }
  if (!any && probe) std::cout << "probe: every source is local; nothing to probe\n";
  if (any && !probe) std::cout << "data: the network is not touched (--probe lists the remote sources)\n";
}

int check_main(const std::vector<std::string>& all_args) {
  bool probe = false;
  std::vector<std::string> args;
  for (const auto& a : all_args) {
    if (a == "--probe")
      probe = true;
    else
      args.push_back(a);
  }
  const stages::RunRequest req = parse_run_request(args, "check");
  const stages::ResolvedRun run = stages::resolve_run(req);
  print_run_header(std::cout, run.config_path, run.cfg.run.device, req.resume, run.model, run.sections());
  check_remote(run, probe);
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
                  "usage: pipeline check CONFIG [--set section.key=value ...] [--resume RUN_DIR | --resume auto] [--probe]\n\n"
                  "Resolves the whole configuration as `pipeline run` would (defaults, --set, dataset path,\n"
                  "model preset, the stage graph), prints it as a table, and exits non-zero on any error.\n"
                  "A remote dataset (s3://, https://) is resolved without the network: where it is and where\n"
                  "its keys come from; --probe also lists it (403, 404, a missing bucket, DNS and TLS errors).",
                  &check_main});

}  // namespace
}  // namespace pipeline::cli
