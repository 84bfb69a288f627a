// The training stages as a graph sees them: name, doc, ports, options, rules and dry runs
// (stages/dry_run.h: what `pipeline check` opens of them), declared here without their
// implementations (stages/<name>.cpp, which need LibTorch and register with
// PIPELINE_STAGE_IMPL). `pipeline stages`, `check` and `graph` list and validate graphs of these
// types from this file alone, without loading LibTorch; `pipeline run` links both halves.
//
// Ports (payloads in stages/types.h):
//   documents = TextChunk, tokens = TokenChunk, batch = Batch, step = StepResult
#include <string>
#include <vector>

#include "base/config.h"
#include "graph/stage.h"
#include "stages/dry_run.h"

namespace pipeline::stages {
namespace {

// Sources.
PIPELINE_STAGE_DECLARE(read_shards, {.name = "read_shards",
                                     .doc = "reads documents from the text shards of a prepared dataset, from Parquet files, or from a "
                                            "weighted mix of these, resumably",
                                     .input = graph::no_port(),
                                     .output = graph::port("documents"),
                                     .options = config::Schema()
                                                    .string("dataset", "",
                                                            "dataset directory, or Parquet: a file, a directory (a hub snapshot reads "
                                                            "data/), or a glob (empty: [data] dataset)")
                                                    .string("split", "", "split to read (empty: [data] train_split; Parquet has none)")
                                                    .string("column", "text", "Parquet: the text column (string, large_string, string_view or a dictionary of strings)")
                                                    .boolean("shuffle", true,
                                                             "the lanes order: units (shard blocks, row groups) in an order drawn "
                                                             "from the run's seed, a new one each epoch; the documents order: "
                                                             "Parquet's row groups so (false: the files' order)")
                                                    .string_list("mix", std::vector<std::string>{},
                                                                 "datasets (prepared or Parquet) mixed by weight, as [\"PATH=WEIGHT\", "
                                                                 "...]; documents are drawn from source i with probability weight_i / "
                                                                 "sum (empty: no mix)")
                                                    .integer_or_auto("chunk_bytes", std::string("auto"),
                                                                     "text per message, in whole documents (auto: about one batch, "
                                                                     "4 x batch_size x seq_len bytes; in the lanes order about what "
                                                                     "one lane gives a batch, 4 x max(seq_len, batch_size x seq_len / "
                                                                     "this rank's lanes, 16384); within 1 KiB..1 MiB)",
                                                                     1, 1 << 26),
                                     .own_thread = true,  // reads and decompresses files: never on a TBB worker
                                     .max_workers = 1,
                                     .dry_run = &dry_run_read_shards});

PIPELINE_STAGE_DECLARE(read_tokens, {.name = "read_tokens",
                                     .doc = "reads pre-tokenized ids from the token shards of a prepared dataset (replaces read_shards + tokenize)",
                                     .input = graph::no_port(),
                                     .output = graph::port("tokens"),
                                     .options = config::Schema()
                                                    .string("dataset", "", "token dataset directory (empty: [data] dataset)")
                                                    .string("split", "", "split to read (empty: [data] train_split)")
                                                    .boolean("shuffle", true,
                                                             "the lanes order: units (shard blocks, llm.c token ranges) in an "
                                                             "order drawn from the run's seed, a new one each epoch (false: "
                                                             "the files' order); the documents order reads in order")
                                                    .integer("llmc_unit_tokens", 32768,
                                                             "the lanes order: llm.c shards are read in units of this many "
                                                             "tokens (64 KiB at the default); smaller units deal small data "
                                                             "to more lanes",
                                                             1, 1 << 30)
                                                    .integer_or_auto("chunk_tokens", std::string("auto"),
                                                                     "tokens per emitted chunk; auto: one batch, [training] "
                                                                     "batch_size * seq_len (the lanes order: what one lane gives a "
                                                                     "batch, max(seq_len, batch_size x seq_len / this rank's lanes, "
                                                                     "16384))",
                                                                     1, 1 << 26),
                                     .own_thread = true,  // reads and decompresses files: never on a TBB worker
                                     .max_workers = 1,
                                     .dry_run = &dry_run_read_tokens});

PIPELINE_STAGE_DECLARE(synthetic, {.name = "synthetic",
                                   .doc = "random token batches of the configured shape (measures compute without the input side)",
                                   .input = graph::no_port(),
                                   .output = graph::port("batch"),
                                   .options = config::Schema().integer("distinct", 8, "distinct batches cycled through", 1, 1024),
                                   .max_workers = 1});

// The input side.
PIPELINE_STAGE_DECLARE(tokenize, {.name = "tokenize",
                                  .doc = "GPT-2 BPE: a chunk of documents becomes one token chunk, <|endoftext|> before each document",
                                  .input = graph::port("documents"),
                                  .output = graph::port("tokens"),
                                  .options = config::Schema().boolean(
                                      "allow_special", false, "turn the text <|endoftext|> inside documents into the special id")});

PIPELINE_STAGE_DECLARE(pack, {.name = "pack",
                              .doc = "cuts its input into micro-batches of B rows of T+1 uint16 tokens ([training] batch_size, "
                                     "seq_len): the next rows of this rank's lanes, or (the documents order) one window of B*T+1 "
                                     "tokens; written into a pool of host buffers (pinned on CUDA) that h2d copies as is",
                              .input = graph::port("tokens"),
                              .output = graph::port("batch"),
                              .options = config::Schema().integer_or_auto(
                                  "buffers", std::string("auto"),
                                  "host buffers in the pool (pinned on CUDA): batches between pack and the end of their copy "
                                  "to the device (on the CPU: until train has read them). auto: 72, for a queue of 64 after "
                                  "pack (the input side's capacity, and the least an auto capacity may grow to) and the "
                                  "batches the stages after it hold (72 x 32 KiB pinned at 16x1024), and in the lanes order "
                                  "also the batches one round of lane chunks completes at once (chunk tokens / T a lane)",
                                  2, 1024),
                              .ordered = true,
                              .max_workers = 1});

PIPELINE_STAGE_DECLARE(record_batches, {.name = "record_batches",
                                        .doc = "passes batches through and records the input token ids trained on in RUN_DIR/batches[.rankR].u16",
                                        .input = graph::port("batch"),
                                        .output = graph::port("batch"),
                                        .options = config::Schema()
                                                       .string("path", "", "file to record into (empty: RUN_DIR/batches[.rankR].u16)")
                                                       .boolean("last_target", false,
                                                                "end the file with the last batch's last target (one token "
                                                                "more), so it holds every input and target trained on "
                                                                "(tools/parity_train.py replays a run from it)"),
                                        .ordered = true,
                                        .max_workers = 1,
                                        .dry_run = &dry_run_record_batches});

// The device side.
PIPELINE_STAGE_DECLARE(h2d, {.name = "h2d",
                             .doc = "non-blocking copy of each batch's rows to the GPU on a side stream, with an event for "
                                    "train; pinned buffers return to pack's pool when their copy is done (pass-through "
                                    "without CUDA)",
                             .input = graph::port("batch"),
                             .output = graph::port("batch"),
                             .own_thread = true,
                             .max_workers = 1});

PIPELINE_STAGE_DECLARE(train, {.name = "train",
                               .doc = "forward/backward/AdamW step of the GPT-2 model ([model], [training], [optimizer]); bf16 autocast",
                               .input = graph::port("batch"),
                               .output = graph::port("step"),
                               .own_thread = true,
                               .ordered = true,
                               .max_workers = 1,
                               .on_stop = graph::OnStop::discard,
                                     .dry_run = &dry_run_train});

// What train's step results feed.
PIPELINE_STAGE_DECLARE(log, {.name = "log",
                             .doc = "progress line and metrics.jsonl from step results; waits on their events off the train thread",
                             .input = graph::port("step"),
                             .output = graph::no_port(),
                             .own_thread = true,
                             .ordered = true,
                             .max_workers = 1});

PIPELINE_STAGE_DECLARE(eval, {.name = "eval",
                              .doc = "validation loss on fixed batches and a generated sample, every [eval] every steps",
                              .input = graph::port("step"),
                              .output = graph::no_port(),
                              .options = config::Schema().string(
                                  "dataset", "",
                                  "dataset to evaluate on: its [data] val_split, or a held-out Parquet source's first "
                                  "documents; needed when [data] dataset is Parquet (empty: [data] dataset)"),
                              .own_thread = true,
                              .ordered = true,
                              .max_workers = 1,
                                     .dry_run = &dry_run_eval});

PIPELINE_STAGE_DECLARE(checkpoint, {.name = "checkpoint",
                                    .doc = "writes train's snapshots atomically to RUN_DIR/checkpoints, keeping the newest [checkpoint] keep",
                                    .input = graph::port("step"),
                                    .output = graph::no_port(),
                                    .own_thread = true,
                                    .ordered = true,
                                    .max_workers = 1});

}  // namespace
}  // namespace pipeline::stages
