#include "objectives/classification.h"

#include <ATen/ATen.h>

namespace refit {

namespace {

class ClassificationObjective : public Objective {
 public:
  ClassificationObjective(std::vector<std::string> chain, std::string labels, double label_smoothing)
      : chain_(std::move(chain)), labels_(std::move(labels)), label_smoothing_(label_smoothing) {}

  std::vector<std::string> required_models() const override { return chain_; }
  std::vector<std::string> required_fields(const ModelMap& models) const override {
    auto fields = chain_fields(models, chain_);
    fields.push_back(labels_);
    return fields;
  }
  std::vector<std::string> metric_names() const override { return {"accuracy"}; }
  // The same ops every step, nothing read on the host.
  StepGraphSupport step_graph_support() const override { return {/*replayable=*/true, /*inner_step_hooks=*/false}; }

  LossOutput compute(const ModelMap& models, const Batch& batch, const ObjectiveContext&) override {
    Fields out = run_chain(models, chain_, batch);
    // Logits may come out of autocast in bf16/fp16: the loss is computed in fp32.
    auto logits = out.at(model_named(models, chain_.back()).main_output()).to(torch::kFloat);
    const torch::Tensor& labels = batch.at(labels_);
    auto loss = at::cross_entropy_loss(logits, labels, /*weight=*/{}, at::Reduction::Sum,
                                       /*ignore_index=*/-100, label_smoothing_);
    auto correct = logits.argmax(1).eq(labels).sum().to(torch::kFloat);
    return LossOutput{loss, batch.size(), {{"accuracy", correct}}};
  }

 private:
  std::vector<std::string> chain_;
  std::string labels_;
  double label_smoothing_;
};

}  // namespace

void register_classification_objective(Registry& registry) {
  registry.objectives.add(
      "classification",
      "cross entropy over classes; models: the chain the data runs through (its last main output: the logits); "
      "labels: the field of class indices (\"labels\"); metric: accuracy",
      [](const ConfigReader& c) -> Builder<Objective> {
        auto chain = c.required<std::vector<std::string>>("models");
        if (c.has("models") && chain.empty()) c.error("models", "expected at least one model name");
        double smoothing = c.number_in<double>("label_smoothing", 0.0, 0.0, 1.0);
        std::string labels = c.optional<std::string>("labels", "labels");
        if (labels.empty()) c.error("labels", "expected the name of a data field");
        return [chain, labels, smoothing](const BuildContext&) {
          return std::make_shared<ClassificationObjective>(chain, labels, smoothing);
        };
      });
}

}  // namespace refit
