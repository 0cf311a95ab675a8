#pragma once
// DINO's loss, centre and teacher temperature as functions (facebookresearch/dino, main_dino.py
// DINOLoss), so that the objective is a thin loop around them and the golden test
// (tests/golden/make_dino.py) checks them against the reference Python.
#include <cstdint>

#include <torch/types.h>

namespace refit::dino {

/// Teacher temperature at optimizer iteration `iteration`: numpy.linspace(warmup, final, W)[i]
/// for i < W (DINO's warm-up, counted here in iterations), then `final`.
double teacher_temperature(double warmup, double final_value, std::int64_t warmup_iterations, std::int64_t iteration);

/// The mean over (teacher global crop q, student crop v != q) pairs of the batch-mean cross entropy
/// H(softmax((t_q - center) / teacher_temp), log_softmax(s_v / student_temp)).
/// `student` is [views * B, K] (views in order, global crops first), `teacher` [globals * B, K].
/// Returns a 0-d fp32 tensor, differentiable w.r.t. `student` only.
/// `teacher_temperature` is a 0-d float32 tensor on the outputs' device (a schedule the training
/// loop updates between steps: read on the device, it stays right in a replayed CUDA graph).
torch::Tensor dino_loss(const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& center,
                        double student_temperature, const torch::Tensor& teacher_temperature, std::int64_t views,
                        std::int64_t globals);

/// center * m + mean(teacher, dim 0) * (1 - m), keeping the old centre when the batch's teacher
/// outputs are not finite (the step would be skipped; the centre must not absorb NaN). No host
/// synchronisation: the choice is a device-side where().
torch::Tensor updated_center(const torch::Tensor& center, const torch::Tensor& teacher, double momentum);
/// The same from a window's sums: `sum` [1, K] of the teacher outputs of `rows` (0-d) rows, so
/// that k micro-batches move the centre as one k-times-larger batch does.
torch::Tensor updated_center(const torch::Tensor& center, const torch::Tensor& sum, const torch::Tensor& rows,
                             double momentum);

}  // namespace refit::dino
