#include "objectives/causal_lm.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include "objectives/chunked_cross_entropy.h"

namespace refit {

namespace {

constexpr std::int64_t kIgnore = -100;

class CausalLmObjective : public Objective {
 public:
  CausalLmObjective(std::vector<std::string> chain, std::string labels, std::int64_t chunk_rows)
      : chain_(std::move(chain)), labels_(std::move(labels)), chunk_rows_(chunk_rows) {}

  std::vector<std::string> required_models() const override { return chain_; }
  std::vector<std::string> required_fields(const ModelMap& models) const override {
    auto fields = chain_fields(models, chain_);
    fields.push_back(labels_);
    return fields;
  }
  std::vector<std::string> metric_names() const override { return {"accuracy", "perplexity"}; }
  void add_derived_metrics(std::map<std::string, double>& means) const override {
    auto it = means.find("loss");
    if (it != means.end()) means["perplexity"] = std::exp(it->second);
  }

  // Tokens with a target after the shift. The loop calls this on the batch before it moves to
  // the device (a host count, no synchronisation).
  std::int64_t count(const Batch& batch) const override {
    const torch::Tensor& labels = batch.at(labels_);
    if (labels.dim() != 2) throw Error("causal_lm: labels must be [batch, sequence]; got " + c10::str(labels.sizes()));
    if (labels.size(1) < 2) return 0;
    return labels.narrow(1, 1, labels.size(1) - 1).ne(kIgnore).sum().item<std::int64_t>();
  }

  LossOutput compute(const ModelMap& models, const Batch& batch, const ObjectiveContext& context) override {
    Fields out = run_chain(models, chain_, batch);
    const Model& last = model_named(models, chain_.back());
    const torch::Tensor& labels = batch.at(labels_);
    const torch::Tensor main = out.at(last.main_output());
    if (main.dim() != 3 || main.size(0) != labels.size(0) || main.size(1) != labels.size(1))
      throw Error("causal_lm: the model's output \"" + last.main_output() + "\" must be [batch, sequence, features] " +
                  "matching labels " + c10::str(labels.sizes()) + "; got " + c10::str(main.sizes()));
    const std::int64_t T = main.size(1);
    // Position t predicts token t+1: the last position predicts nothing.
    const torch::Tensor targets = labels.narrow(1, 1, T - 1).reshape({-1});
    torch::Tensor loss, correct;
    if (out.has("lm_head_weight")) {
      const torch::Tensor& weight = out.at("lm_head_weight");
      const torch::Tensor hidden = main.narrow(1, 0, T - 1).reshape({-1, main.size(2)});
      const auto device = hidden.device().type();
      const auto cd = at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device)
                                                                : at::result_type(hidden, weight);
      auto r = chunked_linear_cross_entropy(hidden, weight, targets, chunk_rows_, cd, kIgnore);
      loss = r.loss_sum, correct = r.correct;
    } else {
      // Logits from the model (possibly bf16 under autocast): the loss in fp32.
      const torch::Tensor logits = main.narrow(1, 0, T - 1).reshape({-1, main.size(2)}).to(torch::kFloat);
      loss = at::cross_entropy_loss(logits, targets, {}, at::Reduction::Sum, kIgnore);
      correct = logits.argmax(1).eq(targets).logical_and(targets.ne(kIgnore)).sum().to(torch::kFloat);
    }
    // The loops divide by count() of the host batch; counting the device labels here would wait for
    // the device in every step, so a training step reports none.
    return LossOutput{loss, context.training ? 0 : count(batch), {{"accuracy", correct}}};
  }

 private:
  std::vector<std::string> chain_;
  std::string labels_;
  std::int64_t chunk_rows_;
};

}  // namespace

void register_causal_lm_objective(Registry& registry) {
  registry.objectives.add(
      "causal_lm",
      "next-token cross entropy of a decoder LM; models: the chain the data runs through (its last model returns "
      "logits, or hidden states with \"lm_head_weight\" for a chunked loss); labels: the field of token ids with -100 "
      "where no loss is taken (\"labels\"); chunk_tokens: rows of logits held at once (512); metrics: accuracy, "
      "perplexity",
      [](const ConfigReader& c) -> Builder<Objective> {
        auto chain = c.required<std::vector<std::string>>("models");
        if (c.has("models") && chain.empty()) c.error("models", "expected at least one model name");
        std::string labels = c.optional<std::string>("labels", "labels");
        if (labels.empty()) c.error("labels", "expected the name of a data field");
        const auto chunk = c.number_in<std::int64_t>("chunk_tokens", 512, 1, std::int64_t{1} << 30);
        return [chain, labels, chunk](const BuildContext&) {
          return std::make_shared<CausalLmObjective>(chain, labels, chunk);
        };
      });
}

}  // namespace refit
