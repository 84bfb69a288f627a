// What a resumed run does to the records an earlier process left past its checkpoint. A run
// killed after step N's checkpoint, having logged steps N+1..M, resumes from step N and trains
// N+1..M again: left alone, metrics.jsonl would hold those steps twice (and pipeline stats, the
// tests' readers, anything that plots the file would see both). On resume the records past the
// checkpoint move to metrics.superseded.jsonl, so that metrics.jsonl holds each step once, and
// nothing is lost. (TensorBoard's files are append-only; the resumed run's own file starts with
// a session start that makes TensorBoard drop them: runner/tensorboard_log.h.)
#pragma once

#include <cstdint>
#include <filesystem>

namespace pipeline::stages {

/// Moves the lines of RUN_DIR/metrics.jsonl whose "step" is past `step` (the checkpoint's) to the
/// end of RUN_DIR/metrics.superseded.jsonl, and a last line a kill cut short (no newline) with
/// them; every other line stays, in order (those without a "step": a Slurm allocation's). The
/// superseded lines reach their file before metrics.jsonl is replaced, atomically: a failure
/// leaves the old file whole. Returns how many lines moved; no file, nothing to do. Throws
/// std::runtime_error naming the file.
size_t supersede_metrics_after(const std::filesystem::path& run_dir, int64_t step);

}  // namespace pipeline::stages
