// "knn": DINO's weighted k-NN classifier (facebookresearch/dino, eval_knn.py knn_classifier) on
// features of a labelled bank, its accuracy on a labelled query set.
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "evaluators/evaluators.h"
#include "evaluators/features.h"
#include "precision/autocast_guard.h"
#include "refit/error.h"

namespace refit {

torch::Tensor knn_predict(const torch::Tensor& bank, const torch::Tensor& bank_labels, const torch::Tensor& queries,
                          std::int64_t k, double temperature, std::int64_t num_classes, std::int64_t chunk) {
  if (bank.dim() != 2 || queries.dim() != 2 || bank.size(1) != queries.size(1))
    throw Error("knn: expected bank [N, D] and queries [Q, D] features, got " + c10::str(bank.sizes()) + " and " +
                c10::str(queries.sizes()));
  if (bank_labels.dim() != 1 || bank_labels.size(0) != bank.size(0))
    throw Error("knn: expected one label per bank sample, got labels of shape " + c10::str(bank_labels.sizes()) + " for " +
                std::to_string(bank.size(0)) + " samples");
  const std::int64_t n = bank.size(0), q = queries.size(0);
  if (k < 1 || k > n)
    throw Error("knn: k = " + std::to_string(k) + " needs a bank of at least k samples; it has " + std::to_string(n));
  if (!(temperature > 0)) throw Error("knn: the temperature must be positive");
  if (num_classes < 1) throw Error("knn: no classes");

  const torch::Device device = queries.device();
  // fp32 like DINO, whatever autocast the caller runs under.
  AutocastOff no_autocast(device.type());
  const torch::Tensor train_t = l2_normalize(bank.to(device, torch::kFloat)).t();
  const torch::Tensor test = l2_normalize(queries.to(torch::kFloat));
  const torch::Tensor labels = bank_labels.to(device, torch::kLong).view({1, -1});
  if (q == 0) return torch::empty({0}, torch::TensorOptions().dtype(torch::kLong).device(device));
  if (chunk <= 0) {
    // The similarity chunk [c, N] and the one-hot votes [c * k, C]: about 64 Mi elements in all.
    const std::int64_t per_query = n + k * num_classes;
    chunk = std::max<std::int64_t>(1, (std::int64_t{1} << 26) / per_query);
  }
  std::vector<torch::Tensor> predictions;
  for (std::int64_t start = 0; start < q; start += chunk) {
    const std::int64_t b = std::min(chunk, q - start);
    torch::Tensor similarity = torch::mm(test.narrow(0, start, b), train_t);
    auto [distances, indices] = similarity.topk(k, /*dim=*/1, /*largest=*/true, /*sorted=*/true);
    torch::Tensor neighbours = torch::gather(labels.expand({b, -1}), 1, indices);
    torch::Tensor one_hot = torch::zeros({b * k, num_classes}, test.options()).scatter_(1, neighbours.view({-1, 1}), 1);
    torch::Tensor weights = distances.div(temperature).exp();
    torch::Tensor probs = torch::sum(torch::mul(one_hot.view({b, -1, num_classes}), weights.view({b, -1, 1})), 1);
    predictions.push_back(std::get<1>(probs.sort(1, /*descending=*/true)).select(1, 0));
  }
  return torch::cat(predictions);
}

namespace {

class KnnEvaluator : public FeatureSetsEvaluator {
 public:
  KnnEvaluator(FeatureSetsConfig sets, std::int64_t k, double temperature)
      : FeatureSetsEvaluator(std::move(sets)), k_(k), temperature_(temperature) {}

  std::map<std::string, double> evaluate(const ModelMap& models, const EvaluatorContext& context) override {
    auto [bank, queries, classes] = features(models, context);
    if (k_ > bank.x.size(0))
      throw Error("knn: k = " + std::to_string(k_) + " but the bank (data set \"" + sets_.bank + "\") has only " +
                  std::to_string(bank.x.size(0)) + " samples");
    torch::Tensor predicted = knn_predict(bank.x, bank.labels, queries.x, k_, temperature_, classes);
    const double accuracy = predicted.eq(queries.labels).to(torch::kDouble).mean().item<double>();
    return {{sets_.metric, accuracy}};
  }

 private:
  std::int64_t k_;
  double temperature_;
};

}  // namespace

void register_knn_evaluator(Registry& registry) {
  registry.evaluators.add("knn",
                          "DINO's weighted k-NN accuracy: features of models (a chain) on data sets bank (labelled "
                          "references) and queries; keys k, temperature, metric",
                          [](const ConfigReader& c) -> Builder<Evaluator> {
                            FeatureSetsConfig sets = read_feature_sets_config(c, "knn_accuracy");
                            const auto k = c.number_in<std::int64_t>("k", 20, 1, std::int64_t{1} << 20);
                            double temperature = c.optional<double>("temperature", 0.07);
                            if (!(temperature > 0) || !std::isfinite(temperature)) {
                              c.error("temperature", "expected a positive number, got " + Json(temperature).dump());
                              temperature = 0.07;
                            }
                            return [sets, k, temperature](const BuildContext&) {
                              return std::make_shared<KnnEvaluator>(sets, k, temperature);
                            };
                          });
}

}  // namespace refit
