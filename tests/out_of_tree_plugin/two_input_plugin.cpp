// A model with several named inputs and outputs, and a dataset of variable-length samples: the
// complete plugin walked through in docs/plugins.md. Built out of tree against the installed
// SDK by tests/integration/out_of_tree.sh, and in the test tree as the test plugin "two_input".
#include <cmath>

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "refit/plugin.h"

namespace {

using namespace refit;

/// Reads "input_ids" [B, T] and "attention_mask" [B, T] (a padded sequence) and "side" [B, S];
/// outputs "logits" (main) and "embedding" (the masked mean of the token embeddings, [B, D]).
/// Padding never reaches the result: a padded batch gives each sample what it gives alone.
class TwoTower : public Model {
 public:
  TwoTower(std::int64_t vocab, std::int64_t dim, std::int64_t side, std::int64_t classes) {
    embed = register_module("embed", torch::nn::Embedding(vocab, dim));
    head = register_module("head", torch::nn::Linear(dim + side, classes));
  }
  std::vector<std::string> input_fields() const override { return {"input_ids", "attention_mask", "side"}; }
  std::vector<std::string> output_fields() const override { return {"logits", "embedding"}; }
  Fields forward_fields(const Fields& in) override {
    const torch::Tensor e = embed->forward(in.at("input_ids"));                         // [B, T, D]
    const torch::Tensor m = in.at("attention_mask").unsqueeze(-1).to(e.scalar_type());  // [B, T, 1]
    const torch::Tensor pooled = (e * m).sum(1) / m.sum(1).clamp_min(1.0);
    const torch::Tensor side = in.at("side").to(pooled.scalar_type());
    return Fields{{"logits", head->forward(at::cat({pooled, side}, 1))}, {"embedding", pooled}};
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr};
};

/// Sequences of 1..max_length token ids (never 0, the pad id), a 2-feature side input "extra"
/// and a label: "input_ids" is padded with 0, and its mask is "attention_mask".
class Sequences : public Dataset {
 public:
  Sequences(std::int64_t n, std::int64_t vocab, std::int64_t max_length) : n_(n), vocab_(vocab), max_length_(max_length) {}
  std::int64_t size() const override { return n_; }
  std::vector<FieldInfo> fields() const override {
    return {{"input_ids", /*padded=*/true, /*pad_value=*/0.0, /*mask=*/"attention_mask"}, {"extra"}, {"labels"}};
  }
  Example get(std::int64_t i) const override {
    const std::int64_t length = 1 + (i * 7) % max_length_;
    const torch::Tensor ids = (torch::arange(length, torch::kLong) * 3 + i) % (vocab_ - 1) + 1;
    const double t = static_cast<double>(i);
    const torch::Tensor extra = torch::tensor({std::sin(t), std::cos(t)}, torch::kFloat);
    // The label follows the side input: a model that does not receive it (a broken renaming)
    // stays at chance.
    const std::int64_t label = std::sin(t) > 0 ? 1 : 0;
    return Example{{"input_ids", ids}, {"extra", extra}, {"labels", torch::tensor(label, torch::kLong)}};
  }
  std::int64_t num_classes() const override { return 2; }

 private:
  std::int64_t n_, vocab_, max_length_;
};

void register_two_input(Registry& r) {
  r.models.add("two_tower", "reads input_ids, attention_mask and side; outputs logits and embedding",
               [](const ConfigReader& c) -> Builder<Model> {
                 auto vocab = c.number_in<std::int64_t>("vocab", 16, 2, 1 << 20);
                 auto dim = c.number_in<std::int64_t>("dim", 8, 1, 1 << 16);
                 auto side = c.number_in<std::int64_t>("side", 2, 0, 1 << 16);
                 auto classes = c.number_in<std::int64_t>("classes", 2, 2, 1 << 16);
                 return [=](const BuildContext&) { return std::make_shared<TwoTower>(vocab, dim, side, classes); };
               });
  r.datasets.add("sequences", "variable-length token sequences (input_ids, padded; attention_mask), extra, labels",
                 [](const ConfigReader& c) -> Builder<Dataset> {
                   auto n = c.number_in<std::int64_t>("n", 64, 1, 1 << 24);
                   auto vocab = c.number_in<std::int64_t>("vocab", 16, 2, 1 << 20);
                   auto max_length = c.number_in<std::int64_t>("max_length", 5, 1, 1 << 16);
                   return [=](const BuildContext&) { return std::make_shared<Sequences>(n, vocab, max_length); };
                 });
}

}  // namespace

REFIT_PLUGIN("two_input", "1.0.0", register_two_input)
