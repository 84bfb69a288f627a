// The commands that need tensors, as the executable describes them: `pipeline --help` and
// `pipeline run --help` answer without LibTorch. Calling one loads the LibTorch half,
// libpipeline_torch.so from the executable's directory, and hands it the arguments
// (tools/torch_entry.cpp); its commands are tools/cmd_{run,generate,export,eval}.cpp.
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/module.h"
#include "cli.h"

namespace pipeline::cli {
namespace {

namespace fs = std::filesystem;

// Loaded once; never unloaded (LibTorch does not support it, and the process ends soon after).
TorchEntry torch_entry() {
  std::string error;
  const fs::path dir = executable_dir(error);
  if (dir.empty()) throw std::runtime_error(error);
  const fs::path lib = dir / kTorchLibrary;
  void* entry = load_module_entry(lib, kTorchEntry, error);
  if (!entry)
    throw std::runtime_error("this command needs the LibTorch half of pipeline, which did not load: " + error +
                             " (it is built beside the executable: cmake --build BUILD --target pipeline)");
  return reinterpret_cast<TorchEntry>(entry);
}

std::function<int(const std::vector<std::string>&)> in_torch_half(const char* name) {
  return [name](const std::vector<std::string>& args) {
    const TorchEntry entry = torch_entry();
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return entry(name, static_cast<int>(argv.size()), argv.data());
  };
}

PIPELINE_COMMAND({"run", "train as the config's graph of stages says",
                  "usage: pipeline run CONFIG [--set section.key=value ...] [--resume RUN_DIR | --resume auto]\n"
                  "                    [--serve [ADDR:]PORT]\n"
                  "       pipeline run --resume RUN_DIR\n\n"
                  "CONFIG is a TOML file, or a bare name looked up in pipelines/ (gpt2.toml, quickstart.toml).\n"
                  "--set overrides any key with the same names and checks as the file, e.g.\n"
                  "  pipeline run gpt2.toml --set training.steps=200 --set stages.tokenize.workers=4\n"
                  "and --set TABLE= (nothing after '=') removes a table: --set stages.tokenize= takes a stage out.\n"
                  "--resume continues a run from the newest checkpoint in RUN_DIR exactly where it stopped. A run\n"
                  "at its [training] steps already trains nothing: complete, it exits 0; past them (a smaller\n"
                  "--set training.steps), it is an error, exit status 1.\n"
                  "--resume auto (or [run] resume = \"auto\") continues the run in [run] dir when it holds a complete\n"
                  "checkpoint and starts it otherwise: the same command again after a crash, or under torchrun\n"
                  "--max-restarts, picks up where the run stopped; every rank resumes from the same checkpoint.\n"
                  "--serve PORT serves the live page of the stage graph at http://127.0.0.1:PORT/ and Prometheus\n"
                  "metrics at /metrics while the run trains ([logging] http in the config does the same); PORT 0\n"
                  "picks a free port. ADDR:PORT listens elsewhere than 127.0.0.1 (read-only, no authentication).\n"
                  "Ctrl-C, SIGTERM, SIGHUP, SIGQUIT, SIGUSR2 or SIGXCPU finishes the current step, writes a\n"
                  "checkpoint and exits with 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM); a second\n"
                  "signal, 2 s or more after the first, exits at once. SIGUSR1 writes a checkpoint at the next step\n"
                  "and trains on. A closed pipe or terminal stops the printing, never the run.\n"
                  "Under torchrun (torchrun --no-python --nproc-per-node=N build/tools/pipeline run CONFIG), each\n"
                  "process is one data-parallel rank: see the README's \"Many GPUs and machines\".\n"
                  "The run directory holds config.toml, run.log (every line printed), metrics.jsonl, stats.jsonl,\n"
                  "stats_summary.json, trace.json (open in ui.perfetto.dev) and checkpoints/.",
                  in_torch_half("run")});

PIPELINE_COMMAND({"generate", "print a continuation of a prompt from a checkpoint",
                  "usage: pipeline generate [--checkpoint] PATH [--prompt TEXT] [--tokens N] [--temperature T]\n"
                  "                                    [--top-k K] [--seed S]\n\n"
                  "PATH is a .ckpt file, a run directory (its newest checkpoint) or a Hugging Face GPT-2\n"
                  "directory (config.json + model.safetensors). Defaults: 200 tokens,\n"
                  "temperature 0.8 (0: greedy), top-k 40 (0: whole vocabulary), seed 1337.\n"
                  "Example: pipeline generate --checkpoint runs/quickstart-20261122-120000 --prompt 'ROMEO:'",
                  in_torch_half("generate")});

const char* kExportUsage = R"(usage: pipeline export [--checkpoint] CHECKPOINT --out DIR [--dtype fp32|fp16|bf16] [--no-tokenizer]

Writes the model of a training checkpoint as a Hugging Face transformers GPT-2 directory:
  model.safetensors        weights under GPT2LMHeadModel's names (Conv1D layout, vocabulary
                           un-padded, lm_head tied to the token embedding)
  config.json, generation_config.json
  vocab.json, merges.txt, tokenizer.json, tokenizer_config.json   (the GPT-2 tokenizer)
Each file is written to a temporary name and renamed, so DIR never holds a half-written file.

CHECKPOINT is a .ckpt file or a run directory (its newest checkpoint).
  --out DIR         output directory (created; existing files of these names are replaced)
  --dtype D         storage dtype of the weights: fp32 (default, exact), fp16 or bf16
  --no-tokenizer    write the model files only

Then, in Python:
  from transformers import GPT2LMHeadModel, AutoTokenizer
  model = GPT2LMHeadModel.from_pretrained("DIR"); tok = AutoTokenizer.from_pretrained("DIR")
and `[model] init_from = "DIR"` fine-tunes from it here.
)";

PIPELINE_COMMAND({"export", "write a checkpoint as a Hugging Face transformers GPT-2 directory", kExportUsage, in_torch_half("export")});

const char* kEvalUsage = R"(usage: pipeline eval MODEL --hellaswag FILE [--items N] [--predictions OUT]
       pipeline eval MODEL --val DATASET [--split S] [--seq-len T] [--batch-size B]
       (both at once, too; and [--dtype fp32|bf16] [--device auto|cpu|cuda] [--threads N])

MODEL is a .ckpt file, a run directory (its newest checkpoint) or a Hugging Face GPT-2 directory
(config.json + model.safetensors: from `pipeline export`, save_pretrained or the Hub).

--hellaswag FILE   HellaSwag accuracy on FILE, the official hellaswag_val.jsonl (one object per
                   line with ctx, endings and label), scored as GPT-2 reproductions score it
                   (build-nanogpt, llm.c): each ending tokenized with a leading space after the
                   context; acc_norm picks the ending with the lowest mean cross-entropy, acc the
                   lowest sum; a sequence longer than the model's context loses its first tokens,
                   never the ending's. Prints one line:
                     hellaswag acc_norm A acc B n N
  --items N        the first N items only (0: all)
  --predictions OUT  writes acc_norm's predicted ending (0-3) of each item, one a line, in file order
--val DATASET      the validation loss over every whole window of the split (a prepared dataset,
                   llm.c shards, or a held-out Parquet source), tokenized as training does. Prints:
                     val loss L tokens N
  --split S        the split (default val)
  --seq-len T      tokens per window (default: the model's context)
  --batch-size B   windows per forward pass (default 8)
--dtype D          fp32 (default) or bf16 (autocast)
--device D         auto (default: CUDA when present), cpu or cuda
--threads N        torch threads on the CPU (default: torch's, one per core)
Timings go to stderr. See docs/eval.md.

Examples:
  pipeline eval runs/gpt2-20261122-120000 --hellaswag hellaswag_val.jsonl
  pipeline eval gpt2-hf --hellaswag hellaswag_val.jsonl --items 1000 --predictions preds.txt
  pipeline eval runs/quickstart-20261122-120000 --val datasets/data/tinyshakespeare/text
)";

PIPELINE_COMMAND({"eval", "HellaSwag accuracy and the validation loss of a checkpoint or a Hugging Face model", kEvalUsage,
                  in_torch_half("eval")});

}  // namespace
}  // namespace pipeline::cli
