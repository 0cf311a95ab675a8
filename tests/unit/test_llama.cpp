// The `llama` model (plugin "llm") against transformers' LlamaForCausalLM / Qwen2ForCausalLM
// (llm.c's test_gpt2.c for Llama): two tiny random models (tests/golden/make_llama.py) — logits,
// loss and every parameter's gradient on a batch padded on the right and on the left — and the
// real SmolLM2-135M-Instruct from its GGUF file (tests/golden/make_smollm2_logits.py): logits on
// 16 prompts in fp32 and bf16, greedy generation with the KV cache. The KV cache against the
// full forward, gradient checkpointing, LoRA targets and bad configs.
//
// The bounds (tests/unit/numeric_bounds.h, docs/precision.md "Golden tolerances"): first order,
// as for ViT and BERT — LayerNorm-like normalisation, softmax and SiLU are not polynomials, so
// P(|inputs|) is replaced by max |exact|: |computed - exact| <= gamma~_n(u) max |exact|, with
// gamma~_n the probabilistic bound (lambda sqrt(n) u, numeric_bounds.h; the worst-case gamma_n is
// about 100x the error at these depths and could not see an epsilon off), n
// the depth of the computation (logits_depth below) and the exact value refit's model in double
// from the same weights. Transformers' float64 logits are a second, independent exact value: they
// must agree with refit's double within the fp64 bound, which is what catches an architecture
// difference (a wrong rope theta moves logits by far more than 1e-10).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <ATen/ATen.h>

#include "cli/commands/export.h"
#include "core/plugin_loader.h"
#include "core/recipe_parser.h"
#include "io/adapter_files.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "llm/llama.h"
#include "model/weights.h"
#include "refit/adapter.h"
#include "run/assembly.h"
#include "numeric_bounds.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_llama {

using namespace refit;
using namespace refit::test;
namespace fs = std::filesystem;

namespace {

fs::path golden_dir() { return fs::path(test::source_dir()) / "tests/golden/llama"; }

llm::LlamaOptions options_for(Json config) {
  auto issues = std::make_shared<ConfigIssues>();
  ConfigReader reader(std::move(config), "/config", issues);
  auto o = llm::LlamaOptions::from_config(reader);
  reader.finish();
  if (!issues->empty()) throw ConfigError(issues->list());
  return o;
}

/// The model of a golden folder (config.json + model.safetensors), keys in `extra` overriding.
std::shared_ptr<llm::Llama> build(const std::string& name, Json extra = Json::object()) {
  Json config{{"config_file", (golden_dir() / name / "config.json").string()}};
  for (auto& [k, v] : extra.items()) config[k] = v;
  auto model = std::make_shared<llm::Llama>(options_for(config));
  load_weights(*model, golden_dir() / name / "model.safetensors", name);  // strict: every key, no other
  model->eval();
  return model;
}

void to_double(Model& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.named_parameters()) p.value().set_data(p.value().to(torch::kDouble));
}

/// transformers' ForCausalLMLoss: mean cross-entropy of the next token over the targets (labels
/// = input_ids, -100 on padding).
torch::Tensor shifted_loss(const torch::Tensor& logits, const torch::Tensor& ids, const torch::Tensor& mask) {
  const std::int64_t t = ids.size(1), v = logits.size(-1);
  const torch::Tensor labels = ids.masked_fill(mask == 0, -100);
  return at::cross_entropy_loss(logits.narrow(1, 0, t - 1).reshape({-1, v}), labels.narrow(1, 1, t - 1).reshape(-1), {},
                                at::Reduction::Mean, -100);
}

/// The depth of the logits (numeric_bounds.h): along the longest path, per decoder layer
///   RMSNorm      H + 5     (H squares summed, the mean, + eps, rsqrt, x times it, times the weight)
///   q/k proj     H + 1     (a dot product of H, the bias)
///   rotary       3         (x cos, rotate_half(x) sin, their sum; cos/sin themselves: 3 more, below)
///   scores       d + 2     (a dot product of d_head, the 1/sqrt(d) scale on q and on k)
///   softmax      T + 3     (max, exp, the sum of T, the division)
///   context      T         (a dot product of T)
///   o_proj       Hq + 1
///   residual     1
///   RMSNorm      H + 5
///   gate / up    H + 1
///   SiLU, times  3 + 1
///   down         F + 1
///   residual     1
/// then the final norm (H + 5), lm_head (H), and the rotary tables (position times inverse
/// frequency, cos or sin: 3; the llama3 smoothing of the frequencies is computed identically on
/// both sides, from the same float32 operations, and is not an error term).
std::int64_t logits_depth(const llm::LlamaOptions& o, std::int64_t t) {
  const std::int64_t h = o.hidden_size, d = o.dim_per_head(), hq = o.num_attention_heads * d, f = o.intermediate_size;
  const std::int64_t norm = h + 5;
  const std::int64_t layer = norm + (h + 1) + 3 + (d + 2) + (t + 3) + t + (hq + 1) + 1 + norm + (h + 1) + 4 + (f + 1) + 1;
  return o.num_hidden_layers * layer + norm + h + 3;
}

/// max |a - b| over the rows where `real` [B, T] is true ([B, T, V] tensors).
double max_diff(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& real) {
  const auto r = real.to(torch::kBool);
  return (a.to(torch::kDouble).index({r}) - b.to(torch::kDouble).index({r})).abs().max().item<double>();
}
double max_abs(const torch::Tensor& a, const torch::Tensor& real) {
  return a.to(torch::kDouble).index({real.to(torch::kBool)}).abs().max().item<double>();
}

struct GoldenResult {
  double logits32 = 0, hf_logits32 = 0, hf_logits64 = 0, left = 0, left_positions = 0, loss = 0, hf_loss = 0;
  double grad = 0, hf_grad = 0;  // the largest ratio error / bound over the parameters
  std::string worst_grad;
};

/// Runs the golden comparison of one fixture folder; every figure is a ratio (error / bound):
/// <= 1 passes. `extra`: config keys for the model under test (the planted bugs).
GoldenResult golden(const std::string& name, Json extra = Json::object()) {
  auto fixture = io::SafetensorsFile::open(golden_dir() / name / "golden.safetensors");
  auto model = build(name, extra);
  auto exact = build(name);
  to_double(*exact);
  const auto& o = exact->options();
  const torch::Tensor ids = fixture.load("input_ids_right"), mask = fixture.load("attention_mask_right");
  const std::int64_t b = ids.size(0), t = ids.size(1), v = o.vocab_size;
  const std::int64_t n = logits_depth(o, t);
  // The loss adds log-softmax over V (max, exp, the sum of V, log, subtraction: V + 4) and the
  // mean over the B (T - 1) targets (+ 1).
  const std::int64_t n_loss = n + v + 4 + b * (t - 1) + 1;
  // A gradient runs the forward to the loss, then back through the same operations (each backward
  // a product of the same lengths: depth n_loss again), and a weight's gradient sums over the
  // B T positions: 2 n_loss + B T.
  const std::int64_t n_grad = 2 * n_loss + b * t;
  const double g32 = prob_gamma(n, kUnitFp32), g64 = prob_gamma(n, kUnitFp64);
  GoldenResult r;

  Fields right{{"input_ids", ids}, {"attention_mask", mask}};
  const torch::Tensor logits = model->run(right).at("logits");
  const torch::Tensor loss = shifted_loss(logits, ids, mask);
  loss.backward();
  const torch::Tensor exact_logits = exact->run(right).at("logits");
  const torch::Tensor exact_loss = shifted_loss(exact_logits, ids, mask);
  exact_loss.backward();
  const double scale = max_abs(exact_logits, mask);
  r.logits32 = max_diff(logits, exact_logits, mask) / ((g32 + g64) * scale);
  r.hf_logits32 = max_diff(fixture.load("logits_right"), exact_logits, mask) / ((g32 + g64) * scale);
  // Both in double: each within gamma~_n(2^-53) max |exact| of the exact value.
  r.hf_logits64 = max_diff(fixture.load("logits64_right"), exact_logits, mask) / (2 * g64 * scale);
  const double loss_bound = (prob_gamma(n_loss, kUnitFp32) + prob_gamma(n_loss, kUnitFp64)) * exact_loss.item<double>();
  r.loss = std::abs(loss.item<double>() - exact_loss.item<double>()) / loss_bound;
  r.hf_loss = std::abs(fixture.load("loss_right").item<double>() - exact_loss.item<double>()) / loss_bound;
  CHECK(std::abs(fixture.load("loss64_right").item<double>() - exact_loss.item<double>()) <=
        2 * prob_gamma(n_loss, kUnitFp64) * exact_loss.item<double>());

  // Every parameter, by transformers' name: refit's gradient and transformers' within
  // gamma~_{n_grad}(2^-24) max |exact gradient of that tensor|.
  const double gg = prob_gamma(n_grad, kUnitFp32) + prob_gamma(n_grad, kUnitFp64);
  auto exact_params = exact->named_parameters();
  std::size_t compared = 0;
  for (const auto& p : model->named_parameters()) {
    const torch::Tensor e = exact_params[p.key()].grad();
    REQUIRE(fixture.contains("grad." + p.key()));
    const double bound = gg * e.abs().max().item<double>();
    const double mine = (p.value().grad().to(torch::kDouble) - e).abs().max().item<double>() / bound;
    const double theirs = (fixture.load("grad." + p.key()).to(torch::kDouble) - e).abs().max().item<double>() / bound;
    if (mine > r.grad) r.grad = mine, r.worst_grad = p.key();
    r.hf_grad = std::max(r.hf_grad, theirs);
    ++compared;
  }
  std::size_t in_fixture = 0;
  for (const auto& info : fixture.tensors()) in_fixture += info.name.rfind("grad.", 0) == 0;
  CHECK(compared == in_fixture);  // the same parameters, by name, as transformers'

  // Left padding: positions derived from the mask (cumsum - 1) as generate does, or given.
  torch::NoGradGuard ng;
  const torch::Tensor ids_l = fixture.load("input_ids_left"), mask_l = fixture.load("attention_mask_left");
  Fields left{{"input_ids", ids_l}, {"attention_mask", mask_l}};
  const torch::Tensor exact_left = exact->run(left).at("logits");
  r.left = max_diff(model->run(left).at("logits"), exact_left, mask_l) / ((g32 + g64) * scale);
  CHECK(max_diff(fixture.load("logits64_left"), exact_left, mask_l) <= 2 * g64 * scale);
  const torch::Tensor given = model->hidden_states(ids_l, mask_l, fixture.load("position_ids_left"));
  r.left_positions = max_diff(model->logits(given), exact_left, mask_l) / ((g32 + g64) * scale);
  std::printf("llama golden %s%s: depth n %lld (loss %lld, gradients %lld); error / bound: logits refit %.3g, "
              "transformers fp32 %.3g, transformers fp64 vs refit fp64 %.3g (fp64 bound), left padding %.3g (positions "
              "given %.3g); loss refit %.3g, transformers %.3g; gradients refit %.3g (worst %s), transformers %.3g\n",
              name.c_str(), extra.empty() ? "" : (" with " + extra.dump()).c_str(), static_cast<long long>(n),
              static_cast<long long>(n_loss), static_cast<long long>(n_grad), r.logits32, r.hf_logits32, r.hf_logits64,
              r.left, r.left_positions, r.loss, r.hf_loss, r.grad, r.worst_grad.c_str(), r.hf_grad);
  return r;
}

void check_golden(const GoldenResult& r) {
  check_bound_ratio("logits: refit", r.logits32);
  check_bound_ratio("logits: transformers", r.hf_logits32);
  check_bound_ratio("logits fp64: transformers", r.hf_logits64);
  check_bound_ratio("logits left-padded: refit", r.left);
  check_bound_ratio("logits left-padded, positions given: refit", r.left_positions);
  check_bound_ratio("loss: refit", r.loss);
  check_bound_ratio("loss: transformers", r.hf_loss);
  check_bound_ratio("gradients: refit", r.grad);
  check_bound_ratio("gradients: transformers", r.hf_grad);
}

}  // namespace

TEST_CASE("llama: a tiny Llama (GQA, llama3 rope, tied head) matches transformers: logits, loss, every gradient (golden)") {
  check_golden(golden("tiny_llama"));
}

TEST_CASE("llama: a tiny Qwen2 (q/k/v biases, untied lm_head) matches transformers: logits, loss, every gradient (golden)") {
  auto model = build("tiny_qwen2");
  CHECK(model->lm_head != nullptr);
  CHECK(model->model->layer_list[0]->self_attn->q_proj->bias.defined());
  CHECK_FALSE(model->model->layer_list[0]->self_attn->o_proj->bias.defined());
  check_golden(golden("tiny_qwen2"));
}

TEST_CASE("llama: the golden check fails for a wrong rope theta, rope type or RMSNorm epsilon (planted bugs)") {
  // The comparison with transformers' float64 logits is what sees them: refit in double with the
  // planted bug against transformers in double.
  auto planted = [](Json extra) {
    auto fixture = io::SafetensorsFile::open(golden_dir() / "tiny_llama/golden.safetensors");
    auto model = build("tiny_llama", extra);
    to_double(*model);
    torch::NoGradGuard ng;
    const torch::Tensor ids = fixture.load("input_ids_right"), mask = fixture.load("attention_mask_right");
    const torch::Tensor logits = model->run(Fields{{"input_ids", ids}, {"attention_mask", mask}}).at("logits");
    const double bound = 2 * prob_gamma(logits_depth(model->options(), ids.size(1)), kUnitFp64) * max_abs(logits, mask);
    const double ratio = max_diff(logits, fixture.load("logits64_right"), mask) / bound;
    std::printf("llama planted bug %s: error / fp64 bound %.3g\n", extra.dump().c_str(), ratio);
    return ratio;
  };
  CHECK(planted(Json::object()) <= 1);
  CHECK(planted(Json{{"rope_theta", 10100.0}}) > 1);
  CHECK(planted(Json{{"rope_parameters", {{"rope_type", "default"}}}}) > 1);
  CHECK(planted(Json{{"rms_norm_eps", 1e-5}}) > 1);
}

TEST_CASE("llama: decoding with the KV cache equals the full forward, and greedy tokens equal recomputation") {
  auto model = build("tiny_llama");
  auto fixture = io::SafetensorsFile::open(golden_dir() / "tiny_llama/golden.safetensors");
  // Left padding, as generation batches prompts.
  const torch::Tensor ids = fixture.load("input_ids_left"), mask = fixture.load("attention_mask_left");
  const std::int64_t b = ids.size(0), t = ids.size(1), prefill = 6;
  torch::NoGradGuard ng;
  const torch::Tensor full = model->logits(model->hidden_states(ids, mask, {}));
  llm::KVCache cache = model->make_cache(b, t);
  CHECK(cache.keys.size() == 2);
  CHECK(cache.keys[0].sizes() == c10::IntArrayRef({b, 2, t, 16}));
  std::vector<torch::Tensor> steps{model->forward_step(ids.narrow(1, 0, prefill), {}, cache, mask.narrow(1, 0, prefill))};
  for (std::int64_t i = prefill; i < t; ++i)
    steps.push_back(model->forward_step(ids.narrow(1, i, 1), {}, cache, mask.narrow(1, 0, i + 1)));
  CHECK(cache.length == t);
  // Both paths against the exact value (the same model in float64, full forward): the cache's
  // attention over stored keys is another order of the same operations, so each is within
  // gamma~_n(2^-24) max |exact| of it (+ the float64 model's gamma_n(2^-53)), n the full depth.
  const torch::Tensor incremental = at::stack(steps, 1);
  const torch::Tensor reference = full.narrow(1, prefill - 1, t - prefill + 1);
  const torch::Tensor real = mask.narrow(1, prefill - 1, t - prefill + 1);
  auto exact_model = build("tiny_llama");
  to_double(*exact_model);
  const torch::Tensor exact =
      exact_model->logits(exact_model->hidden_states(ids, mask, {})).narrow(1, prefill - 1, t - prefill + 1);
  const double bound = prob_depth_bound(logits_depth(model->options(), t), torch::kFloat) * max_abs(exact, real);
  const double err = max_diff(incremental, exact, real), full_err = max_diff(reference, exact, real);
  std::printf("llama KV cache: max abs error of the incremental logits %.3g, of the full forward's %.3g, bound %.3g\n", err,
              full_err, bound);
  check_bound_ratio("logits: incremental (KV cache) vs exact", err / bound);
  check_bound_ratio("logits: full forward vs exact", full_err / bound);
  CHECK_THROWS_WITH(model->forward_step(ids.narrow(1, 0, 1), {}, cache, {}), Catch::Contains("holds 10 positions"));

  // Greedy: 12 new tokens per row with the cache, and by recomputing the whole sequence each step.
  const torch::Tensor cached = llm::greedy_generate(*model, ids, mask, 12);
  const torch::Tensor recomputed = llm::greedy_generate_uncached(*model, ids, mask, 12);
  CHECK(cached.sizes() == c10::IntArrayRef({b, 12}));
  CHECK(torch::equal(cached, recomputed));
  // And with EOS: a row continues with the padding id once it produced EOS.
  const std::int64_t eos = cached[0][3].item<std::int64_t>();
  std::int64_t first = 0;  // where row 0 first produces that token
  while (cached[0][first].item<std::int64_t>() != eos) ++first;
  const torch::Tensor stopped = llm::greedy_generate(*model, ids, mask, 12, eos, 0);
  CHECK(torch::equal(stopped[0].narrow(0, 0, first + 1), cached[0].narrow(0, 0, first + 1)));
  CHECK((stopped[0].narrow(0, first + 1, 11 - first) == 0).all().item<bool>());
  CHECK(torch::equal(stopped, llm::greedy_generate_uncached(*model, ids, mask, 12, eos, 0)));
}

TEST_CASE("llama: packed samples give the unpacked loss and every gradient (block-causal mask, own positions)") {
  // Two samples of 7 and 4 tokens: unpacked, a right-padded batch of 2; packed, one sequence of 11
  // with positions 0..6, 0..3, segments 1 and 2, and the second sample's first label -100 (the
  // shift would otherwise make sample 1's last token predict it). Mathematically the two are the
  // same sum of the same per-token terms, so in float64 they agree to rounding: every value is a
  // chain of at most n = logits_depth roundings from the same inputs, a first-order error of
  // gamma_n(2^-53) relative to the largest magnitude on each side (numeric_bounds.h), twice for
  // two computations. A missing segment mask or shared positions moves them by ~1e-2.
  auto model = build("tiny_llama");
  to_double(*model);
  const std::int64_t vocab = model->options().vocab_size;
  torch::manual_seed(7);
  const torch::Tensor a = torch::randint(0, vocab, {7}, torch::kLong), b = torch::randint(0, vocab, {4}, torch::kLong);
  auto loss_and_grads = [&](const torch::Tensor& ids, const torch::Tensor& labels, const torch::Tensor& mask,
                            const torch::Tensor& positions, const torch::Tensor& segments) {
    model->zero_grad();
    const torch::Tensor logits = model->logits(model->hidden_states(ids, mask, positions, segments));
    const std::int64_t t = ids.size(1);
    const torch::Tensor loss = at::cross_entropy_loss(logits.narrow(1, 0, t - 1).reshape({-1, vocab}),
                                                      labels.narrow(1, 1, t - 1).reshape(-1), {}, at::Reduction::Sum, -100);
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& p : model->named_parameters()) grads[p.key()] = p.value().grad().clone();
    return std::make_pair(loss.item<double>(), grads);
  };
  // Unpacked: right padding, labels -100 on padding.
  torch::Tensor ids = torch::zeros({2, 7}, torch::kLong), mask = torch::zeros({2, 7}, torch::kLong);
  ids[0].copy_(a), ids[1].narrow(0, 0, 4).copy_(b);
  mask[0].fill_(1), mask[1].narrow(0, 0, 4).fill_(1);
  const auto [unpacked_loss, unpacked] = loss_and_grads(ids, ids.masked_fill(mask == 0, -100), mask, {}, {});
  // Packed.
  const torch::Tensor packed_ids = torch::cat({a, b}).unsqueeze(0);
  torch::Tensor packed_labels = packed_ids.clone();
  packed_labels[0][7] = -100;
  const torch::Tensor positions = torch::cat({torch::arange(7), torch::arange(4)}).unsqueeze(0).to(torch::kLong);
  const torch::Tensor segments = torch::cat({torch::ones({7}), torch::full({4}, 2)}).unsqueeze(0).to(torch::kLong);
  const auto [packed_loss, packed] =
      loss_and_grads(packed_ids, packed_labels, torch::ones({1, 11}, torch::kLong), positions, segments);
  const double g = 2 * prob_gamma(2 * logits_depth(model->options(), 11), kUnitFp64);
  std::printf("llama packed vs unpacked: loss %.17g vs %.17g\n", packed_loss, unpacked_loss);
  CHECK(std::abs(packed_loss - unpacked_loss) <= g * std::abs(unpacked_loss));
  double worst = 0;
  for (const auto& [name, grad] : unpacked) {
    const double scale = std::max(grad.abs().max().item<double>(), packed.at(name).abs().max().item<double>());
    const double err = (packed.at(name) - grad).abs().max().item<double>();
    INFO(name << ": error " << err << ", bound " << g * scale);
    CHECK(err <= g * scale);
    if (scale > 0) worst = std::max(worst, err / (g * scale));
  }
  std::printf("llama packed vs unpacked: worst gradient error / bound %.3g\n", worst);
  // Without the segment mask the packed sequence is one sample: its loss differs.
  model->zero_grad();
  const torch::Tensor unmasked = model->logits(model->hidden_states(packed_ids, {}, positions, {}));
  const double wrong = at::cross_entropy_loss(unmasked.narrow(1, 0, 10).reshape({-1, vocab}),
                                              packed_labels.narrow(1, 1, 10).reshape(-1), {}, at::Reduction::Sum, -100)
                           .item<double>();
  CHECK(std::abs(wrong - unpacked_loss) > 1e3 * g * std::abs(unpacked_loss));
}

TEST_CASE("llama: the SDK's incremental decoder is forward_step with the KV cache") {
  auto model = build("tiny_llama");
  auto fixture = io::SafetensorsFile::open(golden_dir() / "tiny_llama/golden.safetensors");
  const torch::Tensor ids = fixture.load("input_ids_left"), mask = fixture.load("attention_mask_left");
  torch::NoGradGuard ng;
  IncrementalDecoder* decoder = static_cast<Model&>(*model).decoder();
  REQUIRE(decoder != nullptr);
  CHECK(decoder->max_positions() == model->options().max_position_embeddings);
  // Greedy through the interface, as refit generate drives it, equals greedy_generate.
  auto cache = decoder->start(ids.size(0), ids.size(1) + 5);
  torch::Tensor m = mask.to(torch::kLong);
  torch::Tensor logits = decoder->step(ids, m, *cache);
  CHECK(logits.scalar_type() == torch::kFloat);
  std::vector<torch::Tensor> out;
  for (int i = 0; i < 5; ++i) {
    out.push_back(logits.argmax(-1));
    m = at::cat({m, at::ones({ids.size(0), 1}, m.options())}, 1);
    if (i < 4) logits = decoder->step(out.back().unsqueeze(1), m, *cache);
  }
  CHECK(torch::equal(at::stack(out, 1), llm::greedy_generate(*model, ids, mask, 5)));
}

TEST_CASE("llama: the plugin's model loads transformers' files strictly, and checkpointed layers and LoRA on q/v give "
          "the same loss and gradients") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("llm");
  loader.load("lora");
  auto fixture = io::SafetensorsFile::open(golden_dir() / "tiny_llama/golden.safetensors");
  const torch::Tensor ids = fixture.load("input_ids_right"), mask = fixture.load("attention_mask_right");
  auto make = [&](bool checkpoint) {
    auto issues = std::make_shared<ConfigIssues>();
    auto builder =
        registry.models.parse("llama", "/type",
                              ConfigReader(Json{{"config_file", (golden_dir() / "tiny_llama/config.json").string()}},
                                           "/config", issues));
    REQUIRE(issues->empty());
    ModelPtr m = builder(BuildContext{});
    load_weights(*m, golden_dir() / "tiny_llama/model.safetensors", "tiny");
    CHECK(m->checkpointable_blocks() == std::vector<std::string>{"model.layers.0", "model.layers.1"});
    AdapterPtr lora = registry.adapters.parse(
        "lora", "/type",
        ConfigReader(Json{{"r", 2}, {"alpha", 4}, {"target_regex", "model\\.layers\\.[0-9]+\\.self_attn\\.(q_proj|v_proj)"}},
                     "/config", issues))(BuildContext{});
    REQUIRE(issues->empty());
    lora->attach(*m);
    torch::NoGradGuard ng;
    double k = 1;
    for (auto& p : m->named_parameters()) {
      const bool adapter = p.key().find(".lora_default.") != std::string::npos;
      if (adapter)
        p.value().copy_((torch::arange(p.value().numel(), torch::kFloat) * 0.37 * k++).sin().reshape(p.value().sizes()) *
                        0.05);
      p.value().set_requires_grad(adapter);  // frozen base, as a LoRA run has it
    }
    if (checkpoint) m->set_checkpointed_blocks({"model.layers.0", "model.layers.1"});
    return m;
  };
  std::map<std::string, torch::Tensor> grads[2];
  double losses[2];
  for (int c = 0; c < 2; ++c) {
    ModelPtr m = make(c == 1);
    const torch::Tensor loss =
        shifted_loss(m->run(Fields{{"input_ids", ids}, {"attention_mask", mask}}).at("logits"), ids, mask);
    loss.backward();
    losses[c] = loss.item<double>();
    for (const auto& p : m->named_parameters())
      if (p.value().requires_grad()) {
        REQUIRE(p.value().grad().defined());
        grads[c][p.key()] = p.value().grad();
      }
  }
  CHECK(grads[0].size() == 8);  // 2 layers x (q, v) x (A, B)
  CHECK(grads[0].count("model.layers.1.self_attn.v_proj.lora_default.lora_B") == 1);
  // The recomputation runs the same operations on the same inputs: the same numbers.
  CHECK(losses[0] == losses[1]);
  for (const auto& [name, g] : grads[0]) CHECK(torch::equal(g, grads[1].at(name)));
}

TEST_CASE("llama: config errors name the key, outputs hidden_states and lm_head_weight, bad inputs are errors") {
  auto message = [](Json config) -> std::string {
    try {
      options_for(std::move(config));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const std::string tiny = (golden_dir() / "tiny_llama/config.json").string();
  CHECK_THAT(message(Json{{"config_file", tiny}, {"num_key_value_heads", 3}}),
             Catch::Contains("/config/num_key_value_heads") && Catch::Contains("divisor of num_attention_heads (4)"));
  CHECK_THAT(message(Json{{"config_file", tiny}, {"rope_parameters", {{"rope_type", "yarn"}}}}),
             Catch::Contains("/config/rope_parameters") && Catch::Contains("\"yarn\" is not supported"));
  CHECK_THAT(message(Json{{"config_file", "/nonexistent/config.json"}}),
             Catch::Contains("cannot read a transformers config.json"));
  CHECK_THAT(message(Json{{"config_file", tiny}, {"output", "hidden"}}),
             Catch::Contains("/config/output") && Catch::Contains("expected one of logits, hidden_states"));
  const fs::path bad = fs::temp_directory_path() / "refit_llama_bad_config.json";
  std::ofstream(bad) << R"({"model_type": "llama", "hidden_act": "gelu", "vocab_size": 0})";
  CHECK_THAT(message(Json{{"config_file", bad.string()}}), Catch::Contains("hidden_act: \"gelu\" is not supported") &&
                                                               Catch::Contains("vocab_size: expected a value in [1"));
  fs::remove(bad);

  auto model = build("tiny_llama", Json{{"output", "hidden_states"}, {"position_ids", true}});
  CHECK(model->input_fields() == std::vector<std::string>{"input_ids", "attention_mask", "position_ids"});
  CHECK(model->output_fields() == std::vector<std::string>{"hidden_states", "lm_head_weight"});
  torch::NoGradGuard ng;
  const torch::Tensor ids = torch::randint(1, 256, {2, 5}, torch::kLong);
  Fields in{{"input_ids", ids},
            {"attention_mask", torch::ones({2, 5}, torch::kLong)},
            {"position_ids", torch::arange(5, torch::kLong).expand({2, 5})}};
  Fields out = model->run(in);
  CHECK(out.at("hidden_states").sizes() == c10::IntArrayRef({2, 5, 64}));
  CHECK(out.at("lm_head_weight").is_same(model->model->embed_tokens->weight));  // tied: the embedding itself
  in.set("attention_mask", torch::ones({2, 4}, torch::kLong));
  CHECK_THROWS_WITH(model->run(in), Catch::Contains("attention_mask [2, 4] does not match input_ids [2, 5]"));
}

// ---- SmolLM2-135M-Instruct, from the GGUF file ($REFIT_SMOLLM2_GGUF) -------------------------

namespace {

std::shared_ptr<llm::Llama> build_smollm2() {
  const std::string gguf = test::env_path("REFIT_SMOLLM2_GGUF");
  auto model = std::make_shared<llm::Llama>(options_for(Json{{"gguf", gguf}}));
  load_weights(*model, gguf, "smollm2");
  model->eval();
  return model;
}

}  // namespace

TEST_CASE("llama: SmolLM2-135M from its GGUF matches transformers (fp32 logits on 16 prompts, bf16 next tokens, greedy "
          "32 tokens with the KV cache on 8 prompts)") {
  auto model = build_smollm2();
  const auto& o = model->options();
  CHECK(o.num_hidden_layers == 30);
  CHECK(o.kv_heads() == 3);
  CHECK(o.tie_word_embeddings);
  CHECK(o.vocab_size == 49152);
  CHECK(model->lm_head == nullptr);
  auto fixture = io::SafetensorsFile::open(golden_dir() / "smollm2.safetensors");
  const torch::Tensor all_ids = fixture.load("input_ids"), lengths = fixture.load("lengths");
  const torch::Tensor columns = fixture.load("columns"), hf = fixture.load("logits_columns");
  const torch::Tensor hf_argmax = fixture.load("argmax"), last = fixture.load("last_logits");
  torch::NoGradGuard ng;

  // fp32: each prompt alone, as the fixture ran them. The bound: refit's and transformers' fp32
  // logits are each within gamma~_n(2^-24) max |exact| of the exact value, so within twice that of
  // each other (n: logits_depth for the prompt's length). The fixture's fp16 last-position logits
  // add their storage rounding, u_fp16 |value|.
  std::vector<torch::Tensor> logits32;
  double worst = 0, worst_err = 0, worst_bound = 0, last_ratio = 0;
  std::int64_t start = 0, positions = 0, argmax_agree = 0;
  for (std::int64_t i = 0; i < lengths.size(0); ++i) {
    const std::int64_t len = lengths[i].item<std::int64_t>();
    const torch::Tensor ids = all_ids.narrow(0, start, len).unsqueeze(0);
    const torch::Tensor logits = model->logits(model->hidden_states(ids, {}, {}))[0];
    logits32.push_back(logits);
    const double bound = 2 * prob_gamma(logits_depth(o, len), kUnitFp32) * logits.abs().max().item<double>();
    const double err = (logits.index_select(1, columns) - hf.narrow(0, start, len)).abs().max().item<double>();
    worst = std::max(worst, err / bound), worst_err = std::max(worst_err, err);
    worst_bound = worst_bound == 0 ? bound : std::min(worst_bound, bound);
    argmax_agree += (logits.argmax(-1) == hf_argmax.narrow(0, start, len)).sum().item<std::int64_t>();
    if (i < last.size(0)) {
      const torch::Tensor ref = last[i].to(torch::kFloat);
      const torch::Tensor b = bound + kUnitFp16 * ref.abs();
      last_ratio = std::max(last_ratio, ((logits[len - 1] - ref).abs() / b).max().item<double>());
    }
    start += len;
    positions += len;
  }
  std::printf("SmolLM2 fp32 vs transformers, %lld positions x %lld columns: max abs error %.3g, smallest bound %.3g "
              "(largest ratio %.3g); "
              "full last-position logits ratio %.3g; argmax agrees at %lld / %lld positions\n",
              static_cast<long long>(positions), static_cast<long long>(columns.size(0)), worst_err, worst_bound, worst,
              last_ratio, static_cast<long long>(argmax_agree), static_cast<long long>(positions));
  check_bound_ratio("fp32 logits: refit vs transformers", worst);
  check_bound_ratio("fp32 last-position logits: refit vs transformers (fp16 fixture)", last_ratio);
  CHECK(argmax_agree == positions);

  // Greedy, fp32, with the KV cache: the 8 prompts in one left-padded batch, 32 new tokens each.
  const torch::Tensor greedy = fixture.load("greedy");
  const std::int64_t rows = greedy.size(0), eos = 2, pad = 2;  // SmolLM2: <|im_end|> is EOS and the padding id
  std::int64_t longest = 0;
  for (std::int64_t i = 0; i < rows; ++i) longest = std::max(longest, lengths[i].item<std::int64_t>());
  torch::Tensor ids = torch::full({rows, longest}, pad, torch::kLong), mask = torch::zeros({rows, longest}, torch::kLong);
  start = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t len = lengths[i].item<std::int64_t>();
    ids[i].narrow(0, longest - len, len).copy_(all_ids.narrow(0, start, len));
    mask[i].narrow(0, longest - len, len).fill_(1);
    start += len;
  }
  // Without gradients (the composite RMSNorm and rotation), and under InferenceMode as `refit
  // generate` runs it (their fused loops, fused_inference.h); the one-query attention in both.
  for (const bool inference : {false, true}) {
    torch::Tensor generated;
    if (inference) {
      c10::InferenceMode im;
      generated = llm::greedy_generate(*model, ids, mask, 32, eos, pad);
    } else {
      generated = llm::greedy_generate(*model, ids, mask, 32, eos, pad);
    }
    std::int64_t same = 0, compared = 0;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < 32; ++j) {
        const std::int64_t want = greedy[i][j].item<std::int64_t>();
        if (want < 0) continue;  // transformers stopped this prompt at EOS
        ++compared;
        same += generated[i][j].item<std::int64_t>() == want;
      }
    std::printf("SmolLM2 greedy with the KV cache (fp32, 8 prompts left-padded in one batch%s): %lld / %lld tokens "
                "equal transformers' generate\n",
                inference ? ", InferenceMode" : "", static_cast<long long>(same), static_cast<long long>(compared));
    CHECK(same == compared);
  }

  // bf16 weights (the frozen base as a LoRA run holds it), no autocast: every op in bf16.
  model->to(torch::kBFloat16);
  double bf16_worst = 0, bf16_err = 0;
  std::int64_t bf16_agree = 0, bf16_within = 0, decided = 0;
  start = 0;
  for (std::int64_t i = 0; i < lengths.size(0); ++i) {
    const std::int64_t len = lengths[i].item<std::int64_t>();
    const torch::Tensor ids1 = all_ids.narrow(0, start, len).unsqueeze(0);
    const torch::Tensor low = model->logits(model->hidden_states(ids1, {}, {}))[0].to(torch::kFloat);
    const torch::Tensor& ref = logits32[static_cast<std::size_t>(i)];
    // bf16 rounds each op's output (u = 2^-8): about 20 roundings per layer (two norms of 3 casts
    // each, q/k/v, the rotary 3, attention, o, two residuals, gate, up, SiLU, the product, down)
    // and 5 more at the end: n16 = 20 L + 5 = 605. gamma_605(2^-8) > 1 gives no worst-case bound at
    // this depth, so the bound is the probabilistic one (numeric_bounds.h): gamma~_{n16}(2^-8)
    // max |fp32 logits|.
    const double bound = prob_gamma(20 * o.num_hidden_layers + 5, kUnitBf16) * ref.abs().max().item<double>();
    const double err = (low - ref).abs().max().item<double>();
    bf16_worst = std::max(bf16_worst, err / bound), bf16_err = std::max(bf16_err, err);
    // The next token: bf16's choice at every position is a token whose fp32 logit is within twice
    // the bound of fp32's best (within that, bf16 may pick the runner-up legitimately; a wrong
    // bf16 path picks tokens fp32 ranks far lower). Exact agreement is reported.
    const torch::Tensor best = std::get<0>(ref.max(-1));
    const torch::Tensor chosen = ref.gather(1, low.argmax(-1).unsqueeze(1)).squeeze(1);
    decided += len;
    bf16_agree += (low.argmax(-1) == ref.argmax(-1)).sum().item<std::int64_t>();
    bf16_within += (best - chosen <= 2 * bound).sum().item<std::int64_t>();
    start += len;
  }
  std::printf("SmolLM2 bf16 vs fp32: max abs error %.3g (error / probabilistic bound %.3g); next token equal to fp32's "
              "at %lld of %lld positions, within twice the bound of fp32's best at %lld\n",
              bf16_err, bf16_worst, static_cast<long long>(bf16_agree), static_cast<long long>(decided),
              static_cast<long long>(bf16_within));
  check_bound_ratio("bf16 weights: logits vs fp32", bf16_worst);
  CHECK(bf16_within == decided);
}

// ---- Files others read: the PEFT adapter and the merged export of SmolLM2 --------------------

TEST_CASE("llama: refit's SmolLM2 LoRA adapter loads completely in PEFT and its merged export strictly in "
          "LlamaForCausalLM, both with refit's logits (golden)") {
  // tests/golden/make_smollm2_peft.py runs this case with REFIT_REGENERATE_GOLDEN=1 and
  // REFIT_GOLDEN_WORK=<folder>: it writes there the adapter (adapter_model.safetensors: 420
  // tensors, 2.4 MB, not kept in the repository), refit's logits and the merged export (540 MB),
  // which PEFT and transformers then load. What they found is in tests/golden/llama/smollm2_peft/;
  // without the variable, the case builds the same adapter and export in a temporary folder and
  // compares with it.
  Registry registry;
  PluginLoader loader(registry);
  loader.load("llm");
  loader.load("lora");
  const fs::path fixtures = golden_dir() / "smollm2_peft";
  const char* work_env = std::getenv("REFIT_GOLDEN_WORK");
  const bool regenerate = std::getenv("REFIT_REGENERATE_GOLDEN") != nullptr;
  const fs::path work =
      regenerate && work_env && *work_env ? fs::path(work_env) : fs::temp_directory_path() / "refit-tests" / "smollm2-peft";
  io::remove_tree(work / "export");
  fs::create_directories(work);
  const Json lora_config{{"r", 2},
                         {"alpha", 4},
                         {"target_modules", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}};
  auto model = build_smollm2();
  auto issues = std::make_shared<ConfigIssues>();
  AdapterPtr lora = registry.adapters.parse("lora", "/type", ConfigReader(lora_config, "/config", issues))(BuildContext{});
  REQUIRE(issues->empty());
  lora->attach(*model);
  {
    // Factors of their own (B non-zero: the adapter changes every layer's output), deterministic,
    // small enough that the model still predicts text (a delta of ~2e-3 per weight).
    torch::NoGradGuard ng;
    double k = 1;
    for (auto& p : model->named_parameters())
      if (p.key().find(".lora_default.") != std::string::npos) {
        auto& t = p.value();
        t.copy_((torch::arange(t.numel(), torch::kFloat) * 0.37 * k + k).sin().reshape(t.sizes()) * 0.02);
        k += 1;
      }
  }
  AdapterFiles files = lora->export_files(*model);
  REQUIRE(files.tensors.size() == 420);  // 30 layers x 7 projections x (A, B)
  CHECK(files.tensors.count("base_model.model.model.layers.29.mlp.down_proj.lora_B.weight") == 1);
  CHECK(files.config["target_modules"].size() == 210);
  io::write_adapter_files(work / "adapter", files);

  // The prompts: the first 3 of the SmolLM2 fixture (two texts, a chat), each alone.
  auto prompts = io::SafetensorsFile::open(golden_dir() / "smollm2.safetensors");
  const torch::Tensor all_ids = prompts.load("input_ids"), lengths = prompts.load("lengths");
  const torch::Tensor columns = prompts.load("columns");
  auto logits_of = [&](llm::Llama& m) {
    torch::NoGradGuard ng;
    std::vector<torch::Tensor> rows;
    std::int64_t start = 0;
    for (std::int64_t i = 0; i < 3; ++i) {
      const std::int64_t len = lengths[i].item<std::int64_t>();
      const torch::Tensor ids = all_ids.narrow(0, start, len).unsqueeze(0);
      rows.push_back(m.logits(m.hidden_states(ids, {}, {}))[0].index_select(1, columns));
      start += len;
    }
    return at::cat(rows);
  };
  const torch::Tensor logits = logits_of(*model);
  lora->merge(*model);
  const torch::Tensor merged = logits_of(*model);
  lora->unmerge(*model);
  std::int64_t positions = 0, longest = 0;
  for (std::int64_t i = 0; i < 3; ++i)
    positions += lengths[i].item<std::int64_t>(), longest = std::max(longest, lengths[i].item<std::int64_t>());

  // The merged export, through the recipe as `refit export --format merged --dtype float32
  // --checkpoint none` runs it: the adapter loaded from the folder just written.
  const fs::path recipe = fs::path(test::source_dir()) / "recipes/llm/smollm2-wordnet-lora.json";
  Assembly assembly(
      load_recipe(recipe, {"models.0.adapters.0.load=" + (work / "adapter").string(), "models.0.adapters.0.config.r=2",
                           "models.0.adapters.0.config.alpha=4", "models.0.dtype=float32", "training.precision=fp32",
                           "output.dir=" + (work / "run").string()}));
  const auto written = cli::export_models(assembly, fs::path("none"), "merged", work / "export", c10::kFloat);
  CHECK(written == std::vector<fs::path>{work / "export/lm/model.safetensors", work / "export/lm/config.json"});
  // refit reads its own export back (config.json and strict keys) with the merged model's logits.
  llm::Llama reread(options_for(Json{{"config_file", (work / "export/lm/config.json").string()}}));
  load_weights(reread, work / "export/lm/model.safetensors", "export");
  reread.eval();
  const torch::Tensor exported = logits_of(reread);

  if (regenerate)
    io::save_safetensors(work / "refit_output.safetensors", {{"logits", logits}, {"merged_logits", merged}},
                         {{"format", "pt"}});

  // What PEFT loaded (tests/golden/make_smollm2_peft.py asserts that every tensor arrived) is
  // this adapter: the same config, and tensors with the same sums (their values are rebuilt here
  // from the same formula; the 2.4 MB file is not kept).
  auto verified = io::read_adapter_files(work / "adapter");
  CHECK(verified.config == files.config);
  std::ifstream config_in(fixtures / "adapter_config.json");
  CHECK(Json::parse(config_in) == files.config);
  auto peft = io::SafetensorsFile::open(fixtures / "peft_output.safetensors");
  const torch::Tensor digest = peft.load("digest");  // [420, 2] float64: sum, sum of squares, by key order
  REQUIRE(digest.size(0) == static_cast<std::int64_t>(files.tensors.size()));
  double digest_err = 0;
  std::int64_t row = 0;
  for (const auto& kv : files.tensors) {  // std::map: keys in byte order, as Python's sorted()
    const torch::Tensor t = kv.second.to(torch::kDouble);
    const double sum = t.sum().item<double>(), squares = t.pow(2).sum().item<double>();
    digest_err =
        std::max({digest_err, std::abs(sum - digest[row][0].item<double>()) / (t.abs().sum().item<double>() + 1e-30),
                  std::abs(squares - digest[row][1].item<double>()) / (squares + 1e-30)});
    ++row;
  }
  // Both sums are in double over float32 values from the same formula, but sin is a vectorized
  // library function whose last bit differs between CPUs (each result within 1 ulp of the exact
  // value: two CPUs 2 ulp <= 2^-22 |t| apart). So the sums may differ by 2^-22 sum |t| and the
  // sums of squares by 2^-21 sum t^2 (plus double rounding, negligible): 2^-21 bounds both. A
  // wrong, missing or reordered tensor moves its row by more than 1e-2.
  CHECK(digest_err <= std::ldexp(1.0, -21));

  // The bound. The worst case — refit's and the reference's fp32 logits each within
  // gamma_n(2^-24) max |exact| of the exact value, n the depth (logits_depth, plus each adapted
  // projection's LoRA path: x A is a dot of the projection's own width, then B (r), the scaling
  // and the sum, r + 2 on the four projections of the longest path per layer: q/k, o, gate/up,
  // down; merged, the same r + 2 in W + s B A) — is ~0.5 at this depth, larger than the
  // adapter's whole effect (~0.4), so it could not see a lost adapter. The check uses the
  // probabilistic bound instead (numeric_bounds.h): 2 gamma~_n(2^-24) max |logits|.
  const auto& o = model->options();
  const std::int64_t n = logits_depth(o, longest) + o.num_hidden_layers * 4 * (2 + 2);
  const double scale = logits.abs().max().item<double>();
  const double worst_case = 2 * gamma_n(n, kUnitFp32) * scale;
  const double bound = 2 * prob_gamma(n, kUnitFp32) * scale;
  const double err = (logits - peft.load("peft_logits")).abs().max().item<double>();
  const double merged_err = (merged - peft.load("peft_merged_logits")).abs().max().item<double>();
  const double export_err = (exported - peft.load("export_logits")).abs().max().item<double>();
  const double reread_err = (exported - merged).abs().max().item<double>();
  const double adapter_effect = (logits - logits_of(*build_smollm2())).abs().max().item<double>();
  // Planted bug: the adapter's scaling 5 % off (B times 1.05, as a wrong alpha / r would be).
  {
    torch::NoGradGuard ng;
    for (auto& p : model->named_parameters())
      if (p.key().find(".lora_B") != std::string::npos) p.value().mul_(1.05);
  }
  const double planted = (logits_of(*model) - peft.load("peft_logits")).abs().max().item<double>();
  std::printf("SmolLM2 LoRA r 2 on every projection (%lld positions x %lld columns): refit vs PEFT %.3g, merged vs "
              "PEFT's merge_and_unload %.3g, refit's merged export in transformers' LlamaForCausalLM vs refit's merged "
              "%.3g, refit reading its export back %.3g; bound %.3g (probabilistic, depth %lld; worst case %.3g); the "
              "adapter moves the logits by %.3g, its scaling 5 %% off by %.3g from PEFT's (%.3g x the bound)\n",
              static_cast<long long>(positions), static_cast<long long>(columns.size(0)), err, merged_err, export_err,
              reread_err, bound, static_cast<long long>(n), worst_case, adapter_effect, planted, planted / bound);
  check_bound_ratio("logits: refit vs PEFT", err / bound);
  check_bound_ratio("merged logits: refit vs PEFT", merged_err / bound);
  check_bound_ratio("exported logits: transformers vs refit", export_err / bound);
  check_bound_ratio("exported logits: refit reading them back", reread_err / bound);
  CHECK(adapter_effect > 10 * bound);  // the comparison sees the adapter: a lost delta fails it
  CHECK(planted > bound);              // and a wrong scaling

  // The config.json transformers loaded (strictly: no missing, unexpected or mismatched key) is
  // the one refit writes, and so are the file's keys.
  std::ifstream export_in(fixtures / "export.json");
  const Json seen = Json::parse(export_in);
  std::ifstream written_config(work / "export/lm/config.json");
  CHECK(Json::parse(written_config) == seen.at("config"));
  auto file = io::SafetensorsFile::open(work / "export/lm/model.safetensors");
  Json keys = Json::object();
  for (const auto& info : file.tensors()) keys[info.name] = info.shape;
  CHECK(keys == seen.at("keys"));
  CHECK(seen.at("loading_info").at("missing_keys").empty());
  CHECK(seen.at("loading_info").at("unexpected_keys").empty());
  CHECK(seen.at("loading_info").at("mismatched_keys").empty());
  if (!regenerate) io::remove_tree(work);
}

}  // namespace refit_test_llama
