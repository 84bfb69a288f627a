// Schemas and resolution of the run sections of a pipeline TOML (see run_config.h).
#include "runner/run_config.h"

#include "graph/observe/listen_address.h"

#include "datasets/dataset_error.h"
#include "datasets/io/store.h"
#include "datasets/io/url.h"
#include "datasets/llmc/llmc_shard.h"
#include "datasets/parquet/parquet_reader.h"
#include "datasets/sources/dataset_mix.h"
#include "model/net/schedule.h"

namespace pipeline::stages {

namespace fs = std::filesystem;

const std::vector<config::Schema>& run_schemas() {
  static const std::vector<config::Schema> schemas = [] {
    std::vector<config::Schema> s;
    s.emplace_back("run");
    s.back()
        .string("name", "run", "run directory name prefix: runs/<name>-<timestamp>")
        .string("dir", "", "explicit run directory (empty: runs/<name>-<timestamp> under the working directory)")
        .string("resume", "never",
                "auto: continue the run in `dir` from its newest complete checkpoint when it has one, else start it "
                "(what a restart by torchrun --max-restarts needs; the same as --resume auto); never: refuse a `dir` "
                "that holds checkpoints",
                {"never", "auto"})
        .integer("seed", 1337, "seed for weights, data order and sampling", 0, 9.2e18)
        .string("device", "auto", "where to train: auto (CUDA when present), cpu or cuda", {"auto", "cpu", "cuda"})
        .integer("threads", 0, "torch intra-op threads on CPU (0: torch's default)", 0, 1024)
        .boolean("autotune", false,
                 "move every CPU stage's workers and every edge's capacity toward the bottleneck while the run goes "
                 "(stages and edges set to \"auto\" are tuned anyway)")
        .string("backend", "auto",
                "data parallel under torchrun: collectives on nccl (CUDA) or gloo (CPU); auto: nccl on CUDA, else gloo",
                {"auto", "nccl", "gloo"})
        .floating("dist_timeout_s", 600, "data parallel: how long a rank waits for the others (start-up, collectives)",
                  1, 1e6)
        .floating("dist_heartbeat_s", 60, "data parallel: a rank whose heartbeat stops this long is reported as gone",
                  1, 1e6)
        .floating("dist_bucket_mb", 25, "data parallel: size of the gradient buckets all-reduced during backward",
                  0.001, 1e5)
        .integer("master_port", 0,
                 "data parallel under srun without torchrun: the port rank 0 hosts the store on (0: MASTER_PORT when "
                 "exported, else 15000 + the Slurm job id's last four digits)",
                 0, 65535);
    s.emplace_back("model");
    s.back()
        .string("preset", "gpt2", "model size: gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a small CPU preset")
        .integer("n_layer", 0, "transformer blocks (0: the preset's)", 0, 1024)
        .integer("n_head", 0, "attention heads (0: the preset's)", 0, 1024)
        .integer("n_embd", 0, "model width (0: the preset's)", 0, 65536)
        .integer("block_size", 0, "longest context the model supports (0: the preset's)", 0, 1 << 20)
        .integer("vocab_size", 50257, "vocabulary size; the embedding is padded up to a multiple of 64", 1, 1 << 24)
        .floating("dropout", 0.0, "dropout probability", 0.0, 1.0)
        .boolean("bias", true, "biases in linear layers and LayerNorms")
        .string("init_from", "",
                "a Hugging Face GPT-2 directory (config.json + model.safetensors, e.g. from `pipeline export` or "
                "transformers' save_pretrained) whose shape and weights the run starts from; its config.json replaces "
                "preset and vocab_size, and block_size may crop its context (empty: fresh weights)");
    s.emplace_back("data");
    s.back()
        .string("dataset", std::nullopt,
                "prepared dataset directory (with manifest.json, from `pipeline prepare`), a directory of llm.c / "
                "modded-nanogpt token shards (*_train_*.bin, *_val_*.bin), or Parquet: a *.parquet file, a directory "
                "of them (a Hugging Face snapshot reads data/), or a glob")
        .string("endpoint", "",
                "S3: an S3-compatible server, scheme://host[:port] (MinIO, R2, rclone), addressed path-style "
                "(\"\": AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS)")
        .string("region", "", "S3: the bucket's region (\"\": AWS_REGION, the profile's, else us-east-1)")
        .string("profile", "",
                "S3: the profile in ~/.aws/credentials and ~/.aws/config whose keys, region and endpoint to use "
                "(\"\": AWS_PROFILE, else the environment's keys, else \"default\"); keys never go in this file")
        .boolean("allow_http", false, "read http:// sources and S3 endpoints (no TLS: data and tokens in clear)")
        .string("cache_dir", "",
                "where remote units are cached while the run reads them, shared by the runs of this machine "
                "(\"\": $XDG_CACHE_HOME/pipeline/data, else ~/.cache/pipeline/data); its cap is [stages.fetch] "
                "cache_bytes")
        .string("train_split", "train", "split used for training")
        .string("val_split", "val", "split used for evaluation")
        .boolean("loop", true, "start the next epoch at the end of the data instead of stopping")
        .string("order", "lanes",
                "the data order: lanes (the rows of every step are the same whatever the number of ranks, "
                "B or grad_accum, as long as the step's rows are; docs/data_order.md) or documents (rank r of W "
                "reads documents d with d % W == r, in windows of B*T+1 tokens: the order before lanes, which a "
                "resumed run written before them keeps)",
                {"lanes", "documents"})
        .integer_or_auto("lanes", std::string("auto"),
                         "lanes order: K, the number of lanes, fixed when a run starts and kept by its checkpoints; "
                         "any number of ranks that divides K resumes it (auto: docs/data_order.md says the rule)",
                         1, 1 << 20);
    s.emplace_back("training");
    s.back()
        .integer("steps", 1000, "optimizer steps", 1, 1e12)
        .integer("batch_size", 8, "B: sequences per micro-batch", 1, 1 << 20)
        .integer("seq_len", 1024, "T: tokens per sequence", 1, 1 << 20)
        .integer("grad_accum", 1, "micro-batches per optimizer step (global batch = B*T*grad_accum tokens)", 1, 1 << 20)
        .floating("grad_clip", 1.0, "clip the global gradient norm to this (0: off)", 0.0, 1e9)
        .string("dtype", "bf16", "autocast dtype of the forward pass; weights stay fp32", {"bf16", "fp32"})
        .string("matmul_precision", "high",
                "fp32 matmuls on CUDA: high (TF32 tensor cores), highest (full fp32) or medium (bf16); the CPU "
                "always computes in full fp32",
                {"high", "highest", "medium"})
        .boolean("cuda_graph", false,
                 "capture forward+backward and clip+AdamW as CUDA graphs after 3 eager steps and replay them "
                 "(needs CUDA; measure with bench_model --cuda-graph before turning it on)")
        .string("recompute", "none",
                "activation memory traded for compute in backward: none; mlp (the LayerNorms' and GELU's outputs "
                "are computed again, as llm.c does: no matmul more); block (only each block's input is kept and "
                "its forward runs again in backward, as torch.utils.checkpoint: about a third more compute)",
                {"none", "mlp", "block"});
    s.emplace_back("training.guard");
    s.back()
        .boolean("enabled", false,
                 "off by default (a run that is not healthy, or a warm-up's first steps, can look like a spike: "
                 "turn it on with thresholds measured on your run); skip a step whose loss or gradient norm is not finite or lies more than z deviations above its "
                 "running mean (no update, the data consumed; the schedule counts updates), and roll back to the "
                 "last checkpoint after max_skips skips in a row (docs/robustness.md)")
        .integer("window", 100, "steps let through whose loss and gradient norm make the running mean and deviation",
                 2, 100000)
        .floating("z", 10.0, "deviations above the mean that skip a step", 0.1, 1e6)
        .integer("min_steps", 50, "z-scores count once the window holds this many steps (a value that is not finite "
                                  "is skipped from the first step)",
                  2, 100000)
        .integer("max_skips", 5, "skips in a row that roll the run back to its newest checkpoint from before them", 1,
                 1e9)
        .integer("rollback_skip", 50,
                 "data steps a rollback skips, counted from the checkpoint it goes back to (the steps since that "
                 "checkpoint are skipped in any case: they are not trained again)",
                 0, 1e12)
        .integer("max_rollbacks", 3, "rollbacks before the run stops, with a checkpoint and the steps named", 0, 1e9)
        .string_list("skip_steps", std::vector<std::string>{},
                     "data steps read but not trained on, as [\"N\", \"FROM-TO\"] (1-based, as metrics.jsonl "
                     "numbers them; also with enabled = false): skipping a spike's data by hand");
    s.emplace_back("optimizer");
    s.back()
        .floating("lr", 6e-4, "peak learning rate (AdamW)", 0.0, 10.0)
        .floating("min_lr", 6e-5, "learning rate at the end of the cosine decay", 0.0, 10.0)
        .floating("beta1", 0.9, "AdamW beta1", 0.0, 1.0)
        .floating("beta2", 0.95, "AdamW beta2", 0.0, 1.0)
        .floating("eps", 1e-8, "AdamW epsilon", 0.0, 1.0)
        .floating("weight_decay", 0.1, "decoupled weight decay, applied to matrices only", 0.0, 10.0)
        .integer("warmup_steps", 100, "linear warmup steps before the cosine decay", 0, 1e12)
        .boolean("fused", true, "use the fused AdamW kernel (no host sync on CUDA)");
    s.emplace_back("eval");
    s.back()
        .integer("every", 0, "steps between evaluations (0: off)", 0, 1e12)
        .integer("batches", 8, "validation batches per evaluation (the same fixed set each time)", 1, 1e6)
        .integer("sample_tokens", 48, "tokens generated from the prompt at each evaluation (0: none)", 0, 1e6)
        .string("prompt", "\n", "prompt of the generated sample")
        .floating("temperature", 0.8, "sampling temperature", 0.0, 100.0)
        .integer("top_k", 40, "sample among the k most likely tokens (0: all)", 0, 1 << 24)
        .string("hellaswag", "",
                "HellaSwag accuracy at evaluations: the official hellaswag_val.jsonl (ctx, endings, label), "
                "scored on eval's thread as build-nanogpt and llm.c score it (\"\": none; docs/eval.md)")
        .integer("hellaswag_every", 0, "steps between HellaSwag scores (0: with every evaluation)", 0, 1e12)
        .integer("hellaswag_items", 0, "HellaSwag items scored each time, the file's first (0: all)", 0, 1e9);
    s.emplace_back("checkpoint");
    s.back()
        .integer("every", 0, "steps between checkpoints (0: none during the run)", 0, 1e12)
        .integer("keep", 2, "newest checkpoints kept in the run directory", 1, 1e6)
        .boolean("at_end", true, "write a checkpoint when the run ends or is interrupted")
        .string("on_error", "stop",
                "when a checkpoint cannot be written (disk full, read-only directory): stop (the run ends "
                "with the resume command) or warn (log it and train on)",
                {"stop", "warn"});
    s.emplace_back("logging");
    s.back()
        .integer("every", 10, "steps between progress lines", 1, 1e12)
        .string("live", "auto", "live stage view: auto (screen on a terminal, lines otherwise), tty, line, off",
                {"auto", "tty", "line", "off"})
        .integer("stats_interval_ms", 50, "queue occupancy sampling period", 1, 60000)
        .boolean("trace", true, "write a Chrome trace (trace.json) of stage activity")
        .floating("peak_tflops", 0.0,
                  "device peak (dense bf16 TFLOP/s) MFU divides by; 0: the GPU's from the built-in table (A100, "
                  "H100, H200, L4, L40S, A10, RTX 4090, T4, ...), and no MFU where it has none",
                  0.0, 1e6)
        .boolean("tensorboard", false,
                 "write TensorBoard event files into the run directory (loss, val loss, lr, grad norm, tokens/s, MFU, "
                 "each stage's busy share and each queue's occupancy): tensorboard --logdir runs/")
        .string("http", "",
                "serve the live page of the stage graph and Prometheus /metrics while the run trains: PORT (on "
                "127.0.0.1), or ADDRESS:PORT to be reachable from elsewhere (read-only, no authentication); "
                "\"\" = off. `pipeline run --serve PORT` does the same for one run");
    return s;
  }();
  return schemas;
}

std::optional<StepRange> parse_step_range(const std::string& text) {
  auto number = [](const std::string& t, int64_t& out) {
    if (t.empty() || t.size() > 18 || t.find_first_not_of("0123456789") != std::string::npos) return false;
    out = std::stoll(t);
    return out >= 1;
  };
  StepRange r;
  const auto dash = text.find('-');
  if (dash == std::string::npos) {
    if (!number(text, r.first)) return std::nullopt;
    r.last = r.first;
  } else if (!number(text.substr(0, dash), r.first) || !number(text.substr(dash + 1), r.last) || r.last < r.first) {
    return std::nullopt;
  }
  return r;
}

namespace {

const config::Schema& schema_of(const std::string& name) {
  for (const auto& s : run_schemas())
    if (s.name() == name) return s;
  throw std::logic_error("no run schema named " + name);
}

}  // namespace

RunConfig resolve_run_config(const config::Document& doc, const fs::path& source_dir) {
  RunConfig rc;
  rc.file = doc.file();
  rc.source_dir = source_dir;
  auto sec = [&](const std::string& name) {
    rc.sections.push_back(doc.resolve(name, schema_of(name)));
    return rc.sections.back();
  };

  auto run = sec("run");
  rc.run = {run.get_string("name"),        run.get_string("dir"),         run.get_string("resume"),
            run.get_int("seed"),            run.get_string("device"),
            run.get_int("threads"),         run.get_bool("autotune"),
            run.get_string("backend"),      run.get_float("dist_timeout_s"),
            run.get_float("dist_heartbeat_s"), run.get_float("dist_bucket_mb"),
            run.get_int("master_port")};

  if (rc.run.resume == "auto" && rc.run.dir.empty())
    throw run.error("resume", "\"auto\" needs [run] dir: a restarted run finds its checkpoints there (the default "
                              "runs/<name>-<timestamp> is new at every start)");

  auto m = sec("model");
  rc.model = {m.get_string("preset"), m.get_int("n_layer"), m.get_int("n_head"), m.get_int("n_embd"),
              m.get_int("block_size"), m.get_int("vocab_size"), m.get_float("dropout"), m.get_bool("bias"), {}};
  if (const auto& init = m.get_string("init_from"); !init.empty()) {
    rc.model.init_from = config::resolve_data_path(init, doc.file(), source_dir);
    if (!fs::exists(rc.model.init_from / "config.json"))
      throw m.error("init_from", "no Hugging Face model at '" + rc.model.init_from.string() +
                                     "' (expected a directory with config.json and model.safetensors, as "
                                     "`pipeline export` or save_pretrained write them)");
  }

  // A key or token written in the config would be copied into the run directory's config.toml:
  // refused, naming where it goes instead.
  for (const char* key : {"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "access_key_id",
                          "secret_access_key", "access_key", "secret_key", "secret", "session_token", "token",
                          "hf_token", "password"})
    if (doc.peek("data", key))
      throw config::ConfigError(doc.file() + ": [data] " + key +
                                ": keys and tokens never go in the config (it is copied into the run directory): "
                                "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or HF_TOKEN for the Hugging Face "
                                "Hub), or put them in ~/.aws/credentials and name the profile with [data] profile");
  auto d = sec("data");
  const std::string dataset_text = d.get_string("dataset");
  try {
    check_source_text(dataset_text, d.get_bool("allow_http"));
  } catch (const datasets::DatasetError& e) {
    throw d.error("dataset", e.what());
  }
  fs::path ds = datasets::io::is_remote_source(dataset_text)
                    ? fs::path(dataset_text)
                    : config::resolve_data_path(dataset_text, doc.file(), source_dir);
  if (!datasets::io::is_remote_source(dataset_text) && !fs::exists(ds / "manifest.json") && !datasets::is_llmc_dataset(ds) && !datasets::is_parquet_source(ds))
    throw d.error("dataset", "no prepared dataset at '" + ds.string() +
                                 "' (expected a directory with manifest.json, made by `pipeline prepare`, or with "
                                 "llm.c token shards named *_train_NNNNNN.bin / *_val_NNNNNN.bin, or Parquet "
                                 "files: a *.parquet file, a directory of them, or a glob)");
  rc.data = {ds,
             d.get_string("train_split"),
             d.get_string("val_split"),
             d.get_bool("loop"),
             d.get_string("endpoint"),
             d.get_string("region"),
             d.get_string("profile"),
             d.get_bool("allow_http"),
             d.get_string("cache_dir").empty() ? fs::path() : config::resolve_data_path(d.get_string("cache_dir"), doc.file(), source_dir),
             d.get_string("order"),
             d.get_int_or_auto("lanes").value_or(0)};

  auto t = sec("training");
  rc.training = {t.get_int("steps"), t.get_int("batch_size"), t.get_int("seq_len"), t.get_int("grad_accum"),
                 t.get_float("grad_clip"), t.get_string("dtype"), t.get_string("matmul_precision"),
                 t.get_bool("cuda_graph"), t.get_string("recompute"), {}};  // guard: [training.guard] below

  auto g = sec("training.guard");
  auto& guard = rc.training.guard;
  guard = {g.get_bool("enabled"),   g.get_int("window"),        g.get_float("z"),
           g.get_int("min_steps"),  g.get_int("max_skips"),     g.get_int("rollback_skip"),
           g.get_int("max_rollbacks"), {}};
  if (guard.min_steps > guard.window) {
    if (g.was_set("min_steps"))
      throw g.error("min_steps", "must not exceed window (" + std::to_string(guard.window) + "), got " +
                                     std::to_string(guard.min_steps));
    guard.min_steps = guard.window;  // a short window set alone: judged once it is full
  }
  if (guard.enabled && rc.training.steps > model::kLrTableMaxSteps)
    throw g.error("enabled", "the guard's learning-rate table covers at most " +
                                 std::to_string(model::kLrTableMaxSteps) + " steps, and [training] steps = " +
                                 std::to_string(rc.training.steps));
  for (const auto& text : g.get_string_list("skip_steps")) {
    auto range = parse_step_range(text);
    if (!range) throw g.error("skip_steps", "expected \"N\" or \"FROM-TO\" with 1 <= FROM <= TO, got \"" + text + "\"");
    guard.skip_steps.push_back(*range);
  }

  auto o = sec("optimizer");
  rc.optimizer = {o.get_float("lr"), o.get_float("min_lr"), o.get_float("beta1"), o.get_float("beta2"),
                  o.get_float("eps"), o.get_float("weight_decay"), o.get_int("warmup_steps"), o.get_bool("fused")};
  if (rc.optimizer.min_lr > rc.optimizer.lr)
    throw o.error("min_lr", "must not exceed lr (" + std::to_string(rc.optimizer.lr) + "), got " +
                                std::to_string(rc.optimizer.min_lr));

  auto e = sec("eval");
  rc.eval = {e.get_int("every"), e.get_int("batches"), e.get_int("sample_tokens"), e.get_string("prompt"),
             e.get_float("temperature"), e.get_int("top_k"), {}, e.get_int("hellaswag_every"),
             e.get_int("hellaswag_items")};
  if (const auto& hs = e.get_string("hellaswag"); !hs.empty()) {
    rc.eval.hellaswag = config::resolve_data_path(hs, doc.file(), source_dir);
    if (!fs::is_regular_file(rc.eval.hellaswag))
      throw e.error("hellaswag", "no file at '" + rc.eval.hellaswag.string() +
                                     "' (expected HellaSwag's hellaswag_val.jsonl: one object per line with ctx, "
                                     "endings and label)");
    if (rc.eval.every == 0 && rc.eval.hellaswag_every == 0)
      throw e.error("hellaswag", "set, but nothing says when to score it: set [eval] every or hellaswag_every");
  }

  auto c = sec("checkpoint");
  rc.checkpoint = {c.get_int("every"), c.get_int("keep"), c.get_bool("at_end"), c.get_string("on_error")};

  auto l = sec("logging");
  rc.logging = {l.get_int("every"), l.get_string("live"), l.get_int("stats_interval_ms"), l.get_bool("trace"),
                l.get_float("peak_tflops"), l.get_bool("tensorboard"), l.get_string("http")};
  if (!rc.logging.http.empty()) {
    try {
      graph::parse_listen_address(rc.logging.http);
    } catch (const std::invalid_argument& e) {
      throw l.error("http", e.what());
    }
  }
  return rc;
}

void check_source_text(const std::string& source, bool allow_http) {
  if (!datasets::io::is_remote_source(source)) return;
  // Resolved here as text only: `pipeline check` touches no network (the reader lists it).
  const auto url = datasets::io::parse_remote_url(source);
  if (url.scheme == "http" && !allow_http)
    throw datasets::DatasetError(url.redacted() + ": plain HTTP, without TLS: set [data] allow_http = true to read it");
  if (!url.query.empty())
    throw datasets::DatasetError(url.redacted() + ": a query string in a source's URL is a credential, and the "
                                 "config is copied into the run directory: use HF_TOKEN, ~/.netrc or an s3:// URL");
}

std::vector<RunSource> run_sources(const RunConfig& rc, const graph::GraphSpec& spec) {
  std::vector<RunSource> out{{"[data] dataset", rc.data.dataset.string()}};
  for (const auto& st : spec.stages) {
    if (!st.resolved) continue;
    const config::Section& o = *st.resolved;
    if (o.has("dataset") && !o.get_string("dataset").empty())
      out.push_back({"[stages." + st.name + "] dataset", o.get_string("dataset")});
    if (o.has("mix"))
      for (const auto& e : o.get_string_list("mix"))
        out.push_back({"[stages." + st.name + "] mix", datasets::split_mix_entry(e, "[stages." + st.name + "] mix").first});
  }
  return out;
}

datasets::io::StoreOptions store_options_of(const RunConfig& rc, const graph::GraphSpec& spec) {
  datasets::io::StoreOptions o;
  o.endpoint = rc.data.endpoint;
  o.region = rc.data.region;
  o.profile = rc.data.profile;
  o.allow_http = rc.data.allow_http;
  o.cache_dir = rc.data.cache_dir;
  for (const auto& st : spec.stages)
    if (st.type == "fetch" && st.resolved) {
      o.prefetch = static_cast<int>(st.resolved->get_int("prefetch"));
      o.cache_bytes = static_cast<uint64_t>(st.resolved->get_int("cache_bytes"));
      o.connections = static_cast<int>(st.resolved->get_int("connections"));
      o.retry_for_s = st.resolved->get_float("retry_for");
    }
  return o;
}


}  // namespace pipeline::stages
