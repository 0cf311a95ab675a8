// The `bert` model (plugin "text") against transformers' BertModel on the real
// all-MiniLM-L6-v2 weights: one padded batch of eight sentences of varied lengths (one a
// sentence pair); token states, pooler output and sentence-transformers' normalised mean
// pooling. Fixture: tests/golden/make_bert.py.
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "core/plugin_loader.h"
#include "io/adapter_files.h"
#include "io/safetensors.h"
#include "model/model_registry.h"
#include "model/weights.h"
#include "refit/adapter.h"
#include "refit/autocast.h"
#include "refit/layer_targets.h"
#include "data_support.h"
#include "minilm_depth.h"
#include "numeric_bounds.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_bert {

using namespace refit;
using namespace refit::test;
namespace fs = std::filesystem;

namespace {

fs::path minilm_dir() { return fs::path(test::env_path("REFIT_MINILM_DIR")); }

ModelPtr build_minilm(Registry& registry, Json extra = Json::object()) {
  Json config{{"config_file", (minilm_dir() / "config.json").string()}, {"output", "mean"}, {"normalize", true}};
  for (auto& [k, v] : extra.items()) config[k] = v;
  auto issues = std::make_shared<ConfigIssues>();
  auto builder = registry.models.parse("bert", "/type", ConfigReader(config, "/config", issues));
  if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
  ModelPtr model = builder(BuildContext{});
  load_weights(*model, minilm_dir() / "model.safetensors", "minilm");  // strict: every key, the position ids too
  return model;
}

double max_abs_real(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask) {
  // Token states at padding positions carry no meaning: compare real tokens.
  const auto real = mask.to(torch::kBool);
  return (a.to(torch::kFloat).index({real}) - b.index({real})).abs().max().item<double>();
}

/// The model in double: floating parameters and buffers only (Module::to(dtype) would also cast
/// the integer position ids that index the embedding).
void to_double(Model& model) {
  for (auto& p : model.named_parameters()) p.value().set_data(p.value().to(torch::kDouble));
  for (auto& b : model.named_buffers())
    if (b.value().is_floating_point()) b.value().set_data(b.value().to(torch::kDouble));
}

}  // namespace

TEST_CASE("bert: all-MiniLM-L6-v2 matches transformers' BertModel on a padded batch (fp32, golden)") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("text");
  ModelPtr model = build_minilm(registry);
  model->eval();
  auto golden = io::SafetensorsFile::open(fs::path(test::source_dir()) / "tests/golden/bert/minilm.safetensors");
  Fields batch{{"input_ids", golden.load("input_ids")},
               {"attention_mask", golden.load("attention_mask")},
               {"token_type_ids", golden.load("token_type_ids")}};
  REQUIRE(batch.at("input_ids").size(0) == 8);
  const torch::Tensor mask = batch.at("attention_mask");
  torch::NoGradGuard no_grad;
  Fields out = model->run(batch);
  const double states = max_abs_real(out.at("last_hidden_state"), golden.load("last_hidden_state"), mask);
  const double pooled = (out.at("pooler_output") - golden.load("pooler_output")).abs().max().item<double>();
  const double embedding = (out.at("features") - golden.load("sentence_embedding")).abs().max().item<double>();
  std::printf("bert MiniLM fp32: token states %.3g, pooler %.3g, sentence embedding %.3g (max abs diff)\n", states, pooled,
              embedding);
  // Refit's and transformers' outputs are each within the probabilistic first-order bound
  // gamma~_n(2^-24) max |exact| of the exact forward (refit's MiniLM in double on the same batch):
  // token states (real tokens) at depth minilm_states_depth, the pooler (dense H + 1, tanh 1) and
  // the sentence embedding (minilm_features_depth).
  {
    ModelPtr exact_model = build_minilm(registry);
    exact_model->eval();
    to_double(*exact_model);
    Fields exact = exact_model->run(batch);
    const std::int64_t T = mask.size(1);
    const auto real = mask.to(torch::kBool);
    struct Output {
      std::string name, golden;
      std::int64_t depth;
      bool tokens;
    };
    for (const Output& o : {Output{"last_hidden_state", "last_hidden_state", minilm_states_depth(minilm_dir(), T), true},
                            Output{"pooler_output", "pooler_output", minilm_states_depth(minilm_dir(), T) + 384 + 2, false},
                            Output{"features", "sentence_embedding", minilm_features_depth(minilm_dir(), T), false}}) {
      auto pick = [&](const torch::Tensor& t) { return o.tokens ? t.index({real}) : t; };
      const torch::Tensor e = pick(exact.at(o.name));
      const double bound = prob_depth_bound(o.depth, torch::kFloat) * e.abs().max().item<double>();
      const double ours = (pick(out.at(o.name)).to(torch::kDouble) - e).abs().max().item<double>() / bound;
      const double theirs = (pick(golden.load(o.golden)).to(torch::kDouble) - e).abs().max().item<double>() / bound;
      std::printf("bert MiniLM fp32 %s: error / bound refit %.3g, transformers %.3g (n %lld)\n", o.name.c_str(), ours,
                  theirs, static_cast<long long>(o.depth));
      check_bound_ratio(o.name + ": refit", ours);
      check_bound_ratio(o.name + ": transformers", theirs);
    }
  }

  // Frozen in bf16 under bf16 autocast, as the recipes run it: the error is reported.
  ModelSpec spec;
  spec.name = "minilm";
  spec.trainable = false;
  spec.dtype = c10::kBFloat16;
  ModelRegistry models(Precision::bf16_mixed);
  models.add(model, spec, torch::kCPU);
  Fields low;
  {
    AutocastGuard autocast(c10::DeviceType::CPU, c10::kBFloat16, true);
    low = model->run(batch);
  }
  const double states_bf16 = max_abs_real(low.at("last_hidden_state"), golden.load("last_hidden_state"), mask);
  const double embedding_bf16 =
      (low.at("features").to(torch::kFloat) - golden.load("sentence_embedding")).abs().max().item<double>();
  const double cosine =
      at::cosine_similarity(low.at("features").to(torch::kFloat), golden.load("sentence_embedding"), 1).min().item<double>();
  std::printf("bert MiniLM bf16 weights + bf16 autocast: token states %.3g, sentence embedding %.3g (max abs diff), "
              "min cosine %.6f\n",
              states_bf16, embedding_bf16, cosine);
  CHECK(cosine > 0.99);
}

TEST_CASE("bert: all-MiniLM-L6-v2's mean pooling without normalize is each sentence's mean over its real tokens on a "
          "padded batch (fp32, derived bound)") {
  // The embedding a head sees with "normalize": false. Normalising hides a per-row factor (the
  // tests above normalise): dividing by the padded length instead of the sentence's, or summing
  // the padding's states, would pass them.
  Registry registry;
  PluginLoader loader(registry);
  loader.load("text");
  ModelPtr model = build_minilm(registry, Json{{"normalize", false}});
  model->eval();
  auto golden = io::SafetensorsFile::open(fs::path(test::source_dir()) / "tests/golden/bert/minilm.safetensors");
  Fields batch{{"input_ids", golden.load("input_ids")},
               {"attention_mask", golden.load("attention_mask")},
               {"token_type_ids", golden.load("token_type_ids")}};
  torch::NoGradGuard no_grad;
  const Fields out = model->run(batch);
  const torch::Tensor features = out.at("features");
  REQUIRE(features.scalar_type() == torch::kFloat);
  const torch::Tensor states = out.at("last_hidden_state").to(torch::kDouble);  // [B, T, D], refit's own
  const torch::Tensor real = batch.at("attention_mask").to(torch::kDouble).unsqueeze(-1);
  const torch::Tensor count = real.sum(1);  // [B, 1]: each sentence's real tokens
  const std::int64_t T = states.size(1);
  REQUIRE((count < T).sum().item<std::int64_t>() >= 4);  // most rows carry padding
  // The reference: each sentence's mean over its real tokens, in double from the model's float32
  // token states (exact inputs). refit pools in float32: a sum over the T positions (T - 1
  // roundings; the padding's terms are exact zeros) and one division, depth T + 1, so each
  // element is within gamma_{T+1}(2^-24) x (the mean of |state| over the real tokens) of it, plus
  // the double reference's own gamma_{T+1}(2^-53) (numeric_bounds.h, depth_bound).
  const torch::Tensor exact = (states * real).sum(1) / count;
  const torch::Tensor bound = depth_bound(T + 1, torch::kFloat) * (states.abs() * real).sum(1) / count;
  const double ratio = bound_ratio(features, exact, bound);
  // Where the planted bugs land against the same bound (scripts/mutants 06 and 39).
  const double over_padded_length = bound_ratio((states * real).sum(1) / static_cast<double>(T), exact, bound);
  const double summing_padding = bound_ratio(states.sum(1) / count, exact, bound);
  std::printf("bert MiniLM mean pooling, normalize false: max |features - exact| / bound %.3g (bound %.3g at most); "
              "dividing by the padded length %.3g, summing the padding %.3g\n",
              ratio, bound.max().item<double>(), over_padded_length, summing_padding);
  CHECK(ratio <= 1);
  CHECK(over_padded_length > 1);
  CHECK(summing_padding > 1);
  // Not normalised: MiniLM's mean token state is far from unit length.
  CHECK((features.norm(2, {1}) - 1).abs().min().item<double>() > 0.1);
}

TEST_CASE("bert: the checkpoint's names load strictly, wrong shapes and over-long sequences are clear errors") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("text");
  // Another architecture than the file's: the strict loader names the mismatches.
  CHECK_THROWS_WITH(build_minilm(registry, Json{{"num_hidden_layers", 4}}),
                    Catch::Contains("unexpected in the file (32)") &&
                        Catch::Contains("encoder.layer.4.attention.output.dense.weight"));
  ModelPtr model = build_minilm(registry);
  Fields too_long{{"input_ids", torch::ones({1, 513}, torch::kLong)},
                  {"attention_mask", torch::ones({1, 513}, torch::kLong)},
                  {"token_type_ids", torch::zeros({1, 513}, torch::kLong)}};
  CHECK_THROWS_WITH(model->run(too_long), Catch::Contains("longer than max_position_embeddings (512)"));
  Fields mismatched{{"input_ids", torch::ones({2, 4}, torch::kLong)},
                    {"attention_mask", torch::ones({2, 5}, torch::kLong)},
                    {"token_type_ids", torch::zeros({2, 4}, torch::kLong)}};
  CHECK_THROWS_WITH(model->run(mismatched), Catch::Contains("of one shape [batch, length]"));
}

TEST_CASE("bert: refit writes a MiniLM LoRA adapter that PEFT loads completely onto transformers' BertModel (golden)") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("text");
  loader.load("lora");
  const fs::path dir = fs::path(test::source_dir()) / "tests/golden/bert/refit_written";
  auto golden = io::SafetensorsFile::open(fs::path(test::source_dir()) / "tests/golden/bert/minilm.safetensors");
  Fields batch{{"input_ids", golden.load("input_ids")},
               {"attention_mask", golden.load("attention_mask")},
               {"token_type_ids", golden.load("token_type_ids")}};
  auto with_lora = [&] {
    ModelPtr model = build_minilm(registry);
    model->eval();
    auto issues = std::make_shared<ConfigIssues>();
    AdapterPtr lora =
        registry.adapters.parse("lora", "/type",
                                ConfigReader(Json{{"r", 2},
                                                  {"alpha", 4},
                                                  {"target_regex",
                                                   "encoder\\.layer\\.[0-9]+\\.attention\\.self\\.(query|value)"}},
                                             "/config", issues))(BuildContext{});
    REQUIRE(issues->empty());
    lora->attach(*model);
    return std::make_pair(model, lora);
  };
  auto [model, lora] = with_lora();
  {
    // Factors of their own (B non-zero, so the adapter changes the output), deterministic.
    torch::NoGradGuard ng;
    double k = 1;
    for (auto& p : model->named_parameters())
      if (p.key().find(".lora_default.") != std::string::npos) {
        auto& t = p.value();
        t.copy_((torch::arange(t.numel(), torch::kFloat) * 0.37 * k + k).sin().reshape(t.sizes()) * 0.05);
        k += 1;
      }
  }
  AdapterFiles files = lora->export_files(*model);
  REQUIRE(files.tensors.size() == 24);  // 6 layers x (query, value) x (A, B)
  CHECK(files.tensors.count("base_model.model.encoder.layer.5.attention.self.value.lora_B.weight") == 1);
  torch::Tensor y, merged_y;
  {
    torch::NoGradGuard ng;
    y = model->run(batch).at("features");  // the normalised mean over the real tokens' states
    lora->merge(*model);
    merged_y = model->run(batch).at("features");
    lora->unmerge(*model);
  }
  if (std::getenv("REFIT_REGENERATE_GOLDEN")) {
    io::write_adapter_files(dir, files);
    io::save_safetensors(dir / "refit_output.safetensors", {{"y", y}, {"merged_y", merged_y}}, {{"format", "pt"}});
  }
  // What PEFT loaded completely (asserted by tests/golden/make_bert_peft.py) is what refit writes.
  auto verified = io::read_adapter_files(dir);
  CHECK(verified.config == files.config);
  REQUIRE(verified.tensors.size() == files.tensors.size());
  for (const auto& kv : files.tensors) CHECK(torch::equal(verified.tensors.at(kv.first), kv.second));
  auto peft = io::SafetensorsFile::open(dir / "peft_output.safetensors");
  const double err = (y - peft.load("y")).abs().max().item<double>();
  const double merged_err = (merged_y - peft.load("merged_y")).abs().max().item<double>();
  std::printf("bert MiniLM LoRA: refit-written adapter, refit vs PEFT on BertModel max abs error %.3g, merged %.3g\n", err,
              merged_err);
  // The reference: the exact forward (refit's MiniLM in double, these factors), which refit's and
  // PEFT's outputs, unmerged and merged, must each be within gamma~_n(2^-24) * max |exact| of (a
  // first-order bound, n = minilm_features_depth with the LoRA of rank 2). Merging moves the LoRA
  // product into the weight (r + 3, within the LoRA path's count).
  {
    auto [exact_model, exact_lora] = with_lora();
    exact_lora->import_files(*exact_model, files);
    torch::NoGradGuard ng;
    to_double(*exact_model);
    const auto exact = exact_model->run(batch).at("features");
    const std::int64_t n = minilm_features_depth(minilm_dir(), batch.at("input_ids").size(1), /*r=*/2);
    const double bound = prob_depth_bound(n, torch::kFloat) * exact.abs().max().item<double>();
    for (const auto& [who, t] : std::vector<std::pair<std::string, torch::Tensor>>{
             {"refit", y}, {"refit merged", merged_y}, {"PEFT", peft.load("y")}, {"PEFT merged", peft.load("merged_y")}}) {
      const double e = (t.to(torch::kDouble) - exact).abs().max().item<double>();
      std::printf("bert MiniLM LoRA: %s max |y - exact| %.3g, bound %.3g (n = %lld)\n", who.c_str(), e, bound,
                  static_cast<long long>(n));
      check_bound_ratio("features: " + who, e / bound);
    }
  }
  // refit reads its own file back.
  auto [model2, lora2] = with_lora();
  lora2->import_files(*model2, files);
  torch::NoGradGuard ng;
  CHECK(torch::equal(model2->run(batch).at("features"), y));
  // The adapter changes the model: without it the embedding is the base model's.
  lora2->set_active(*model2, false);
  CHECK((model2->run(batch).at("features") - y).abs().max().item<double>() > 1e-3);
}

TEST_CASE("bert: QLoRA on all-MiniLM-L6-v2 (NF4, double quantization) gives PEFT + bitsandbytes' loss and every "
          "LoRA gradient (golden)") {
  // tests/golden/make_minilm_qlora.py: the MiniLM LoRA recipe's backbone with bitsandbytes' NF4
  // Linear4bit layers (fp32 compute) under PEFT's LoRA, fixed factors, a 6-class head on the
  // normalised mean pooling, cross-entropy on the padded batch of minilm.safetensors.
  Registry registry;
  PluginLoader loader(registry);
  loader.load("text");
  loader.load("lora");
  const fs::path dir = fs::path(test::source_dir()) / "tests/golden/bert";
  auto fixture = io::SafetensorsFile::open(dir / "minilm_qlora.safetensors");
  auto golden = io::SafetensorsFile::open(dir / "minilm.safetensors");
  Fields batch{{"input_ids", golden.load("input_ids")},
               {"attention_mask", golden.load("attention_mask")},
               {"token_type_ids", golden.load("token_type_ids")}};
  const torch::Tensor labels = fixture.load("labels");
  const Json recipe = Json::parse(std::ifstream(fs::path(test::source_dir()) / "recipes/text/minilm-lora-bf16.json"));
  const Json lora_config = recipe.at("models").at(0).at("adapters").at(0).at("config");
  auto build = [&](bool nf4) {
    ModelPtr m = build_minilm(registry);
    m->eval();
    auto issues = std::make_shared<ConfigIssues>();
    AdapterPtr lora = registry.adapters.parse("lora", "/type", ConfigReader(lora_config, "/config", issues))(BuildContext{});
    REQUIRE(issues->empty());
    lora->attach(*m);
    {
      torch::NoGradGuard ng;
      for (auto& p : m->named_parameters())
        if (p.key().find(".lora_default.") != std::string::npos) p.value().copy_(fixture.load("lora." + p.key()));
    }
    auto models = std::make_unique<ModelRegistry>(Precision::fp32);
    if (nf4) {
      ModelSpec spec;
      spec.name = "backbone";
      spec.trainable = false;
      spec.dtype = c10::kFloat;     // the compute dtype: bitsandbytes' compute_dtype float32
      spec.storage.format = "nf4";  // blocks of 64, double quantization: the defaults
      for (auto& rule : lora->parameter_rules()) spec.rules.push_back(rule);
      models->add(m, spec, torch::kCPU);  // quantizes the Linear weights
    } else {
      for (auto& p : m->named_parameters()) p.value().set_requires_grad(p.key().find(".lora_default.") != std::string::npos);
    }
    return std::make_tuple(m, lora, std::move(models));
  };
  auto [qm, qlora, qreg] = build(true);
  // The exact reference: the same model, unregistered (the registry casts to the declared
  // dtype), each projection's weight replaced by its NF4 values (exact in fp64), in double.
  auto [em, elora, ereg] = build(false);
  {
    torch::NoGradGuard ng;
    auto ql = adaptable_layers(*qm), el = adaptable_layers(*em);
    REQUIRE(ql.size() == el.size());
    std::size_t quantized = 0;
    for (std::size_t i = 0; i < ql.size(); ++i) {
      quantized += ql[i].second->quantized_weight() != nullptr;
      el[i].second->weight.copy_(ql[i].second->dense_weight());
    }
    CHECK(quantized == 37);  // 6 layers x (q, k, v, attention output, intermediate, output), the pooler
  }
  to_double(*em);
  auto loss_of = [&](Model& m, const torch::Tensor& w, const torch::Tensor& b) {
    const Fields out = m.run(batch);
    torch::Tensor features = out.at("features");
    if (w.scalar_type() == torch::kDouble) {
      // The exact side pools in double (bert's pooling computes in fp32): the normalised mean
      // of the real tokens' states.
      const torch::Tensor mask = batch.at("attention_mask").unsqueeze(-1).to(torch::kDouble);
      const torch::Tensor mean = (out.at("last_hidden_state") * mask).sum(1) / mask.sum(1);
      features = mean / mean.norm(2, 1, true);
    }
    return at::cross_entropy_loss(at::linear(features, w, b), labels, {}, at::Reduction::Mean, -100);
  };
  const torch::Tensor w32 = fixture.load("head.weight").requires_grad_(true),
                      b32 = fixture.load("head.bias").requires_grad_(true);
  const torch::Tensor w64 = fixture.load("head.weight").to(torch::kDouble).requires_grad_(true),
                      b64 = fixture.load("head.bias").to(torch::kDouble).requires_grad_(true);
  const torch::Tensor loss = loss_of(*qm, w32, b32), exact_loss = loss_of(*em, w64, b64);
  loss.backward();
  exact_loss.backward();
  // Depth (numeric_bounds.h): the sentence embedding with LoRA of rank r on the projections
  // (minilm_features_depth), the head (H + 1), the cross-entropy (log-softmax over C classes:
  // C + 4) and the batch mean (B + 1); a gradient runs the forward and back through the same
  // operations (2 n_loss) and sums over the B T positions a weight sees.
  const std::int64_t B = labels.size(0), T = batch.at("input_ids").size(1), H = 384, C = 6;
  const std::int64_t n_features = minilm_features_depth(minilm_dir(), T, lora_config.at("r").get<std::int64_t>());
  const std::int64_t n_loss = n_features + (H + 1) + (C + 4) + (B + 1);
  const std::int64_t n_grad = 2 * n_loss + B * T;
  // The loss within g_n_loss of itself (first order, as the gradients below). It is insensitive to
  // the features' errors (normalised features through a small head): the measured difference is
  // a fraction of the loss's last bit, far under any bound derived from the depth.
  const double loss_bound = prob_depth_bound(n_loss, torch::kFloat) * exact_loss.item<double>();
  const double ours_loss = std::abs(loss.item<double>() - exact_loss.item<double>()) / loss_bound;
  const double theirs_loss = std::abs(fixture.load("loss").item<double>() - exact_loss.item<double>()) / loss_bound;
  const double gg = prob_depth_bound(n_grad, torch::kFloat);
  double ours = 0, theirs = 0;
  std::string worst;
  std::size_t compared = 0;
  auto exact_params = em->named_parameters();
  auto compare = [&](const std::string& name, const torch::Tensor& mine, const torch::Tensor& exact) {
    REQUIRE(mine.defined());
    const double bound = gg * exact.abs().max().item<double>();
    const double r = (mine.to(torch::kDouble) - exact).abs().max().item<double>() / bound;
    const double t = (fixture.load("grad." + name).to(torch::kDouble) - exact).abs().max().item<double>() / bound;
    if (r > ours) ours = r, worst = name;
    theirs = std::max(theirs, t);
    ++compared;
  };
  for (const auto& p : qm->named_parameters()) {
    if (p.key().find(".lora_default.") == std::string::npos) continue;
    compare("lora." + p.key(), p.value().grad(), exact_params[p.key()].grad());
  }
  compare("head.weight", w32.grad(), w64.grad());
  compare("head.bias", b32.grad(), b64.grad());
  std::printf("MiniLM QLoRA (NF4, double quantization) vs PEFT + bitsandbytes: loss refit %.6f, bitsandbytes %.6f; "
              "error / bound: loss refit %.3g, bitsandbytes %.3g; %zu gradients: refit %.3g (worst %s), bitsandbytes "
              "%.3g (depth %lld, gradients %lld)\n",
              loss.item<double>(), fixture.load("loss").item<double>(), ours_loss, theirs_loss, compared, ours,
              worst.c_str(), theirs, static_cast<long long>(n_loss), static_cast<long long>(n_grad));
  CHECK(compared == 74);  // 36 layers x (A, B) and the head's two
  check_bound_ratio("loss: refit", ours_loss);
  check_bound_ratio("loss: bitsandbytes", theirs_loss);
  check_bound_ratio("gradients: refit", ours);
  check_bound_ratio("gradients: bitsandbytes", theirs);
}

}  // namespace refit_test_bert
