// The NCCL backend (CUDA builds), built from C++ as torch.distributed builds it from Python.
#include "model/dist/dist_internal.h"

#include <stdexcept>

#ifdef PIPELINE_HAVE_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace pipeline::dist::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout, c10::Device device) {
#ifdef PIPELINE_HAVE_CUDA
  auto options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/false);
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  nccl->setBoundDeviceId(device);
  // Connect now (as init_process_group(device_id=...) does): a missing peer or a wrong device
  // shows at start-up instead of inside the first backward pass.
  nccl->eagerConnectSingleDevice(device);
  return nccl;
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)device;
  throw std::runtime_error("this build of pipeline has no CUDA, so no NCCL: use [run] backend = \"gloo\"");
#endif
}

}  // namespace pipeline::dist::detail
