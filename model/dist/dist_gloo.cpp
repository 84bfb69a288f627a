// The Gloo backend, built from C++ as torch.distributed builds it from Python.
//
// ProcessGroupGloo.hpp includes <gloo/...> headers that the torch wheel does not ship. Debian's
// libgloo-dev (a 2022 snapshot) provides them; torch 2.11 was built against a newer gloo, so
// this file is careful to depend on nothing whose layout differs between the two: it calls only
// functions exported by libtorch_cpu (Options::create_default, the ProcessGroupGloo constructor)
// and handles the result as a c10d::Backend. The gloo types appear here only behind
// std::shared_ptr, whose size does not depend on them, and the one class whose virtual table
// does differ (ProcessGroupGloo::GlooStore: newer gloo adds virtual functions to its Store, under
// GLOO_STORE_HAS_STORE_V2) is never instantiated here. Nothing links Debian's libgloo: gloo's
// code comes from libtorch_cpu.
#include "model/dist/dist_internal.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace pipeline::dist::detail {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout) {
  // create_default picks the network device as Python does: GLOO_SOCKET_IFNAME when set, else
  // the address this host's name resolves to (loopback when it resolves to nothing).
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace pipeline::dist::detail
