// Quantized frozen weights inside the SDK's Linear (refit/layers.h, framework/quant/
// quantized_weight.h) and the registry's declared storage ("dtype": "nf4" / "int8" / "gguf"): the layer's
// product and its input gradient equal the dense layer's with the dequantized weight; the
// registry refuses a trainable quantized model and a blocksize the width does not allow; QLoRA on
// the tiny Llama gives the loss and every LoRA gradient of the dense model holding the same
// dequantized weights; a merge dequantizes first.
#include <ATen/ATen.h>

#include "core/plugin_loader.h"
#include "io/safetensors.h"
#include "llm/llama.h"
#include "model/model_registry.h"
#include "model/weights.h"
#include "precision/few_rows_bf16.h"
#include "quant/quantized_weight.h"
#include "refit/adapter.h"
#include "refit/autocast.h"
#include "refit/layer_targets.h"
#include "numeric_bounds.h"
#include "quantized_test_weights.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_quantized_layers {

using namespace refit;
using namespace refit::test;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<nn::Linear> seeded_linear(std::int64_t in, std::int64_t out) {
  torch::manual_seed(7);
  return std::make_shared<nn::Linear>(in, out, /*with_bias=*/true);
}

}  // namespace

TEST_CASE("quantized layers: an NF4, int8 or GGUF-block Linear computes the dense product of its dequantized weight, "
          "forward and backward, holding no weight parameter") {
  for (const std::string format : {"nf4", "int8", "q4_1"}) {
    INFO(format);
    auto q = seeded_linear(256, 96);
    auto dense = seeded_linear(256, 96);
    const auto w = test::quantized_weight_for(format, q->weight, torch::kFloat);
    q->set_quantized_weight(w);
    {
      torch::NoGradGuard ng;
      dense->weight.copy_(w->dequantize(torch::kFloat));
    }
    // The module holds the packed buffers, not the weight.
    CHECK(q->named_parameters().size() == 1);  // the bias
    CHECK(q->named_parameters().contains("bias"));
    CHECK_FALSE(q->weight.defined());
    CHECK(q->named_buffers().contains("weight_" + format + "." +
                                      (format == "nf4"    ? "packed"
                                       : format == "int8" ? "weight"
                                                          : "blocks")));
    CHECK(q->weight_shape() == std::vector<std::int64_t>{96, 256});
    CHECK(w->bytes() < 96 * 256 * (format == "int8" ? 2 : 1));

    const torch::Tensor x = torch::randn({3, 5, 256}).requires_grad_(true);
    const torch::Tensor x2 = x.detach().clone().requires_grad_(true);
    const torch::Tensor y = q->forward(x), y2 = dense->forward(x2);
    CHECK(torch::equal(y, y2));  // the same at::linear on the same values
    CHECK(std::string(y.grad_fn()->name()).find("QuantizedLinear") != std::string::npos);
    const torch::Tensor g = torch::randn({3, 5, 96});
    y.backward(g);
    y2.backward(g);
    // The input gradient: g W in both, computed by matmul here and by linear's backward there
    // (each within gamma_96(2^-24) max |g| |W| of exact): twice that of each other.
    const double bound = 2 * gamma_n(96, kUnitFp32) * (g.abs().matmul(dense->weight.abs())).max().item<double>();
    CHECK((x.grad() - x2.grad()).abs().max().item<double>() <= bound);
    CHECK((q->bias.grad() - dense->bias.grad()).abs().max().item<double>() <=
          2 * gamma_n(15, kUnitFp32) * g.abs().sum(c10::IntArrayRef{0, 1}).max().item<double>());

    // make_dense() brings the weight back as a frozen parameter with the dequantized values.
    q->make_dense(torch::kFloat);
    CHECK(q->named_parameters().contains("weight"));
    CHECK_FALSE(q->weight.requires_grad());
    CHECK(torch::equal(q->weight, dense->weight.detach()));
    CHECK(q->named_buffers().size() == 0);
  }
}

TEST_CASE("quantized layers: under InferenceMode an NF4, int8 or GGUF-block Linear's few-row bf16 product reads the "
          "packed weight, with the dense product's numbers") {
  for (const std::string format : {"nf4", "int8", "q4_1"}) {
    INFO(format);
    auto q = seeded_linear(256, 96);
    {
      torch::NoGradGuard ng;
      q->bias.set_data(q->bias.to(torch::kBFloat16));
    }
    const auto w = test::quantized_weight_for(format, q->weight, torch::kBFloat16);
    q->set_quantized_weight(w);
    const torch::Tensor x = torch::randn({2, 3, 256}).to(torch::kBFloat16);
    torch::Tensor fused;
    {
      c10::InferenceMode im;
      fused = q->forward(x);
    }
    CHECK(fused.sizes() == c10::IntArrayRef({2, 3, 96}));
    CHECK(fused.scalar_type() == torch::kBFloat16);
    {
      // No rows: the dequantizing product, an empty result.
      c10::InferenceMode im;
      CHECK(q->forward(torch::zeros({0, 256}, torch::kBFloat16)).sizes() == c10::IntArrayRef({0, 96}));
    }
    if (!precision::few_rows_int8_fits(x.reshape({6, 256}), 96, 256))
      return;  // no AVX2 here: the dequantizing product ran, checked by the cases above
    // The kernel's numbers: the FMA loop of its width on the dequantized bf16 weight, bit for bit.
    const auto isa = precision::few_rows_isa() == precision::FewRowsIsa::avx2 ? precision::FewRowsIsa::avx2
                                                                              : precision::FewRowsIsa::avx512;
    const torch::Tensor dense = w->dequantize(torch::kBFloat16);
    CHECK(torch::equal(fused.reshape({6, 96}), precision::few_rows_bf16_mm(x.reshape({6, 256}), dense.t(), q->bias, isa)));
  }
}

TEST_CASE("quantized layers: bf16 compute under autocast, as QLoRA runs it") {
  auto q = seeded_linear(128, 64);
  q->set_quantized_weight(quant::make_nf4_weight(q->weight, {}, torch::kBFloat16));
  q->bias.set_data(q->bias.to(torch::kBFloat16));
  const torch::Tensor x = torch::randn({4, 128}, torch::kFloat).requires_grad_(true);
  AutocastGuard autocast(c10::DeviceType::CPU, c10::kBFloat16, true);
  const torch::Tensor y = q->forward(x);
  CHECK(y.scalar_type() == torch::kBFloat16);
  y.sum().backward();
  CHECK(x.grad().scalar_type() == torch::kFloat);
  CHECK(x.grad().isfinite().all().item<bool>());
}

TEST_CASE("quantized layers: the registry quantizes a frozen model's Linear weights and refuses what cannot work") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("llm");
  auto make = [&] {
    auto issues = std::make_shared<ConfigIssues>();
    const auto dir = fs::path(test::source_dir()) / "tests/golden/llama/tiny_llama";
    ModelPtr m = registry.models.parse("llama", "/type",
                                       ConfigReader(Json{{"config_file", (dir / "config.json").string()}}, "/config",
                                                    issues))(BuildContext{});
    REQUIRE(issues->empty());
    load_weights(*m, dir / "model.safetensors", "tiny");
    return m;
  };
  ModelSpec spec;
  spec.name = "base";
  spec.trainable = true;
  spec.dtype = c10::kBFloat16;
  spec.storage.format = "nf4";
  {
    ModelRegistry models(Precision::bf16_mixed);
    CHECK_THROWS_WITH(models.add(make(), spec, torch::kCPU), Contains("stores the weights quantized, which cannot train"));
  }
  spec.trainable = false;
  spec.storage.blocksize = 128;  // the tiny model's width is 64
  {
    ModelRegistry models(Precision::bf16_mixed);
    CHECK_THROWS_WITH(models.add(make(), spec, torch::kCPU),
                      Contains("layer \"model.layers.0.self_attn.q_proj\": its input width 64 is not a multiple of the "
                               "NF4 blocksize 128"));
  }
  spec.storage.blocksize = 32;
  ModelRegistry models(Precision::bf16_mixed);
  ModelPtr m = make();
  models.add(m, spec, torch::kCPU);
  std::size_t quantized = 0;
  for (auto& [path, layer] : adaptable_layers(*m)) quantized += layer->quantized_weight() != nullptr;
  CHECK(quantized == 14);  // 2 layers x (q, k, v, o, gate, up, down)
  for (const auto& p : models.models().front().parameters) {
    INFO(p.path);
    CHECK(p.path.find("_proj.weight") == std::string::npos);  // the projections' weights are packed, not parameters
    CHECK(p.tensor.scalar_type() == torch::kBFloat16);        // norms and embeddings in the declared dtype
  }
  for (const auto& b : m->named_buffers())
    if (b.key().find(".absmax") != std::string::npos && b.key().find("absmax_scale") == std::string::npos)
      CHECK(b.value().scalar_type() == torch::kUInt8);  // double-quantized maxima stay 8-bit
}

TEST_CASE("quantized layers: QLoRA on the tiny Llama gives the dense model's loss and LoRA gradients for the same "
          "dequantized weights, and a merge dequantizes first") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("llm");
  loader.load("lora");
  const auto dir = fs::path(test::source_dir()) / "tests/golden/llama/tiny_llama";
  auto fixture = io::SafetensorsFile::open(dir / "golden.safetensors");
  const torch::Tensor ids = fixture.load("input_ids_right"), mask = fixture.load("attention_mask_right");
  auto build = [&](ModelSpec spec) {
    auto issues = std::make_shared<ConfigIssues>();
    ModelPtr m = registry.models.parse("llama", "/type",
                                       ConfigReader(Json{{"config_file", (dir / "config.json").string()}}, "/config",
                                                    issues))(BuildContext{});
    load_weights(*m, dir / "model.safetensors", "tiny");
    AdapterPtr lora = registry.adapters.parse(
        "lora", "/type",
        ConfigReader(Json{{"r", 4}, {"alpha", 8}, {"target_modules", {"q_proj", "v_proj", "down_proj"}}}, "/config",
                     issues))(BuildContext{});
    REQUIRE(issues->empty());
    lora->attach(*m);
    {
      torch::NoGradGuard ng;
      double k = 1;
      for (auto& p : m->named_parameters())
        if (p.key().find(".lora_default.") != std::string::npos)
          p.value().copy_((torch::arange(p.value().numel(), torch::kFloat) * 0.37 * k++).sin().reshape(p.value().sizes()) *
                          0.05);
    }
    for (auto& rule : lora->parameter_rules()) spec.rules.push_back(rule);
    auto models = std::make_unique<ModelRegistry>(Precision::fp32);
    models->add(m, spec, torch::kCPU);
    return std::make_tuple(m, lora, std::move(models));
  };
  ModelSpec spec;
  spec.name = "lm";
  spec.trainable = false;
  spec.dtype = c10::kFloat;
  spec.storage.format = "nf4";
  spec.storage.blocksize = 32;
  auto [qm, qlora, qreg] = build(spec);
  // The dense reference: the same model, each projection's weight replaced by the NF4 values.
  ModelSpec dense_spec = spec;
  dense_spec.storage = WeightStorage{};
  auto [dm, dlora, dreg] = build(dense_spec);
  {
    torch::NoGradGuard ng;
    auto ql = adaptable_layers(*qm), dl = adaptable_layers(*dm);
    REQUIRE(ql.size() == dl.size());
    for (std::size_t i = 0; i < ql.size(); ++i) dl[i].second->weight.copy_(ql[i].second->dense_weight());
  }
  auto loss_of = [&](Model& m) {
    const torch::Tensor logits = m.run(Fields{{"input_ids", ids}, {"attention_mask", mask}}).at("logits");
    const std::int64_t t = ids.size(1), v = logits.size(-1);
    const torch::Tensor labels = ids.masked_fill(mask == 0, -100);
    return at::cross_entropy_loss(logits.narrow(1, 0, t - 1).reshape({-1, v}), labels.narrow(1, 1, t - 1).reshape(-1), {},
                                  at::Reduction::Mean, -100);
  };
  const torch::Tensor ql = loss_of(*qm), dl = loss_of(*dm);
  ql.backward();
  dl.backward();
  // The same operations on the same values: the quantized layer's forward is at::linear on the
  // dequantized weight, its backward the same mm that linear's backward runs (matmul folds the
  // batch into rows as linear does). Losses and every LoRA gradient are equal, bit for bit.
  CHECK(ql.item<double>() == dl.item<double>());
  auto dense_params = dm->named_parameters();
  std::size_t compared = 0, equal = 0;
  for (const auto& p : qm->named_parameters()) {
    if (p.key().find(".lora_") == std::string::npos) continue;
    const torch::Tensor g = p.value().grad(), e = dense_params[p.key()].grad();
    REQUIRE(g.defined());
    INFO(p.key());
    CHECK(torch::equal(g, e));
    equal += torch::equal(g, e);
    ++compared;
  }
  std::printf("QLoRA tiny Llama (NF4 blocks of 32): loss %.6f, equal to the dense model's on the same values; %zu of "
              "%zu LoRA gradients equal bit for bit\n",
              ql.item<double>(), equal, compared);
  CHECK(compared == 12);  // 2 layers x (q, v, down) x (A, B)

  // A merge dequantizes the layer, then adds the delta: the merged model's logits are the
  // unmerged ones (within the merge's rounding).
  torch::NoGradGuard ng;
  const torch::Tensor before = qm->run(Fields{{"input_ids", ids}, {"attention_mask", mask}}).at("logits");
  qlora->merge(*qm);
  std::size_t still = 0;
  for (auto& [path, layer] : adaptable_layers(*qm)) still += layer->quantized_weight() != nullptr;
  CHECK(still == 14 - 6);  // the 6 adapted layers are dense now, the others stay packed
  const torch::Tensor after = qm->run(Fields{{"input_ids", ids}, {"attention_mask", mask}}).at("logits");
  CHECK((after - before).abs().max().item<double>() < 1e-4);
}

TEST_CASE("quantized layers: \"dtype\": \"gguf\" keeps a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks as read: the values "
          "transformers reads, the dense bf16 model's logits, the file's bytes") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("llm");
  auto build = [&](const std::string& gguf, const ModelSpec& spec) {
    auto issues = std::make_shared<ConfigIssues>();
    ModelPtr m =
        registry.models.parse("llama", "/type", ConfigReader(Json{{"gguf", gguf}}, "/config", issues))(BuildContext{});
    REQUIRE(issues->empty());
    load_weights(*m, gguf, spec.name, weight_targets(spec, *m));
    auto models = std::make_unique<ModelRegistry>(Precision::bf16_mixed);
    models->add(m, spec, torch::kCPU);
    m->eval();
    return std::make_pair(m, std::move(models));
  };
  ModelSpec spec;
  spec.name = "lm";
  spec.trainable = false;
  spec.dtype = c10::kFloat;
  spec.storage.format = "gguf";

  // The tiny Llama GGUF (tests/golden/make_gguf.py): q in Q8_0, k in Q4_0 (both rows permuted by
  // llama.cpp's converter), the rest Q4_1 and F32. Each kept weight dequantizes to what
  // transformers reads from the file, un-permuted, bit for bit.
  {
    const std::string tiny = (fs::path(test::source_dir()) / "tests/golden/gguf/tiny_llama.gguf").string();
    auto want =
        io::SafetensorsFile::open(fs::path(test::source_dir()) / "tests/golden/gguf/tiny_llama.expected.safetensors");
    auto [m, models] = build(tiny, spec);
    std::map<std::string, std::size_t> formats;
    for (auto& [path, layer] : adaptable_layers(*m)) {
      INFO(path);
      if (!layer->quantized_weight()) continue;
      ++formats[layer->quantized_weight()->format()];
      CHECK(torch::equal(layer->dense_weight(), want.load(path + ".weight")));
    }
    CHECK(formats["q8_0"] >= 1);
    CHECK(formats["q4_0"] >= 1);
    CHECK(formats["q4_1"] >= 1);
  }

  // SmolLM2-135M-Instruct (Q4_1 projections): the same weights, the same logits as the model
  // read dense in bf16, in 20 / 64 of its bytes.
  const std::string gguf = test::env_path("REFIT_SMOLLM2_GGUF");
  spec.dtype = c10::kBFloat16;
  auto [qm, qreg] = build(gguf, spec);
  ModelSpec dense_spec = spec;
  dense_spec.storage = WeightStorage{};
  auto [dm, dreg] = build(gguf, dense_spec);
  auto ql = adaptable_layers(*qm), dl = adaptable_layers(*dm);
  REQUIRE(ql.size() == dl.size());
  std::int64_t packed = 0, dense_bytes = 0;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < ql.size(); ++i) {
    INFO(ql[i].first);
    const auto q = ql[i].second->quantized_weight();
    REQUIRE(q);
    CHECK(q->format() == "q4_1");
    CHECK(torch::equal(ql[i].second->dense_weight(), dl[i].second->weight));
    packed += q->bytes();
    dense_bytes += dl[i].second->weight.numel() * 2;
    ++kept;
  }
  CHECK(kept == 30 * 7);
  CHECK(packed * 64 == dense_bytes * 20);  // 20 bytes per 32 weights against 64
  torch::NoGradGuard ng;
  const torch::Tensor ids = torch::tensor({{1, 504, 3458, 314, 2330, 28, 17, 1004}, {1, 4300, 282, 253, 1345, 30, 2, 2}});
  const Fields in{{"input_ids", ids}, {"attention_mask", (ids != 2).to(torch::kLong)}};
  CHECK(torch::equal(qm->run(in).at("logits"), dm->run(in).at("logits")));  // the same at::linear on the same values

  // What cannot work is refused by what it is.
  {
    ModelSpec trainable = spec;
    trainable.trainable = true;
    ModelRegistry models(Precision::bf16_mixed);
    auto issues = std::make_shared<ConfigIssues>();
    ModelPtr m =
        registry.models.parse("llama", "/type", ConfigReader(Json{{"gguf", gguf}}, "/config", issues))(BuildContext{});
    CHECK_THROWS_WITH(models.add(m, trainable, torch::kCPU), Contains("stores the weights quantized, which cannot train"));
  }
  {
    const auto dir = fs::path(test::source_dir()) / "tests/golden/llama/tiny_llama";
    auto issues = std::make_shared<ConfigIssues>();
    ModelPtr m = registry.models.parse("llama", "/type",
                                       ConfigReader(Json{{"config_file", (dir / "config.json").string()}}, "/config",
                                                    issues))(BuildContext{});
    load_weights(*m, dir / "model.safetensors", "tiny", weight_targets(spec, *m));
    ModelRegistry models(Precision::bf16_mixed);
    CHECK_THROWS_WITH(models.add(m, spec, torch::kCPU),
                      Contains("\"dtype\": \"gguf\" keeps the Q4_0, Q4_1 and Q8_0 blocks a GGUF weights file holds"));
  }
}

}  // namespace refit_test_quantized_layers
