#include "objectives/classification.h"

#include <ATen/ATen.h>

namespace refit {

namespace {

class ClassificationObjective : public Objective {
 public:
  ClassificationObjective(std::vector<std::string> chain, double label_smoothing)
      : chain_(std::move(chain)), label_smoothing_(label_smoothing) {}

  std::vector<std::string> required_models() const override { return chain_; }
  std::vector<std::string> metric_names() const override { return {"accuracy"}; }
  bool graph_safe() const override { return true; }  // the same ops every step, nothing read on the host

  LossOutput compute(const ModelMap& models, const Batch& batch, const ObjectiveContext&) override {
    torch::Tensor x = batch.input;
    for (const auto& name : chain_) x = models.at(name)->forward(x);
    // Logits may come out of autocast in bf16/fp16: the loss is computed in fp32.
    auto logits = x.to(torch::kFloat);
    auto loss = at::cross_entropy_loss(logits, batch.target, /*weight=*/{}, at::Reduction::Sum,
                                       /*ignore_index=*/-100, label_smoothing_);
    auto correct = logits.argmax(1).eq(batch.target).sum().to(torch::kFloat);
    return LossOutput{loss, batch.size(), {{"accuracy", correct}}};
  }

 private:
  std::vector<std::string> chain_;
  double label_smoothing_;
};

}  // namespace

void register_classification_objective(Registry& registry) {
  registry.objectives.add(
      "classification", "cross entropy over classes; models: the chain the input runs through; metric: accuracy",
      [](const ConfigReader& c) -> Builder<Objective> {
        auto chain = c.required<std::vector<std::string>>("models");
        if (c.has("models") && chain.empty()) c.error("models", "expected at least one model name");
        double smoothing = c.number_in<double>("label_smoothing", 0.0, 0.0, 1.0);
        return [chain, smoothing](const BuildContext&) {
          return std::make_shared<ClassificationObjective>(chain, smoothing);
        };
      });
}

}  // namespace refit
