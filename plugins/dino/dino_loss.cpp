#include "dino_loss.h"

#include <ATen/ATen.h>

#include "refit/autocast.h"
#include "refit/error.h"

namespace refit::dino {

double teacher_temperature(double warmup, double final_value, std::int64_t warmup_iterations, std::int64_t iteration) {
  if (iteration >= warmup_iterations) return final_value;
  if (warmup_iterations == 1) return warmup;
  return warmup + (final_value - warmup) * static_cast<double>(iteration) / static_cast<double>(warmup_iterations - 1);
}

torch::Tensor dino_loss(const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& center,
                        double student_temperature, const torch::Tensor& teacher_temperature, std::int64_t views,
                        std::int64_t globals) {
  if (views < 2 || globals < 1 || globals > views)
    throw Error("dino loss: need at least 2 views and 1..views global crops, got " + std::to_string(views) + " views, " +
                std::to_string(globals) + " global");
  if (student.dim() != 2 || student.size(0) % views != 0)
    throw Error("dino loss: student output must be [views * batch, K]");
  const std::int64_t batch = student.size(0) / views, k = student.size(1);
  // float32 throughout, as DINO's elementwise formulation is under autocast: the pair matmul
  // below would otherwise be autocast to bf16/fp16.
  AutocastOff fp32(student.device().type());
  if (teacher.dim() != 2 || teacher.size(0) != globals * batch || teacher.size(1) != k)
    throw Error("dino loss: teacher output must be [global crops * batch, K] with the student's K");
  auto log_p = at::log_softmax(student.to(torch::kFloat) / student_temperature, -1).reshape({views, batch * k});
  auto q = at::softmax((teacher.to(torch::kFloat) - center.to(torch::kFloat)) / teacher_temperature, -1)
               .detach()
               .reshape({globals, batch * k});
  // cross[g][v] = -(1/B) sum_b sum_k q[g,b,k] log_p[v,b,k]: one matmul for every pair.
  auto cross = at::matmul(q, log_p.t()).neg() / static_cast<double>(batch);  // [globals, views]
  auto same_crop = at::eye(globals, views, cross.options().dtype(torch::kBool));
  const double terms = static_cast<double>(globals * views - globals);
  return cross.masked_fill(same_crop, 0.0).sum() / terms;
}

torch::Tensor updated_center(const torch::Tensor& center, const torch::Tensor& teacher, double momentum) {
  auto t = teacher.detach().to(torch::kFloat);
  auto batch_center = t.sum(0, /*keepdim=*/true) / static_cast<double>(t.size(0));
  auto next = center * momentum + batch_center * (1.0 - momentum);
  return at::where(batch_center.isfinite().all(), next, center);
}

torch::Tensor updated_center(const torch::Tensor& center, const torch::Tensor& sum, const torch::Tensor& rows,
                             double momentum) {
  auto batch_center = sum / rows;  // no rows: 0/0, not finite: the centre stays
  auto next = center * momentum + batch_center * (1.0 - momentum);
  return at::where(batch_center.isfinite().all(), next, center);
}

}  // namespace refit::dino
