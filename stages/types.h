// The payloads that flow between the training stages, and the run-wide context every stage
// of a training graph reads (resolved config, device, run directory, resume point), handed to
// it by the engine when it is built (run_context).
//
//   read_shards ─TextChunk─▶ tokenize ─TokenChunk─▶ pack ─Batch─▶ h2d ─Batch─▶ train ─StepResult─▶ log/eval/checkpoint
//   read_tokens ─TokenChunk─▶ ...            synthetic ─Batch─▶ ...
//
// A Batch travels as B rows of T+1 uint16 tokens (2 bytes a token), written by pack straight into
// a pooled host buffer (pinned on CUDA); train widens them to int64 and takes x = rows[:, :T] and
// y = rows[:, 1:], on its own stream. h2d keeps the Batch type, so a CPU graph may leave it out.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/io/store.h"
#include "datasets/plan/lane_cursor.h"
#include "datasets/plan/partition.h"
#include "datasets/sources/dataset_mix.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/units/catalog.h"
#include "base/json.h"
#include "graph/stage.h"
#include "model/checkpoint/checkpoint.h"
#include "model/device/device_event.h"
#include "model/dist/dist_group.h"
#include "model/net/gpt2.h"
#include "stages/lane_session.h"
#include "stages/settings.h"
#include "stages/spike_watch.h"

namespace pipeline::stages {

/// A reader position: one dataset's, or, when read_shards mixes several datasets by weight,
/// the mix's (documents drawn and each source's position).
struct SourcePosition {
  datasets::DatasetPosition pos;
  bool mixed = false;         // (not std::optional: GCC 12 warns falsely on optional<vector> moves)
  datasets::MixPosition mix;  // when mixed
  std::string str() const;
};

/// Where the data continues. In the lanes order ([data] order = "lanes"): where each of this
/// rank's lanes goes on (`lanes`, datasets/plan/lane_cursor.h); the fields below are unused. In
/// the documents order, where the token stream continues, in two forms.
///   - This rank's: open the reader at `pos`, then drop the first `skip` tokens it yields (tokens
///     of a document or chunk that an earlier batch already used). Only for this rank's partition.
///   - Every rank's alike (datasets/plan/partition.h): `next`, the document and token this rank's
///     stream goes on with, and `done`, what the runs this one resumed consumed. A checkpoint's
///     cursors of all ranks make one layer of progress, so that a run of any number of ranks
///     continues exactly (runner/data_parallel.h: checkpoint_cursor).
/// As the start of a run (RunContext::start) with `done` set, the readers deal out what `done`
/// leaves and `pos` only matters to a mix (where its draws are replayed from).
struct DataCursor {
  SourcePosition pos;
  uint64_t skip = 0;
  bool has_next = false;  // the source marks its documents (every reader of this project does)
  datasets::Frontier next;
  bool by_shard = false;  // the partition dealt shards (Parquet row groups), not documents
  std::shared_ptr<const datasets::DataProgress> done;
  bool lane_order = false;                   // the lanes order: `lanes` says it all
  std::vector<datasets::LaneCursor> lanes;   // this rank's lanes, in the order it serves them
  /// `with_done`: include `done` ("earlier"), which one rank's cursor in a checkpoint carries.
  /// The lanes order: {"lanes":["lane=0 ...", ...]}.
  std::string to_json(bool with_done = true) const;
  static DataCursor from_json(const JsonValue& v);  // throws std::runtime_error naming the field
};

/// Whole documents read from text shards, concatenated: document i is text[ends[i-1], ends[i]).
/// One message carries many small documents (about [stages.read] chunk_bytes of text), so the
/// per-message cost of the flow graph is paid per chunk, not per document. `pos` is the reader
/// position before the first document (the documents order).
struct TextChunk {
  std::string text;
  std::vector<uint32_t> ends;  // end offset of each document in `text`
  /// One per document, in order: its place, and the tokens of it to drop (an earlier run's).
  std::vector<datasets::DocMark> marks;
  SourcePosition pos;
  /// The lanes order: every document is lane `lane`'s (-1: the documents order), each with its
  /// place in the lane (one per document), and the reader's estimate of their tokens
  /// (datasets/lanes/lane_demand.h), which pack hands back when it receives them.
  int64_t lane = -1;
  std::vector<datasets::LanePlace> places;
  uint64_t estimate = 0;
  size_t documents() const { return ends.size(); }
  std::string_view document(size_t i) const {
    size_t begin = i ? ends[i - 1] : 0;
    return std::string_view(text).substr(begin, ends[i] - begin);
  }
};

/// Tokens in stream order; `pos` is the reader position where they start. A chunk that begins
/// a document starts with <|endoftext|> (50256), as GPT-2 separates documents.
struct TokenChunk {
  std::vector<uint16_t> tokens;
  /// The documents that start in the chunk (at: the index of their first token), in order, and one
  /// at 0 for a document a resumed stream continues; tokens before the first mark continue the
  /// previous chunk's last document. Pack drops each mark's `skip` tokens and keeps track of where
  /// the stream is (DataCursor::next).
  std::vector<datasets::DocMark> marks;
  SourcePosition pos;
  /// The lanes order: every token is lane `lane`'s (-1: the documents order), in pieces: piece i
  /// is tokens [ends[i-1], ends[i]) with place places[i] (a whole document of a text source, with
  /// its <|endoftext|> first; a run of one unit's tokens of a token source); `content` says which.
  int64_t lane = -1;
  std::vector<datasets::LanePlace> places;
  std::vector<uint32_t> ends;
  datasets::UnitContent content = datasets::UnitContent::tokens;
  uint64_t estimate = 0;  // the reader's estimate of its tokens (TextChunk::estimate)
};

class WindowLease;  // stages/pinned_pool.h

/// B rows of T+1 tokens: x = rows[:, :T] and y = rows[:, 1:] (see batch_inputs). In the lanes
/// order each row is one lane's next row (docs/data_order.md); in the documents order the rows are
/// cut from one window of B*T+1 consecutive tokens, row b its tokens [b*T, b*T+T], so that
/// consecutive rows share a token and x and y are those of the window, as before rows.
struct Batch {
  torch::Tensor rows;  // (B, T+1) uint16: host after pack (pinned on CUDA), device after h2d
  int64_t B = 0, T = 0;
  int64_t index = 0;      // micro-batch number since the start of the run (0-based)
  /// The optimizer step whose data this is, 0 for the run's first step, counted on across resumes
  /// and never reset (a step whose data is skipped still counts): the data order's step.
  int64_t data_step = 0;
  /// The sum, mod 2^64, of the row hash of each of its rows (datasets/plan: row_hash): a step's
  /// "windows" in metrics.jsonl is the sum over its micro-batches and ranks.
  uint64_t windows = 0;
  DataCursor after;                   // where the data continues after this batch
  /// The pooled host buffer `rows` was written into: it goes back to pack's pool when the last
  /// holder lets go (h2d hands its share to a callback that runs once its copy is done).
  std::shared_ptr<WindowLease> lease;
  /// After h2d: the copy's event, which the compute stream waits on before reading `rows`.
  std::shared_ptr<model::DeviceEvent> ready;
};

/// x and y, (B, T) int64 each and contiguous, on `rows`' device and the calling thread's current
/// stream: one widening cast of the (B, T+1) rows, then x = rows[:, :T] and y = rows[:, 1:].
std::pair<torch::Tensor, torch::Tensor> batch_inputs(const torch::Tensor& rows, int64_t B, int64_t T);

/// Weights handed to eval: device copies of the parameters, taken on the training stream before
/// the step's `done` event was recorded (eval orders its stream after that event).
struct EvalWeights {
  int64_t step = 0;
  bool loss = true;        // the validation loss and sample are due ([eval] every)
  bool hellaswag = false;  // HellaSwag is due ([eval] hellaswag_every)
  model::NamedTensors weights;
};

/// Where one step's time went, phase by phase (forward, backward, optimizer step; fwd_bwd when a
/// CUDA graph runs forward and backward as one): device time between CUDA events on train's
/// stream when it trains on CUDA, host time otherwise. Read by log once the step's `done` event
/// completed, which is after every event here (same stream, recorded earlier): reading them
/// makes no sync.
struct StepTiming {
  std::string stage;  // the train stage's name in the graph (whose GPU-busy time this is)
  struct Span {
    const char* phase;
    std::shared_ptr<model::DeviceEvent> start, end;  // CUDA: timing events
    double host_ms = 0;                               // otherwise: measured on the host
  };
  std::vector<Span> spans;
  /// Total milliseconds per phase, in first-seen order.
  std::vector<std::pair<std::string, double>> phase_ms() const;
  double total_ms() const;
};

/// The outcome of one optimizer step. On CUDA, loss and norm are pinned host tensors filled by
/// a non-blocking copy; `done` completes when they hold the values. The train stage never waits
/// for it: the log stage does, off the training thread, and without spinning.
struct StepResult {
  int64_t step = 0;        // data steps completed (1-based): optimizer steps, and steps the guard skipped
  int64_t tokens = 0;      // tokens trained on in this step
  double lr = 0;           // without the guard (with it, the verdict's)
  torch::Tensor loss, grad_norm;  // 0-dim fp32, host
  /// With [training.guard]: (model::SpikeVerdict::kFields) float64, host, ready with the loss.
  torch::Tensor verdict;
  int64_t updates = -1;    // updates taken after this step, when known at once (no guard); else -1
  int64_t rollbacks = 0;   // the guard's rollbacks so far
  std::shared_ptr<model::DeviceEvent> done;  // CUDA, or null when loss/norm are ready
  std::shared_ptr<const StepTiming> timing;  // null for a checkpoint-only result
  std::shared_ptr<dist::Work> reduced;  // data parallel on the CPU: the all-reduce averaging them
  int64_t data_step = 0;  // the data step of its batches (Batch::data_step)
  /// The hash of the step's set of rows: the sum, mod 2^64, of the row hash of every row the
  /// step trained on (Batch::windows), this rank's; with several ranks, every rank's once
  /// `windows_reduced` completed (read it with step_windows, after wait_ready).
  uint64_t windows = 0;
  torch::Tensor windows_parts;                   // data parallel: (2,) int64, host: low and high 32 bits, summed over the ranks
  std::shared_ptr<dist::Work> windows_reduced;   // that sum
  std::chrono::steady_clock::time_point issued;  // when train finished issuing the step
  bool last = false;
  std::shared_ptr<const EvalWeights> eval;                  // at evaluation steps (EvalSection)
  std::shared_ptr<const model::CheckpointState> checkpoint;  // every checkpoint.every steps and at the end
  DataCursor cursor;                                         // where the data continues after this step
};

/// Blocks (sleeping) until a StepResult's loss and norm are on the host and, with several ranks,
/// averaged (and its windows summed); returns the time waited (zero on one CPU process).
std::chrono::nanoseconds wait_ready(const StepResult& r);
/// The step's row-set hash over every rank (StepResult::windows), after wait_ready.
uint64_t step_windows(const StepResult& r);
/// A row-set hash as metrics.jsonl writes it: 16 lowercase hex digits.
std::string windows_hex(uint64_t windows);

/// Serialized writes of progress lines and metrics from several stages, and the run directory's
/// own log: RUN_DIR/run.log holds every line printed (and every error line), so that what a
/// terminal or a pipe lost is still there, the resume command included.
///
/// A write to stdout or stderr that fails (EPIPE from a pipe whose reader exited, EIO from a
/// closed terminal) stops the printing to that stream, never the run: run.log notes it once,
/// and so does the other stream while it works.
class RunLog {
 public:
  /// An empty run_dir writes no metrics.jsonl and no run.log; print = false prints nothing
  /// (data-parallel ranks other than 0, which train without speaking).
  explicit RunLog(std::filesystem::path run_dir, bool print = true);
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;
  /// Prints a line on stdout (through the live view's hook when one is installed) and appends
  /// it to run.log.
  void print(const std::string& line);
  /// Prints a line on stderr (errors, and what a run must say even when stdout is gone) and
  /// appends it to run.log.
  void error(const std::string& line);
  /// Appends one JSON object line to metrics.jsonl, and hands it to the metric listener.
  void metric(const std::string& json);
  void set_printer(std::function<void(const std::string&)> p);
  /// Adds a receiver of every metrics line after it is written (the TensorBoard log, the
  /// figures in stats reports), called under the log's lock; the id removes it again.
  int add_metric_listener(std::function<void(const std::string&)> l);
  void remove_metric_listener(int id);
  /// A write to `stream` (1: stdout, 2: stderr) failed with errno `err`, here or in another
  /// writer (the live view): printing to it stops, and run.log says so once.
  void output_lost(int stream, int err);
  /// False once a write to stdout (1) or stderr (2) failed.
  bool stream_ok(int stream) const;
  /// RUN_DIR/run.log (empty when the run has no directory).
  std::filesystem::path file() const;

 private:
  void write_stream_locked(int stream, const std::string& line);
  void output_lost_locked(int stream, int err);
  void append_locked(const std::string& line);

  mutable std::mutex mu_;
  std::filesystem::path dir_;
  std::FILE* metrics_ = nullptr;
  std::FILE* run_log_ = nullptr;
  std::function<void(const std::string&)> printer_;
  std::vector<std::pair<int, std::function<void(const std::string&)>>> listeners_;
  int next_listener_ = 0;
  bool print_ = true;
  bool stream_ok_[3] = {true, true, true};
};

class Ranks;  // stages/ranks.h

/// Run-wide state shared by the stages of one training graph.
struct RunContext {
  RunConfig cfg;
  model::GPTConfig model;
  torch::Device device = torch::kCPU;
  std::filesystem::path run_dir;
  int64_t start_step = 0;            // data steps already done (resume)
  int64_t start_data_step = 0;       // the data step the run starts with (Batch::data_step)
  DataCursor start;                  // data position to resume from
  GuardRecord start_guard;           // the resumed checkpoint's (updates = start_step without one)
  std::filesystem::path resume_from; // checkpoint to load in train (empty: fresh weights)
  std::shared_ptr<RunLog> log;
  std::atomic<int64_t> last_step{0};     // data steps completed, for the final message
  std::atomic<int64_t> updates{0};       // updates taken ([training] steps counts these), as train knows them
  /// Checkpoints asked for while training (SIGUSR1): train writes one at its next step when
  /// this count is past the requests it served.
  std::atomic<int64_t> checkpoint_requests{0};
  std::string checkpoint_written;        // path of the newest checkpoint (set by checkpoint)
  /// RUN_DIR/checkpoints/*.ckpt by step, oldest first: listed by the checkpoint stage when it
  /// starts and after each write (it is their only writer). What the guard may roll back to.
  std::vector<std::pair<int64_t, std::filesystem::path>> checkpoints;
  /// Why the spike guard stopped the run (empty: it did not); `pipeline run` ends with it.
  std::string guard_stop;
  std::mutex mu;  // checkpoint_written, checkpoints, guard_stop
  // Data parallel (launched by torchrun): this rank's share of the data and the group. Without
  // torchrun, the whole data and null. (What earlier runs consumed is in start.done: readers take
  // both from data_partition.)
  datasets::Partition partition;
  std::shared_ptr<Ranks> ranks;
  /// Remote sources (docs/remote.md): how the readers open their stores ([data] endpoint, region,
  /// profile, allow_http, cache_dir; the fetch stage's prefetch, cache_bytes, connections,
  /// retry_for), and the stores they opened, which the fetch stage reports on. A reader of a
  /// DataOrder opens it with `.store = store_options`, adds its remote stores here, and calls
  /// datasets::fetch_ahead with its lanes' cursors.
  datasets::io::StoreOptions store_options;
  std::shared_ptr<datasets::io::StoreSet> remote_stores = std::make_shared<datasets::io::StoreSet>();
  /// [data] order = "lanes" (cfg.data.order, which a resume takes from its checkpoint): K, this
  /// rank's lanes and the demand board; null in the documents order.
  std::shared_ptr<LaneSession> lanes;
  /// Rank 0, or the only process: evaluates and writes metrics and checkpoints.
  bool writer() const;
};

/// This rank's partition of the data, with what the runs it resumes consumed (RunContext::start).
datasets::Partition data_partition(const RunContext& rc);
/// What a source stage passes to its dataset reader: data_partition.
datasets::DatasetReaderOptions reader_options(const RunContext& rc);

/// The key that names a source stage's dataset in messages: "[stages.NAME] dataset" when the stage
/// sets its own, else "[data] dataset".
std::string dataset_key(const graph::StageContext& ctx);

/// The documents order (runs begun before lanes) reads local files only: throws
/// std::invalid_argument for a remote `source`, naming `key` and [data] order, and saying what to do
/// instead (docs/remote.md).
void refuse_remote_in_documents_order(const std::string& source, const std::string& key);

/// The run context a training stage is built with: what the run hands the engine's stages
/// (graph::EngineOptions::host holds a std::shared_ptr<RunContext>, and the engine keeps it alive
/// as long as the stages). Throws a clear error, naming the stage, when a training stage is built
/// outside a training run.
RunContext& run_context(const graph::StageContext& ctx);

}  // namespace pipeline::stages
