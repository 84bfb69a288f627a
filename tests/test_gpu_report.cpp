// tools/gpu_report.sh where there is no GPU (here, and in CI): it must stop before building
// anything, exit 2, and name everything it is missing. `all` itself (build step, ctest -L gpu,
// the benchmark, the two pipeline runs, the table), run on the CPU with a tiny model, so that
// the day a GPU is lent the report does not fail on a format it parses (bench_model's result
// line, metrics.jsonl, stats_summary.json, ctest's output) or a command line it builds. And the
// package list it unpacks there: complete for what this build uses.
#include <unistd.h>

#include <filesystem>
#include <string>

#include <doctest/doctest.h>

#include "test_util.h"

namespace fs = std::filesystem;
using test_util::contains;

namespace {

test_util::ShellResult report(const std::string& env, const std::string& args) {
  return test_util::shell(env + " " + PIPELINE_SOURCE_DIR + "/tools/gpu_report.sh " + args);
}

// The environment of a machine without a GPU or CUDA torch, with its files under `root`.
std::string no_gpu_env(const fs::path& root) {
  return "GPU_REPORT_NVIDIA_SMI=/nonexistent/nvidia-smi GPU_REPORT_TORCH_PY=/nonexistent/python3 GPU_REPORT_DEBS=" +
         (root / "debs").string() + " GPU_REPORT_PREFIX=" + (root / "prefix").string() + " GPU_REPORT_OUT=" +
         (root / "out").string();
}

}  // namespace

TEST_CASE("without a GPU, torch or the carried packages, gpu_report names what is missing and builds nothing") {
  auto root = fs::temp_directory_path() / ("pipeline_gpu_report_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "debs");
  const std::string env = no_gpu_env(root) + " PIPELINE_BUILD_DIR=" + (root / "build").string();
  for (const char* mode : {"check", "test", "measure", "all", "profile", "scale"}) {
    CAPTURE(mode);
    auto r = report(env, mode);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(contains(r.out, "cannot run here; missing:"));
    CHECK(contains(r.out, "/nonexistent/nvidia-smi"));
    CHECK(contains(r.out, "/nonexistent/python3"));
    CHECK(contains(r.out, "libtbb-dev"));
    CHECK(contains(r.out, "fetch-debs"));
  }
  CHECK_FALSE(fs::exists(root / "build"));   // stopped before configuring
  CHECK_FALSE(fs::exists(root / "prefix"));  // and before unpacking

  auto bad = report(env, "benchmark");
  CHECK(bad.code == 2);
  CHECK(contains(bad.out, "unknown mode 'benchmark'"));
  fs::remove_all(root);
}

#ifdef PIPELINE_GPU_REPORT_PROGRAMS
TEST_CASE("gpu_report all, on the CPU with a tiny model: the table from real outputs, at most 8 files") {
  // GPU_REPORT_CPU=1: no GPU or package checks and the test build as it is; everything else is
  // what the GPU machine runs: the build step, ctest -L gpu (Skipped here), bench_model, the two
  // pipelines, the table.
  auto root = fs::temp_directory_path() / ("pipeline_gpu_report_all_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string torch_py = PIPELINE_TORCH_PYTHON;
  const std::string env =
      no_gpu_env(root) + " GPU_REPORT_CPU=1 GPU_REPORT_JOBS=1 PIPELINE_BUILD_DIR=" + PIPELINE_BINARY_DIR +
      " GPU_REPORT_STEPS=3 GPU_REPORT_BENCH_MODES=eager "
      "GPU_REPORT_BENCH_ARGS='--preset tiny --batch 2 --seq 32 --steps 2 --warmup 1 --device cpu --dtype fp32' "
      "GPU_REPORT_RUN_ARGS='--set run.device=cpu --set model.preset=tiny --set training.batch_size=2 "
      "--set training.seq_len=32 --set training.dtype=fp32' GPU_REPORT_PYTORCH_MODES=eager"
      // PyTorch's step on the same arguments, where the build has a torch python (the later
      // assignment wins over no_gpu_env's).
      + (torch_py.empty() ? "" : " GPU_REPORT_TORCH_PY=" + torch_py);
  auto r = report(env, "all");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(contains(r.out, "## GPU report: no GPU seen by /nonexistent/nvidia-smi"));
  CHECK(contains(r.out, "ctest -L gpu: "));
  CHECK(contains(r.out, "- test_model_gpu: "));  // each gpu test's result
  CHECK(contains(r.out, "- test_distributed_gpu: "));
  CHECK(contains(r.out, "| bench_model --preset tiny --batch 2 --seq 32"));
  CHECK(contains(r.out, "| eager | "));
  CHECK(contains(r.out, "| cuda_graph | not run |"));
  CHECK(contains(r.out, "| PyTorch torch.compile (tools/eager_step.py) | not run |"));  // not asked for
  if (!torch_py.empty()) {
    // tools/eager_step.py ran on bench_model's arguments, and the table compares the two.
    CHECK_FALSE(contains(r.out, "| PyTorch eager (tools/eager_step.py) | not run |"));
    CHECK(contains(r.out, "| PyTorch eager (tools/eager_step.py) | "));
    CHECK(contains(r.out, "bench_model eager, same machine and call: "));
    CHECK(contains(r.out, "x PyTorch eager's speed"));
  }
  CHECK(contains(r.out, "| gpt2.toml | 3 | "));
  CHECK(contains(r.out, "| gpt2_synthetic.toml | 3 | "));
  CHECK(contains(r.out, "fwd "));  // the per-phase times of the last step (host_ms on the CPU)
  CHECK(contains(r.out, "input-side cost: gpt2 / gpt2_synthetic tokens/s = "));
  CHECK_FALSE(contains(r.out, "= nan"));
  // Everything it leaves for the caller is in GPU_REPORT_OUT, as at most 8 plain files.
  int files = 0;
  for (const auto& e : fs::directory_iterator(root / "out")) {
    CAPTURE(e.path());
    CHECK(e.is_regular_file());
    ++files;
  }
  CHECK(files <= 8);
  CHECK(fs::exists(root / "out" / "gpu_report.md"));
  CHECK(fs::exists(root / "out" / "ctest.log"));
  CHECK(fs::exists(root / "out" / "run_gpt2.log"));

  // table alone prints it again from the files left behind.
  auto again = report(env, "table");
  CHECK(again.code == 0);
  CHECK(contains(again.out, "| gpt2_synthetic.toml | 3 | "));
  fs::remove_all(root);
}
#endif

#ifdef PIPELINE_GPU_REPORT_PROGRAMS
// A CPU row names the loss the CPU ran: the fused kernel where the CPU has AVX2 and FMA, else chunked.
static bool cpu_row(const std::string& out, const std::string& recompute) {
  const std::string row = "| tiny | 2×32 | " + recompute + " | ";
  return contains(out, row + "fused | ") || contains(out, row + "chunked | ");
}

TEST_CASE("gpu_report scale, on the CPU with a tiny model: rows, PyTorch beside them, a failed row recorded, resumable") {
  auto root = fs::temp_directory_path() / ("pipeline_gpu_report_scale_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string torch_py = PIPELINE_TORCH_PYTHON;
  const std::string env =
      no_gpu_env(root) + " GPU_REPORT_CPU=1 GPU_REPORT_JOBS=1 PIPELINE_BUILD_DIR=" + PIPELINE_BINARY_DIR +
      " GPU_REPORT_WORK=" + (root / "work").string() +
      " GPU_REPORT_SCALE_ROWS='nosuch:2 tiny:2 tiny:2:mlp tiny:2:block:fit' GPU_REPORT_SCALE_SEQ=32"
      " GPU_REPORT_SCALE_DTYPE=fp32 GPU_REPORT_SCALE_STEPS=2 GPU_REPORT_SCALE_PYTORCH_MODES=eager" +
      (torch_py.empty() ? "" : " GPU_REPORT_TORCH_PY=" + torch_py);
  auto r = report(env, "scale");
  INFO(r.out);
  CHECK(r.code == 1);  // the row that failed says so in the status, after the table
  CHECK(contains(r.out, "## Scale sweep: no GPU seen by /nonexistent/nvidia-smi"));
  CHECK(contains(r.out, "MFU by the PaLM formula: 6N + 12"));
  CHECK(contains(r.out, "| nosuch | 2×32 | none | | failed: exit status 1: bench_model: "));
  CHECK(cpu_row(r.out, "none"));
  CHECK(cpu_row(r.out, "mlp"));
  CHECK(cpu_row(r.out, "block"));
  CHECK(contains(r.out, " GiB | "));  // peak memory (the resident set on the CPU)
  CHECK(contains(r.out, "\u2014"));     // no MFU on the CPU, never a number
  if (!torch_py.empty()) {
    CHECK_FALSE(contains(r.out, "not run yet | | | | not run yet"));
    CHECK(contains(r.out, "x |"));  // PyTorch eager's ms/step over the pipeline's
  }
  CHECK(fs::exists(root / "out" / "scale.md"));
  // A second call measures only what is missing: here nothing (the failed row stays failed).
  auto again = report(env, "scale");
  CHECK_FALSE(contains(again.out, "scale: bench_model"));
  CHECK(cpu_row(again.out, "mlp"));
  fs::remove_all(root);
}
#endif

// The package list the GPU machine unpacks is complete for the build it builds: every package
// whose files this build used (headers, link inputs, tools, run-time libraries) is listed.
TEST_CASE("tools/gpu_report.debs lists every Debian package this build uses") {
  const fs::path build = PIPELINE_BINARY_DIR;
  if (test_util::shell("command -v dpkg && command -v ninja && test -f " + (build / ".ninja_deps").string()).code != 0) {
    MESSAGE("no dpkg, ninja or ninja build here: nothing to check");
    return;
  }
  auto r = report("PIPELINE_BUILD_DIR=" + build.string(), "packages --check");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "packages the build in"));

  // A list without one of them fails, naming it and a file of it that the build used.
  auto root = fs::temp_directory_path() / ("pipeline_gpu_report_list_" + std::to_string(::getpid()));
  fs::create_directories(root);
  auto cut = test_util::shell("grep -v '^libzstd-dev$' " + std::string(PIPELINE_SOURCE_DIR) + "/tools/gpu_report.debs > " +
                              (root / "list").string());
  REQUIRE(cut.code == 0);
  auto bad = report("GPU_REPORT_REUSE=1 PIPELINE_BUILD_DIR=" + build.string() + " GPU_REPORT_LIST=" + (root / "list").string(),
                    "packages --check");
  INFO(bad.out);
  CHECK(bad.code == 1);
  CHECK(contains(bad.out, "libzstd-dev (e.g. /usr/"));
  fs::remove_all(root);
}
