// The causal_lm objective and its chunked cross-entropy: loss and both gradients against an
// fp64 reference within bounds derived from the arithmetic, the same for the unchunked fp32
// path (so that the bound is known to be met by the standard computation too), the label shift,
// the token count, and perplexity.
#include <cmath>
#include <cstdio>

#include <torch/torch.h>

#include "objectives/causal_lm.h"
#include "objectives/chunked_cross_entropy.h"
#include "numeric_bounds.h"
#include "refit/autocast.h"
#include "refit/registry.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_causal_lm {

using namespace refit;
using refit::test::check_bound_ratio;
using refit::test::gamma_n;
using refit::test::kUnitBf16;
using refit::test::kUnitFp32;

namespace {

struct Problem {
  torch::Tensor hidden, weight, targets;
};

Problem make_problem(std::int64_t n, std::int64_t h, std::int64_t v, std::uint64_t seed) {
  torch::manual_seed(seed);
  Problem p;
  p.hidden = torch::randn({n, h});
  p.weight = torch::randn({v, h}) * 0.5;
  p.targets = torch::randint(0, v, {n}, torch::kLong);
  p.targets.index_put_({torch::arange(0, n, 7)}, -100);  // every 7th row has no target
  return p;
}

struct Grads {
  torch::Tensor loss, hidden, weight;
};

// The unchunked computation in `dtype`: logits, then cross-entropy summed over target rows.
Grads reference(const Problem& p, c10::ScalarType dtype) {
  auto h = p.hidden.to(dtype).clone().requires_grad_(true);
  auto w = p.weight.to(dtype).clone().requires_grad_(true);
  auto loss =
      torch::nn::functional::cross_entropy(torch::matmul(h, w.t()), p.targets,
                                           torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(
                                               torch::kSum));
  loss.backward();
  return {loss.detach().to(torch::kDouble), h.grad().to(torch::kDouble), w.grad().to(torch::kDouble)};
}

Grads chunked(const Problem& p, std::int64_t chunk) {
  auto h = p.hidden.clone().requires_grad_(true);
  auto w = p.weight.clone().requires_grad_(true);
  auto r = chunked_linear_cross_entropy(h, w, p.targets, chunk, torch::kFloat);
  r.loss_sum.backward();
  return {r.loss_sum.detach().to(torch::kDouble), h.grad().to(torch::kDouble), w.grad().to(torch::kDouble)};
}

// Bounds of an fp32 computation against the exact value (derivation: numeric_bounds.h's model).
// Each logit z_iv is a dot product of length H: |dz_iv| <= gamma_H * P_iv, P = |h| |w|^T. A row's
// loss lse_i - z_it moves by at most 2 max_v |dz_iv| through the logits, and log-sum-exp's own
// V exponentials, V-1 additions and the log add gamma_(V+2) (relative error of the sum becomes
// an absolute error of its log) plus u |lse_i| for the final rounding; the sum over N rows adds
// gamma_N sum |nll_i|. The softmax p_iv moves by at most p_iv (2 eps_i + gamma_(V+2)) with
// eps_i = gamma_H max_v P_iv, so each gradient entry, a length-V (hidden) or length-N (weight)
// dot product of (p - onehot) with w or h, moves by sum |dp| |.| + gamma_len sum |p - onehot| |.|.
struct Bounds {
  double loss;
  torch::Tensor hidden, weight;
};

Bounds fp32_bounds(const Problem& p, const Grads& exact) {
  const std::int64_t N = p.hidden.size(0), H = p.hidden.size(1), V = p.weight.size(0);
  auto h = p.hidden.to(torch::kDouble), w = p.weight.to(torch::kDouble);
  auto P = torch::matmul(h.abs(), w.abs().t());  // [N, V]
  auto valid = p.targets.ne(-100).to(torch::kDouble);
  auto eps = gamma_n(H, kUnitFp32) * std::get<0>(P.max(1));  // [N]
  auto z = torch::matmul(h, w.t());
  auto lse = torch::logsumexp(z, {1});
  auto picked = z.gather(1, p.targets.clamp_min(0).unsqueeze(1)).squeeze(1);
  auto nll = (lse - picked) * valid;
  const double gV = gamma_n(V + 2, kUnitFp32), u = kUnitFp32;
  const double loss = ((2 * eps + gV + u * (lse.abs() + picked.abs())) * valid).sum().item<double>() +
                      gamma_n(N, u) * nll.abs().sum().item<double>() + u * exact.loss.abs().item<double>();
  auto prob = torch::softmax(z, 1);
  auto onehot = torch::zeros_like(prob).scatter_(1, p.targets.clamp_min(0).unsqueeze(1), 1.0);
  auto diff = ((prob - onehot) * valid.unsqueeze(1)).abs();  // [N, V]
  auto dp = prob * (2 * eps + gV).unsqueeze(1) * valid.unsqueeze(1);
  auto bh = torch::matmul(dp, w.abs()) + gamma_n(V, u) * torch::matmul(diff, w.abs()) + u * exact.hidden.abs();
  auto bw = torch::matmul(dp.t(), h.abs()) + gamma_n(N, u) * torch::matmul(diff.t(), h.abs()) + u * exact.weight.abs();
  return {loss, bh, bw};
}

double ratio(const torch::Tensor& a, const torch::Tensor& ref, const torch::Tensor& bound) {
  // An entry with bound 0 (a row without a target: its gradient is exactly 0) passes only when exact.
  return refit::test::bound_ratio(a, ref, bound);
}

}  // namespace

TEST_CASE("chunked cross-entropy: loss and gradients within the fp32 bound of the exact value", "[causal_lm]") {
  const Problem p = make_problem(/*n=*/61, /*h=*/48, /*v=*/300, /*seed=*/3);
  const Grads exact = reference(p, torch::kDouble);
  const Bounds b = fp32_bounds(p, exact);
  const Grads standard = reference(p, torch::kFloat);
  // The bound holds for the standard unchunked computation (it is a bound, not a fit) ...
  CHECK(std::abs(standard.loss.item<double>() - exact.loss.item<double>()) <= b.loss);
  CHECK(ratio(standard.hidden, exact.hidden, b.hidden) <= 1.0);
  CHECK(ratio(standard.weight, exact.weight, b.weight) <= 1.0);
  // ... and for every chunking: one row at a time, a chunk that does not divide N, all at once.
  for (std::int64_t chunk : {1, 7, 16, 61, 1000}) {
    INFO("chunk " << chunk);
    const Grads c = chunked(p, chunk);
    const double loss_err = std::abs(c.loss.item<double>() - exact.loss.item<double>());
    INFO("loss error " << loss_err << " bound " << b.loss);
    check_bound_ratio("loss", loss_err / b.loss);
    const double rh = ratio(c.hidden, exact.hidden, b.hidden), rw = ratio(c.weight, exact.weight, b.weight);
    INFO("hidden gradient error/bound " << rh << ", weight " << rw);
    if (chunk == 7)
      std::printf("chunked cross-entropy fp32 (chunk 7): loss error/bound %.3g, hidden gradient %.3g, weight %.3g\n",
                  loss_err / b.loss, rh, rw);
    check_bound_ratio("hidden gradient", rh);
    check_bound_ratio("weight gradient", rw);
  }
}

TEST_CASE("chunked cross-entropy: an ignored row contributes nothing, a frozen weight gets no gradient", "[causal_lm]") {
  Problem p = make_problem(20, 16, 40, 5);
  auto h = p.hidden.clone().requires_grad_(true);
  auto w = p.weight.clone();  // frozen: no gradient asked for
  auto r = chunked_linear_cross_entropy(h, w, p.targets, 6, torch::kFloat);
  r.loss_sum.backward();
  auto ignored = p.targets.eq(-100);
  CHECK(h.grad().index({ignored}).abs().max().item<float>() == 0.0f);
  CHECK_FALSE(w.grad().defined());
  // All rows ignored: zero loss, zero count of correct tokens, no NaN.
  auto none = torch::full({20}, -100, torch::kLong);
  auto z = chunked_linear_cross_entropy(p.hidden, p.weight, none, 6, torch::kFloat);
  CHECK(z.loss_sum.item<float>() == 0.0f);
  CHECK(z.correct.item<float>() == 0.0f);
  CHECK_THROWS_WITH(chunked_linear_cross_entropy(p.hidden, p.weight.t(), p.targets, 6, torch::kFloat),
                    Catch::Contains("expected hidden [N, H], weight [V, H]"));
}

TEST_CASE("chunked cross-entropy under bf16 autocast: the unchunked bf16 product's loss", "[causal_lm]") {
  // Logits of order 1 (the weight scaled down), so that one bf16 unit of a logit, the largest
  // legitimate difference, is far below one token's loss (ln 200 = 5.3): a dropped or repeated row
  // fails the bound.
  Problem p = make_problem(45, 64, 200, 9);
  p.weight = p.weight * 0.1;
  // Reference: what an unchunked forward under autocast computes — a bf16 product, fp32 loss.
  torch::Tensor ref;
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16, true);
    auto logits = torch::matmul(p.hidden, p.weight.t()).to(torch::kFloat);
    ref = torch::nn::functional::cross_entropy(logits, p.targets,
                                               torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(
                                                   torch::kSum));
  }
  torch::Tensor got;
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16, true);
    got = chunked_linear_cross_entropy(p.hidden, p.weight, p.targets, 8, torch::kBFloat16).loss_sum;
  }
  // Both round the same bf16 operands; their fp32 accumulations may differ by 2 gamma_H P, and the
  // bf16 rounding of the logit may then differ by one unit (u_bf16 |z|), so each row's loss by
  // twice the largest such logit difference; the fp32 sums over rows add gamma_N sum |nll| each.
  auto hb = p.hidden.to(torch::kBFloat16).to(torch::kDouble), wb = p.weight.to(torch::kBFloat16).to(torch::kDouble);
  auto z = torch::matmul(hb, wb.t());
  auto P = torch::matmul(hb.abs(), wb.abs().t());
  auto valid = p.targets.ne(-100).to(torch::kDouble);
  auto dz = std::get<0>((2 * gamma_n(64, kUnitFp32) * P + 2 * kUnitBf16 * z.abs()).max(1));
  const double bound = (2 * dz * valid).sum().item<double>() + 2 * gamma_n(45, kUnitFp32) * ref.abs().item<double>();
  const double err = std::abs(got.item<double>() - ref.item<double>());
  INFO("bf16 loss difference " << err << ", bound " << bound);
  std::printf("chunked cross-entropy bf16: loss %.6g, difference %.3g, bound %.3g\n", ref.item<double>(), err, bound);
  check_bound_ratio("bf16 loss vs fp32-accumulated bf16 product", err / bound);
}

namespace {

// A two-parameter "language model": embeddings whose rows are the hidden states, returned with
// the head weight (tied), as the llama model returns them for the chunked loss.
class TinyLm : public Model {
 public:
  TinyLm(std::int64_t vocab, std::int64_t hidden) {
    embed = register_parameter("embed", torch::randn({vocab, hidden}) * 0.3);
    head = register_parameter("head", torch::randn({vocab, hidden}) * 0.3);
  }
  std::vector<std::string> input_fields() const override { return {"input_ids"}; }
  std::vector<std::string> output_fields() const override { return {"hidden_states", "lm_head_weight"}; }
  Fields forward_fields(const Fields& in) override {
    return Fields{{"hidden_states", embed.index({in.at("input_ids")})}, {"lm_head_weight", head}};
  }
  torch::Tensor embed, head;
};

ObjectivePtr make_causal_lm(Registry& registry, std::int64_t chunk) {
  register_causal_lm_objective(registry);
  Json cfg = {{"models", {"lm"}}, {"chunk_tokens", chunk}};
  auto issues = std::make_shared<ConfigIssues>();
  auto builder = registry.objectives.parse("causal_lm", "/type", ConfigReader(cfg, "/config", issues));
  issues->throw_if_any();
  return builder(BuildContext{});
}

}  // namespace

TEST_CASE("causal_lm: shifted labels, token count, next-token accuracy and perplexity", "[causal_lm]") {
  torch::manual_seed(0);
  auto lm = std::make_shared<TinyLm>(30, 8);
  ModelMap models{{"lm", lm}};
  Registry registry;
  auto objective = make_causal_lm(registry, 3);
  Batch batch;
  batch.samples = 2;
  auto ids = torch::tensor({{4, 9, 2, 7, 1}, {5, 3, 8, 0, 0}}, torch::kLong);
  // The second sample: a prompt (5) whose labels are -100, then 3, 8; then padding.
  auto labels = torch::tensor({{4, 9, 2, 7, 1}, {-100, 3, 8, -100, -100}}, torch::kLong);
  batch.set("input_ids", ids);
  batch.set("labels", labels);
  CHECK(objective->count(batch) == 4 + 2);  // targets after the shift
  TrainState state;
  // An evaluation's view: the count comes with the sums (a training step takes count()).
  auto out = objective->compute(models, batch, ObjectiveContext{state, false});
  CHECK(out.count == 6);
  // By hand: position t of each row predicts labels[t + 1].
  auto logits = torch::matmul(lm->embed.index({ids}), lm->head.t());
  double expected = 0, correct = 0;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t + 1 < 5; ++t) {
      const auto target = labels[b][t + 1].item<std::int64_t>();
      if (target == -100) continue;
      auto row = logits[b][t];
      expected += (torch::logsumexp(row, 0) - row[target]).item<double>();
      correct += row.argmax().item<std::int64_t>() == target ? 1 : 0;
    }
  CHECK(out.loss_sum.item<double>() == Approx(expected).epsilon(1e-6));
  CHECK(out.metric_sums.at("accuracy").item<double>() == correct);
  std::map<std::string, double> means{{"loss", 2.0}, {"accuracy", 0.5}};
  objective->add_derived_metrics(means);
  CHECK(means.at("perplexity") == Approx(std::exp(2.0)));
}

TEST_CASE("causal_lm: micro-batches of different token counts sum to the one-batch gradient", "[causal_lm]") {
  // The loop divides every micro-batch's loss sum by the window's token count (Objective::count):
  // two micro-batches of 6 and 2 target tokens then give the gradient of one batch holding all 8,
  // which a mean per micro-batch (or per sample) would not.
  torch::manual_seed(1);
  auto lm = std::make_shared<TinyLm>(20, 6);
  ModelMap models{{"lm", lm}};
  Registry registry;
  auto objective = make_causal_lm(registry, 4);
  TrainState state;
  auto make = [](torch::Tensor ids, torch::Tensor labels) {
    Batch b;
    b.samples = ids.size(0);
    b.set("input_ids", ids);
    b.set("labels", labels);
    return b;
  };
  Batch a = make(torch::tensor({{1, 2, 3, 4, 5, 6, 7}}, torch::kLong), torch::tensor({{1, 2, 3, 4, 5, 6, 7}}, torch::kLong));
  Batch c = make(torch::tensor({{8, 9, 10, 0, 0, 0, 0}}, torch::kLong),
                 torch::tensor({{8, 9, 10, -100, -100, -100, -100}}, torch::kLong));
  Batch both = make(torch::cat({a.at("input_ids"), c.at("input_ids")}), torch::cat({a.at("labels"), c.at("labels")}));
  const auto window = objective->count(a) + objective->count(c);
  REQUIRE(window == objective->count(both));
  REQUIRE(window == 8);
  lm->zero_grad();
  for (const Batch* b : {&a, &c})
    (objective->compute(models, *b, ObjectiveContext{state, true}).loss_sum / window).backward();
  auto accumulated = lm->embed.grad().clone();
  lm->zero_grad();
  (objective->compute(models, both, ObjectiveContext{state, true}).loss_sum / window).backward();
  CHECK(torch::allclose(accumulated, lm->embed.grad(), 1e-6, 1e-7));
}

}  // namespace refit_test_causal_lm
