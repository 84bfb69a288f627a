// Which kernel scaled_dot_product_attention may take, for a measurement: bench_model --sdpa
// compares flash, cuDNN and memory-efficient attention at the sizes the scale sweep times (docs/
// device.md). ATen keeps these switches process-wide, so this is for a program's main thread
// before it trains (a benchmark), never for a stage.
#pragma once

#include <string>
#include <string_view>

namespace pipeline::model {

/// Allows only the named kernel ("flash", "cudnn", "efficient", "math") while it lives and puts
/// ATen's previous switches back after; "auto" changes nothing (ATen's own choice, what training
/// uses). Throws std::invalid_argument naming an unknown name and the choices.
///
/// Example:
///   SdpaChoice only("cudnn");
///   ... time the step ...
class SdpaChoice {
 public:
  explicit SdpaChoice(std::string_view name);
  ~SdpaChoice();
  SdpaChoice(const SdpaChoice&) = delete;
  SdpaChoice& operator=(const SdpaChoice&) = delete;

 private:
  bool set_ = false;
  bool flash_ = true, cudnn_ = true, efficient_ = true, math_ = true;
};

}  // namespace pipeline::model
