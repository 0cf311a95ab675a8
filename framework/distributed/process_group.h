#pragma once
// refit's handle on one PyTorch c10d process group: the rendezvous store (a TCPStore, hosted by
// rank 0 or by torchrun's agent), the backend (Gloo for CPU tensors, NCCL for CUDA tensors) and
// the few collectives data-parallel training needs. Every collective waits for its result and
// turns a failure into a refit::Error that names the ranks that stopped answering.
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "distributed/world.h"
#include "refit/collectives.h"

namespace refit {

struct DistributedSpec;

class ProcessGroup {
 public:
  /// Connects to the store, creates the backend and waits (up to the spec's timeout) until
  /// every rank has joined. `device` is the run's device: "auto" picks NCCL for CUDA and Gloo
  /// otherwise.
  ProcessGroup(const World& world, const DistributedSpec& spec, torch::Device device);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  /// "gloo" or "nccl".
  const std::string& backend() const;
  /// "rank 0 of 2 (gloo, store 127.0.0.1:29500)".
  std::string describe() const;

  /// Sums `tensors` over every rank, in place. Tensors of one dtype travel in flat buckets of at
  /// most the spec's bucket size; every rank must pass the same shapes in the same order.
  void all_reduce_sum(const std::vector<at::Tensor>& tensors, const std::string& what);
  /// Element-wise maximum over every rank, in place.
  void all_reduce_max(const at::Tensor& tensor, const std::string& what);
  /// Copies rank `root`'s tensors into every other rank's, in place (in flat buckets, as above).
  void broadcast(const std::vector<at::Tensor>& tensors, int root, const std::string& what);
  /// Returns when every rank has reached it.
  void barrier(const std::string& what);
  /// Every rank's `bytes`, by rank, on every rank (lengths may differ): one all-reduce of the
  /// lengths, then one all-gather of the bytes padded to the longest.
  std::vector<std::string> all_gather_bytes(const std::string& bytes, const std::string& what);

  struct Impl;  // c10d's objects; defined in process_group.cpp only

 private:
  std::unique_ptr<Impl> impl_;
};

/// The plugins' view of a group (refit/collectives.h): what TrainState::collectives points to.
class GroupCollectives : public Collectives {
 public:
  explicit GroupCollectives(ProcessGroup& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_reduce_sum(const std::vector<torch::Tensor>& tensors) override {
    group_.all_reduce_sum(tensors, "a plugin's all-reduce (TrainState::collectives)");
  }

 private:
  ProcessGroup& group_;
};

}  // namespace refit
