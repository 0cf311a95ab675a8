// Gloo through LibTorch's own ProcessGroupGloo, which libtorch_cpu.so exports with Gloo linked in
// statically. The torch wheel ships no Gloo headers, so this unit compiles against Debian's
// libgloo-dev (an older Gloo) and never links Debian's library. That is sound because of how
// little this unit touches: it calls three out-of-line functions of libtorch
// (Options::create_default, the ProcessGroupGloo constructor and, through the vtable, its
// destructor), and the only Gloo types in ProcessGroupGloo's layout sit behind std::shared_ptr,
// so the object's size and member offsets do not depend on Gloo's headers. Nothing here
// constructs, copies or calls into a Gloo type, so no inline Gloo code is emitted into refit
// (tests/unit/test_distributed_symbols.cpp checks the built object for gloo:: symbols).
#include "distributed/backends.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace refit::distributed {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  // create_default picks the network device as PyTorch does: GLOO_SOCKET_IFNAME when set, else
  // the address this host's name resolves to, else loopback.
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace refit::distributed
