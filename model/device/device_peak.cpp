// See device_peak.h.
//
// Sources of the figures (dense, bf16 with fp32 accumulate, no sparsity):
// - A100 (SXM and PCIe) 312, H100 SXM 989, H100 PCIe 756, H100 NVL 835, H200 989, B200 2250,
//   L40S 362: torchtitan's get_peak_flops (torchtitan/tools/utils.py), from NVIDIA's data sheets
//   (nvidia.com/en-us/data-center/a100, /h100, /h200; the Blackwell and L40S data sheets).
// - RTX 4090 165.2: NVIDIA's Ada architecture whitepaper ("Peak BF16 Tensor TFLOPS with FP32
//   Accumulate" 165.2 dense, 330.3 with sparsity), as llm.c's llmc/mfu.h tabulates it (ADA).
// - RTX 4090 D 147.1: the 4090's figure for 114 of its 128 SMs at the same 2.52 GHz boost clock
//   (NVIDIA's specifications: 14,592 CUDA cores against 16,384; 1,177 AI TOPS against 1,321, the
//   same ratio).
// - A MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") has none: it computes with a share of the
//   GPU's SMs (14 of the A100's 108 for a 1g slice, 98 for the whole 7g one), which its name
//   does not give exactly, so the whole GPU's figure would understate MFU up to 8x.
// - L4 121 (242 with sparsity), L40 181 (362 with sparsity), A10 125 (250 with sparsity), H200 NVL
//   835 (1,671 with sparsity), GH200 989 (the H100 SXM's Hopper die): NVIDIA's data sheets.
// - T4 65: its fp16 tensor peak (mixed precision). The T4 (Turing, sm_75) has no bf16 tensor
//   cores: a bf16 run there is emulated, and its MFU against this figure is low by design; train
//   in fp32 there, or set [logging] peak_tflops to what you want MFU measured against.
#include "model/device/device_peak.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <vector>

#include "base/short_number.h"

namespace pipeline::model {

namespace {

struct Row {
  const char* name;                  // as the log names it
  std::vector<const char*> words;    // every one must be a word of the device's name
  double tflops;
};

// First match wins: the specific rows before the general ones (H100 NVL before H100).
const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      {"H100 NVL", {"H100", "NVL"}, 835.0},
      {"H100 PCIe", {"H100", "PCIE"}, 756.0},
      {"H100 SXM", {"H100"}, 989.0},
      {"H200 NVL", {"H200", "NVL"}, 835.0},
      {"H200", {"H200"}, 989.0},
      {"GH200", {"GH200"}, 989.0},
      {"B200", {"B200"}, 2250.0},
      {"A100", {"A100"}, 312.0},
      {"L40S", {"L40S"}, 362.0},
      {"L40", {"L40"}, 181.0},
      {"L4", {"L4"}, 121.0},
      {"A10", {"A10"}, 125.0},
      {"RTX 4090 D", {"RTX", "4090", "D"}, 147.1},
      {"RTX 4090", {"RTX", "4090"}, 165.2},
      {"T4 (fp16: it has no bf16)", {"T4"}, 65.0},
  };
  return rows;
}

// The name's words, upper case, split at anything not a letter or a digit
// ("NVIDIA A100-SXM4-80GB" -> NVIDIA, A100, SXM4, 80GB).
std::vector<std::string> words_of(std::string_view name) {
  std::vector<std::string> out;
  std::string w;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      w += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      out.push_back(std::move(w));
      w.clear();
    }
  }
  if (!w.empty()) out.push_back(std::move(w));
  return out;
}

// Where a MIG slice's name says so ("NVIDIA A100-SXM4-40GB MIG 1g.5gb": the word MIG, then the
// profile), or nullopt for a whole GPU.
struct MigSlice {
  std::string gpu;      // the whole GPU's name: "NVIDIA A100-SXM4-40GB"
  std::string profile;  // "1g.5gb" (empty when the name gives none)
};
std::optional<MigSlice> mig_slice(std::string_view name) {
  auto alnum = [&](size_t i) { return i < name.size() && std::isalnum(static_cast<unsigned char>(name[i])); };
  for (size_t at = name.find("MIG"); at != std::string_view::npos; at = name.find("MIG", at + 1)) {
    if ((at > 0 && alnum(at - 1)) || alnum(at + 3)) continue;  // a word of its own
    std::string_view rest = name.substr(at + 3);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    return MigSlice{std::string(name.substr(0, at)), std::string(rest.substr(0, rest.find(' ')))};
  }
  return std::nullopt;
}

}  // namespace

double table_peak_tflops(std::string_view device_name, std::string* row) {
  const auto words = words_of(device_name);
  auto has = [&](const char* w) { return std::find(words.begin(), words.end(), w) != words.end(); };
  // A laptop part shares the desktop card's name with a fraction of its clocks and power; a MIG
  // slice, the whole GPU's name with a share of its SMs.
  if (has("LAPTOP") || has("MOBILE") || has("MIG")) return 0;
  for (const auto& r : table()) {
    if (std::all_of(r.words.begin(), r.words.end(), has)) {
      if (row) *row = r.name;
      return r.tflops;
    }
  }
  return 0;
}

PeakFlops resolve_peak_flops(double configured, bool cuda, std::string_view device_name) {
  if (configured > 0) return {configured, "[logging] peak_tflops"};
  if (!cuda) return {0, "the CPU has no entry in the peak table"};
  std::string row;
  if (const double t = table_peak_tflops(device_name, &row); t > 0) return {t, "the peak table's " + row};
  if (const auto slice = mig_slice(device_name)) {
    const double whole = table_peak_tflops(slice->gpu, &row);
    return {0, "\"" + std::string(device_name) + "\" is a MIG slice" +
                   (slice->profile.empty() ? std::string() : " (" + slice->profile + ")") +
                   (whole > 0 ? " of the peak table's " + row + " (" + short_number(whole) + " TFLOP/s for the whole GPU)" : "") +
                   ": a slice computes with a share of the GPU's SMs, which the peak table cannot know"};
  }
  return {0, "the peak table has no entry for \"" + std::string(device_name) + "\""};
}

std::string describe_peak(const PeakFlops& peak) {
  if (peak.tflops > 0) return "MFU against " + short_number(peak.tflops) + " TFLOP/s (" + peak.source + ")";
  return "MFU: \xE2\x80\x94 (" + peak.source +
         "): set [logging] peak_tflops to the device's dense bf16 TFLOP/s (e.g. --set logging.peak_tflops=312) to "
         "see it";
}

}  // namespace pipeline::model
