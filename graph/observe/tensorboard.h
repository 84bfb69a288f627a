// TensorBoard event files: scalars as TensorBoard's Event protocol buffers (tensorboard_event.proto,
// encoded by libprotobuf-lite) in TFRecord framing, so `tensorboard --logdir` plots them live.
//
// A file is a sequence of records, each
//   u64 length (little-endian), u32 masked CRC-32C of those 8 bytes, `length` bytes of data,
//   u32 masked CRC-32C of the data,
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The first record is an Event with
// file_version "brain.Event:2"; each later one carries a Summary of scalar values at a step. A
// writer that continues a run from a checkpoint writes a SessionLog START at the first step it
// will write (PyTorch's SummaryWriter(purge_step=...)): TensorBoard then drops what the earlier
// files hold from that step on, written before a crash and trained again since.
// The file is named events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, as TensorFlow names its
// own; TensorBoard reads every file with "tfevents" in its name.
//
// Example:
//   TensorBoardWriter tb(run_dir);
//   tb.add_scalars(step, {{"train/loss", 3.2}, {"train/lr", 6e-4}});
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/observe/stats.h"

namespace pipeline::graph {

/// CRC-32C (Castagnoli, the iSCSI polynomial), computed by Intel ISA-L.
uint32_t crc32c(const void* data, size_t size);
/// The masked form TFRecord framing stores.
uint32_t masked_crc32c(const void* data, size_t size);

/// One TFRecord: `data` framed with its length and both checksums.
std::string tfrecord(std::string_view data);

/// The encoded Event protos: a file_version event, a session's start, and a summary of scalars.
std::string tensorboard_file_version_event(double wall_time);
std::string tensorboard_session_start_event(int64_t step, double wall_time);
std::string tensorboard_scalars_event(int64_t step, double wall_time,
                                      const std::vector<std::pair<std::string, double>>& scalars);

/// The scalars TensorBoard plots for one stats snapshot: per stage `stage_busy/<name>` (share of
/// the last report window its workers were busy with host work), `stage_device_wait/<name>` (the
/// share asleep on the device; only for a stage that has waited on it) and
/// `stage_items_per_s/<name>`, per queue
/// `queue_occupancy/<consumer>` (mean items held over the window, as a share of its capacity).
std::vector<std::pair<std::string, double>> snapshot_scalars(const Snapshot& s);

/// Appends events to a new event file in `dir`. Thread-safe: scalars may come from several
/// threads (the log stage, the engine's observer). Every event is flushed to the file at once, so
/// TensorBoard sees it while the run goes on. Errors (std::runtime_error) name the file.
class TensorBoardWriter {
 public:
  /// `purge_step` > 0: the file starts with a session start at that step, so that TensorBoard
  /// drops the events of earlier files from that step on (a run resumed from the checkpoint of
  /// step purge_step - 1).
  explicit TensorBoardWriter(const std::filesystem::path& dir, int64_t purge_step = 0);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One event holding all `scalars` at `step`; wall_time < 0 means now.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars, double wall_time = -1);
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time = -1) {
    add_scalars(step, {{tag, value}}, wall_time);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  void append(const std::string& event);

  std::mutex mu_;
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace pipeline::graph
