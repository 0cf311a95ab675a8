#include "train/replicas.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "refit/error.h"

namespace refit {

Replicas::Replicas(std::shared_ptr<ProcessGroup> group, ModelRegistry& models, torch::Device device)
    : group_(std::move(group)), models_(models), device_(device) {
  if (!group_) return;
  if (group_->size() > 1) collectives_ = std::make_unique<GroupCollectives>(*group_);
  for (const auto& m : models_.models())
    if (!m.ema)
      for (auto& b : m.model->named_buffers()) buffers_.push_back(b.value());
}

void Replicas::start() {
  if (!group_) return;
  std::vector<torch::Tensor> tensors;
  for (const auto& m : models_.models()) {
    for (const auto& p : m.parameters)
      if (p.trainable) tensors.push_back(p.tensor.detach());
    for (auto& b : m.model->named_buffers()) tensors.push_back(b.value());
  }
  {
    torch::NoGradGuard no_grad;
    group_->broadcast(tensors, 0, "the broadcast of rank 0's weights");
  }
  verify(/*frozen_too=*/true, "the start");
}

void Replicas::refuse_unreduced_state(const Objective& objective) const {
  // State an objective computes from each rank's own batches (DINO's centre, created at its first
  // step) is not summed over the ranks: they would drift apart without a sign. Refused at the
  // start, or at the first update where the state is created lazily, rather than silently wrong.
  if (!group_ || group_->size() == 1 || objective.state_dict().empty() || objective.reduces_state_across_ranks()) return;
  throw Error("distributed: the objective keeps state computed from its batches and does not sum it over the "
              "ranks (Objective::reduces_state_across_ranks); train it in one process");
}

std::pair<std::int64_t, std::int64_t> Replicas::global_window(std::int64_t count, std::int64_t samples,
                                                              std::int64_t iteration) const {
  if (!group_) return {count, samples};
  auto t = torch::tensor({count, samples}, torch::TensorOptions().dtype(torch::kLong)).to(device_);
  group_->all_reduce_sum({t}, "the sample count of iteration " + std::to_string(iteration));
  auto host = t.cpu();
  return {host[0].item<std::int64_t>(), host[1].item<std::int64_t>()};
}

void Replicas::broadcast_buffers(std::int64_t iteration) {
  if (!group_ || buffers_.empty()) return;
  group_->broadcast(buffers_, 0, "the buffer broadcast of iteration " + std::to_string(iteration));
}

void Replicas::reduce_gradients(std::vector<torch::Tensor>& trainable, std::int64_t iteration) {
  if (!group_) return;
  std::vector<torch::Tensor> all;
  for (auto& p : trainable) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    all.push_back(p.grad());
  }
  group_->all_reduce_sum(all, "the gradient all-reduce of iteration " + std::to_string(iteration));
}

void Replicas::verify(bool frozen_too, const std::string& when) {
  if (!group_) return;
  torch::NoGradGuard no_grad;
  std::vector<std::string> names;
  std::vector<torch::Tensor> sums;
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    // Two sums per tensor, the second weighted by position, so that a permutation shows too.
    auto flat = t.detach().reshape({-1}).to(torch::kDouble);
    auto weights = at::arange(flat.numel(), flat.options()).remainder(1009).add_(1);
    names.push_back(name);
    sums.push_back(at::stack({flat.sum(), (flat * weights).sum()}));
  };
  for (const auto& m : models_.models()) {
    for (const auto& p : m.parameters)
      if (p.trainable || frozen_too) add(m.spec.name + "/" + p.path, p.tensor);
    // Buffers that training changes (BatchNorm statistics) are each rank's own within a window,
    // as in PyTorch's DDP; they are made rank 0's at every window's start.
    if (frozen_too)
      for (auto& b : m.model->named_buffers()) add(m.spec.name + "/" + b.key(), b.value());
  }
  if (sums.empty()) return;
  auto mine = at::stack(sums);
  auto leaders = mine.clone();
  group_->broadcast({leaders}, 0, "the replica check at " + when);
  auto differs = mine.ne(leaders).any(1).cpu();
  auto flags = torch::zeros({group_->size()}, mine.options());
  if (differs.any().item<bool>()) flags[group_->rank()] = 1.0;
  group_->all_reduce_max(flags, "the replica check at " + when);
  auto host = flags.cpu();
  std::string ranks;
  for (int r = 0; r < group_->size(); ++r)
    if (host[r].item<double>() > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (ranks.empty()) return;
  std::string first;
  for (std::int64_t i = 0; i < differs.size(0); ++i)
    if (differs[i].item<bool>()) {
      first = " (here: " + names[static_cast<std::size_t>(i)] + ")";
      break;
    }
  throw Error("distributed: at " + when + ", the weights or buffers of rank(s) " + ranks + " differ from rank 0's" + first +
              ". Every rank must load the same weights files and run the same recipe");
}

}  // namespace refit
