// See sdpa_choice.h.
#include "model/net/sdpa_choice.h"

#include <ATen/Context.h>

#include <stdexcept>

namespace pipeline::model {

SdpaChoice::SdpaChoice(std::string_view name) {
  if (name == "auto") return;
  if (name != "flash" && name != "cudnn" && name != "efficient" && name != "math")
    throw std::invalid_argument("sdpa: expected auto, flash, cudnn, efficient or math, got \"" + std::string(name) + "\"");
  auto& ctx = at::globalContext();
  flash_ = ctx.userEnabledFlashSDP();
  cudnn_ = ctx.userEnabledCuDNNSDP();
  efficient_ = ctx.userEnabledMemEfficientSDP();
  math_ = ctx.userEnabledMathSDP();
  ctx.setSDPUseFlash(name == "flash");
  ctx.setSDPUseCuDNN(name == "cudnn");
  ctx.setSDPUseMemEfficient(name == "efficient");
  ctx.setSDPUseMath(name == "math");
  set_ = true;
}

SdpaChoice::~SdpaChoice() {
  if (!set_) return;
  auto& ctx = at::globalContext();
  ctx.setSDPUseFlash(flash_);
  ctx.setSDPUseCuDNN(cudnn_);
  ctx.setSDPUseMemEfficient(efficient_);
  ctx.setSDPUseMath(math_);
}

}  // namespace pipeline::model
