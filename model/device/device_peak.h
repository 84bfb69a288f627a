// The peak dense bf16 tensor throughput of a GPU, by the name CUDA gives it, for MFU: a table,
// and the choice between it and [logging] peak_tflops. Torch-free (tests/test_device_logic.cpp).
//
// A GPU the table does not know gets no peak, and then no MFU: a guess (torchtitan falls back to
// the A100's 312 for any GPU it does not know) is wrong by up to 6x on the cards people use.
#pragma once

#include <string>
#include <string_view>

namespace pipeline::model {

/// Dense bf16 TFLOP/s (fp32 accumulate, no sparsity) of the GPU named `device_name` (as
/// cudaGetDeviceProperties names it: "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4",
/// ...), or 0 when the table does not know it, or when it names a MIG slice ("NVIDIA
/// A100-SXM4-40GB MIG 1g.5gb": a share of the GPU's SMs, which the name does not give exactly). `row`, when given, gets the table row that matched.
double table_peak_tflops(std::string_view device_name, std::string* row = nullptr);

/// The peak an MFU figure divides by, and where it came from.
struct PeakFlops {
  double tflops = 0;   // 0: unknown, no MFU
  std::string source;  // "[logging] peak_tflops", "the table's H100 PCIe", or why there is none
};

/// `configured` > 0 ([logging] peak_tflops) wins; otherwise the table's peak for a CUDA device
/// named `device_name`; otherwise none (a CPU, a GPU the table lacks, a MIG slice: the source says
/// which, and for a slice, the whole GPU's figure).
PeakFlops resolve_peak_flops(double configured, bool cuda, std::string_view device_name);

/// The one line a run prints about MFU: the peak and its source, or, with none, that MFU shows as
/// "—" and how to set the peak.
std::string describe_peak(const PeakFlops& peak);

}  // namespace pipeline::model
