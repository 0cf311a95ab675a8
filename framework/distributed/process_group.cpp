#include "distributed/process_group.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/recipe.h"
#include "distributed/backends.h"
#include "refit/error.h"

namespace refit {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

/// torchrun's agent keeps its store across restarts of the workers; each attempt rendezvouses
/// under its own prefix, as torch.distributed's env:// rendezvous does.
std::string attempt_prefix() {
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return std::string("/worker/attempt_") + (restarts && *restarts ? restarts : "0") + "/refit/";
}

/// Returns once something accepts a TCP connection at the store's address; throws when the
/// deadline passes first. A host name that does not resolve is looked up again until then, as
/// c10d does (under a cluster scheduler, rank 0's DNS record may appear with its pod); only a
/// lookup refit asked for wrongly fails at once. A lookup itself can take the resolver's own
/// timeout past the deadline (5 s per try where no resolver answers). c10d's client, given a
/// store that is not there, retries for its whole timeout, sleeps up to half a minute, then
/// retries for a whole timeout again, printing a stack trace each time: 135 s for a 60 s timeout.
/// Probing first keeps a rank's "within timeout_s" true and its message refit's. (A store that
/// vanishes between the probe and c10d's connection is left to c10d's retries.)
void wait_for_store(const World& w, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  auto delay = std::chrono::milliseconds(20);
  const auto unresolved = [&](int code) {
    return "cannot resolve MASTER_ADDR " + w.master_addr + ": " + gai_strerror(code);
  };
  while (true) {
    addrinfo* found = nullptr;
    const int resolved = getaddrinfo(w.master_addr.c_str(), std::to_string(w.master_port).c_str(), &hints, &found);
    if (resolved == EAI_BADFLAGS || resolved == EAI_FAMILY || resolved == EAI_SERVICE || resolved == EAI_SOCKTYPE)
      throw Error("distributed: rank " + std::to_string(w.rank) + " " + unresolved(resolved));
    bool accepted = false;
    for (addrinfo* a = resolved == 0 ? found : nullptr; a && !accepted; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        accepted = true;
      } else if (errno == EINPROGRESS) {
        // An unreachable host answers nothing: wait for it no longer than the deadline.
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        pollfd p{fd, POLLOUT, 0};
        int error = 0;
        socklen_t length = sizeof error;
        accepted = ::poll(&p, 1, static_cast<int>(std::clamp<std::int64_t>(left, 1, 1000))) == 1 &&
                   ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
      }
      ::close(fd);
    }
    if (resolved == 0) freeaddrinfo(found);
    if (accepted) return;
    if (Clock::now() + delay >= deadline)
      throw std::runtime_error(resolved != 0 ? unresolved(resolved)
                                             : std::string("nothing accepted a connection there (is ") +
                                                   (w.agent_store ? "torchrun's agent" : "rank 0") + " running?)");
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(500));
  }
}

c10::intrusive_ptr<c10d::Store> connect_store(const World& w, bool server, std::chrono::milliseconds timeout) {
  if (!server) wait_for_store(w, Clock::now() + timeout);
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(w.master_port);
  o.isServer = server;
  o.numWorkers = w.size;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(w.master_addr, o);
}

}  // namespace

struct ProcessGroup::Impl {
  World world;
  DistributedSpec spec;
  torch::Device device{torch::kCPU};
  std::string backend_name;
  std::string prefix;
  c10::intrusive_ptr<c10d::Store> store;  // the server (rank 0 without torchrun's agent) or a client
  c10::intrusive_ptr<c10d::Backend> backend;

  // A heartbeat per rank, counted in the store by a thread with its own connection: when a
  // collective fails, the ranks whose count stopped are the ones that died or hang.
  std::thread heartbeat;
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;

  std::string heartbeat_key(int rank) const { return prefix + "heartbeat/" + std::to_string(rank); }

  void start_heartbeat() {
    heartbeat = std::thread([this] {
      try {
        // A short timeout of its own: when the store's host dies, a beat fails within seconds,
        // and the destructor's join never waits out the run's (long) collective timeout.
        auto own = connect_store(world, false, std::min(millis(spec.timeout_s), std::chrono::milliseconds(10000)));
        while (true) {
          own->add(heartbeat_key(world.rank), 1);  // outside the lock: the destructor never waits on the network
          std::unique_lock<std::mutex> lock(mutex);
          if (wake.wait_for(lock, std::chrono::milliseconds(250), [this] { return stopping; })) break;
        }
      } catch (const std::exception&) {
        // The store is gone (its host died); the failing collective reports it.
      }
    });
  }

  /// The ranks that stopped beating, found by reading every count twice, a second apart. Empty
  /// when all beat on; nullopt when the store itself cannot be reached.
  std::optional<std::vector<int>> silent_ranks() {
    try {
      auto probe = connect_store(world, false, std::chrono::milliseconds(5000));
      auto read = [&] {
        std::vector<std::int64_t> v;
        for (int r = 0; r < world.size; ++r) v.push_back(probe->add(heartbeat_key(r), 0));
        return v;
      };
      auto before = read();
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      auto after = read();
      std::vector<int> silent;
      for (int r = 0; r < world.size; ++r)
        if (r != world.rank && after[r] == before[r]) silent.push_back(r);
      return silent;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  [[noreturn]] void fail(const std::string& what, const std::string& cause) {
    std::string who;
    if (auto silent = silent_ranks()) {
      if (silent->empty()) {
        who = "no rank has stopped: the ranks disagree about the collective (a bug, or different recipes)";
      } else {
        who = silent->size() == 1 ? "lost rank " : "lost ranks ";
        for (std::size_t i = 0; i < silent->size(); ++i) who += (i ? ", " : "") + std::to_string((*silent)[i]);
        who += " (it died or stopped answering)";
      }
    } else {
      who = std::string("lost the rendezvous store at ") + world.master_addr + ":" + std::to_string(world.master_port) +
            (world.agent_store ? " (torchrun's agent)" : " (hosted by rank 0: lost rank 0)");
    }
    std::string first = cause.substr(0, cause.find('\n'));
    throw Error("distributed: rank " + std::to_string(world.rank) + " of " + std::to_string(world.size) + ": " + who +
                ", during " + what + ". Stopping this rank; no checkpoint is written. (" + backend_name + ": " + first +
                ")");
  }

  void run(const std::string& what, std::vector<at::Tensor>& tensors,
           const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>& op) {
    try {
      auto work = op(tensors);
      work->wait();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(what, e.what());
    }
  }
};

ProcessGroup::ProcessGroup(const World& world, const DistributedSpec& spec, torch::Device device)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.world = world;
  m.spec = spec;
  m.device = device;
  m.backend_name = spec.backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : spec.backend;
  if (m.backend_name == "nccl" && !device.is_cuda())
    throw Error("/training/distributed/backend: NCCL needs a CUDA device (this run is on " + device.str() +
                "); use \"gloo\"");
  // A rank that dies leaves its peers writing to closed sockets (the store, Gloo's pairs). Under
  // SIGPIPE's default action that write kills this rank silently (exit 141) before it can name
  // the lost rank; ignored, as Python ignores it for torch.distributed, the write fails with
  // EPIPE and c10d reports it as an error.
  std::signal(SIGPIPE, SIG_IGN);
  m.prefix = attempt_prefix();
  const auto timeout = millis(spec.timeout_s);
  const bool server = world.rank == 0 && !world.agent_store;
  try {
    m.store = connect_store(world, server, timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("distributed: rank " + std::to_string(world.rank) + " could not " + (server ? "host" : "reach") +
                " the rendezvous store at " + world.master_addr + ":" + std::to_string(world.master_port) + " within " +
                std::to_string(static_cast<int>(spec.timeout_s)) +
                " s: " + std::string(e.what()).substr(0, std::string(e.what()).find('\n')));
  }
  m.start_heartbeat();
  auto group_store = c10::make_intrusive<c10d::PrefixStore>(m.prefix + "default_pg", m.store);
  try {
    m.backend = m.backend_name == "nccl" ? distributed::make_nccl_backend(group_store, world.rank, world.size, timeout)
                                         : distributed::make_gloo_backend(group_store, world.rank, world.size, timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    m.fail("the creation of the " + m.backend_name + " process group", e.what());
  }
  barrier("the start of the run (every rank joins)");
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
}

int ProcessGroup::rank() const { return impl_->world.rank; }
int ProcessGroup::size() const { return impl_->world.size; }
const std::string& ProcessGroup::backend() const { return impl_->backend_name; }

std::string ProcessGroup::describe() const {
  const World& w = impl_->world;
  return "rank " + std::to_string(w.rank) + " of " + std::to_string(w.size) + " (" + impl_->backend_name + ", store " +
         w.master_addr + ":" + std::to_string(w.master_port) + (w.agent_store ? ", torchrun's agent" : "") + ")";
}

namespace {

using CollectiveOp = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>;

}  // namespace

/// Runs `op` once per flat bucket of `tensors` (one dtype and device each, at most bucket_mib),
/// then copies each bucket's result back into its tensors: one collective for many small tensors.
static void bucketed(ProcessGroup::Impl& m, const std::vector<at::Tensor>& tensors, const std::string& what,
                     const CollectiveOp& op) {
  if (tensors.empty()) return;
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  const std::size_t cap = static_cast<std::size_t>(m.spec.bucket_mib) << 20;
  for (auto& [key, group] : groups) {
    std::size_t begin = 0;
    while (begin < group.size()) {
      std::size_t end = begin, bytes = 0;
      while (end < group.size() && (end == begin || bytes + group[end].nbytes() <= cap)) bytes += group[end++].nbytes();
      std::vector<at::Tensor> flat_views;
      for (std::size_t i = begin; i < end; ++i) flat_views.push_back(group[i].reshape({-1}));
      std::vector<at::Tensor> flat{at::cat(flat_views)};
      m.run(what, flat, op);
      std::int64_t offset = 0;
      for (std::size_t i = begin; i < end; ++i) {
        group[i].copy_(flat[0].narrow(0, offset, group[i].numel()).view_as(group[i]));
        offset += group[i].numel();
      }
      begin = end;
    }
  }
}

void ProcessGroup::all_reduce_sum(const std::vector<at::Tensor>& tensors, const std::string& what) {
  bucketed(*impl_, tensors, what, [&](std::vector<at::Tensor>& f) {
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    return impl_->backend->allreduce(f, o);
  });
}

void ProcessGroup::all_reduce_max(const at::Tensor& tensor, const std::string& what) {
  std::vector<at::Tensor> one{tensor};
  impl_->run(what, one, [&](std::vector<at::Tensor>& f) {
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    return impl_->backend->allreduce(f, o);
  });
}

void ProcessGroup::broadcast(const std::vector<at::Tensor>& tensors, int root, const std::string& what) {
  bucketed(*impl_, tensors, what, [&](std::vector<at::Tensor>& f) {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return impl_->backend->broadcast(f, o);
  });
}

std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& bytes, const std::string& what) {
  const Impl& m = *impl_;
  const int n = m.world.size;
  auto lengths = at::zeros({n}, at::TensorOptions().device(m.device).dtype(at::kLong));
  lengths[m.world.rank].fill_(static_cast<std::int64_t>(bytes.size()));
  all_reduce_sum({lengths}, what + " (lengths)");
  const at::Tensor host_lengths = lengths.cpu();
  const std::int64_t longest = std::max<std::int64_t>(1, host_lengths.max().item<std::int64_t>());
  auto mine = at::zeros({longest}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  std::vector<at::Tensor> input{mine.to(m.device)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < n; ++r) output[0].push_back(at::empty({longest}, input[0].options()));
  impl_->run(what, input, [&](std::vector<at::Tensor>& in) { return impl_->backend->allgather(output, in); });
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    const at::Tensor got = output[0][static_cast<std::size_t>(r)].cpu();
    out.emplace_back(static_cast<const char*>(got.data_ptr()),
                     static_cast<std::size_t>(host_lengths[r].item<std::int64_t>()));
  }
  return out;
}

void ProcessGroup::barrier(const std::string& what) {
  // An all-reduce of one number: a barrier on both backends (NCCL's own needs device ids).
  auto one = at::ones({1}, at::TensorOptions().device(impl_->device).dtype(at::kFloat));
  std::vector<at::Tensor> v{one};
  impl_->run(what, v, [&](std::vector<at::Tensor>& f) { return impl_->backend->allreduce(f); });
}

}  // namespace refit
