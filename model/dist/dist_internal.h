// Internal to model/dist_*.cpp (the only files compiled with c10d's flags): constructors of the
// c10d backends, each in a translation unit of its own so that the headers they need stay there,
// and the group's c10d process group for the gradient reducer. ProcessGroupGloo.hpp includes gloo's headers,
// which the torch wheel does not ship; Debian's libgloo-dev provides them (see dist_gloo.cpp for
// why that is safe), and ProcessGroupNCCL.hpp needs <nccl.h> from the wheel's nvidia/nccl.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace pipeline::dist::detail {

/// Gloo over TCP, as torch.distributed builds it (GLOO_SOCKET_IFNAME and the other GLOO_*
/// variables are honoured the same way).
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout);

/// NCCL on `device`, connected eagerly. Throws when this build has no CUDA.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout, c10::Device device);

}  // namespace pipeline::dist::detail

namespace pipeline::dist {
class Group;
namespace detail {
c10::intrusive_ptr<c10d::ProcessGroup> process_group_of(Group& group);
}  // namespace detail
}  // namespace pipeline::dist
