// Several LoRA adapters on one model: per adapter trainable / active / weight, starting from PEFT
// folders (tests/recipes/two-adapters.json), and PEFT's add_weighted_adapter combinations
// (tests/golden/make_lora_combine.py).
#include <cstdio>
#include <memory>

#include "core/plugin_loader.h"
#include "io/adapter_files.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "refit/layers.h"
#include "cli/commands/train.h"
#include "cli/commands/export.h"
#include "core/recipe_parser.h"
#include "run/assembly.h"
#include "lora_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_lora_adapters {

using namespace refit;
namespace fs = std::filesystem;
using namespace refit::lora_test;

namespace {}  // namespace

TEST_CASE("LoRA options: trainable, active and weight per adapter") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  auto a = lora.make(Json{{"name", "a"}, {"r", 2}, {"alpha", 4}, {"target_modules", {"proj"}}, {"trainable", false}});
  auto b = lora.make(Json{{"name", "b"}, {"r", 2}, {"alpha", 4}, {"target_modules", {"proj"}}, {"active", false}});
  auto c = lora.make(Json{{"name", "c"}, {"r", 2}, {"alpha", 4}, {"target_modules", {"proj"}}, {"weight", 0.25}});
  for (auto& x : {a, b, c}) x->attach(*model);
  CHECK_FALSE(a->parameter_rules().at(0).trainable);
  CHECK(b->parameter_rules().at(0).trainable);
  torch::NoGradGuard ng;
  auto p = model->named_parameters();
  for (const char* n : {"a", "b", "c"})
    p[std::string("proj.lora_") + n + ".lora_B"].copy_(torch::linspace(-1, 1, 12).reshape({6, 2}));
  const auto x = torch::linspace(-2, 2, 40).reshape({5, 8});
  auto delta = [&](const char* n, double s) {
    return at::linear(at::linear(x, p[std::string("proj.lora_") + n + ".lora_A"]),
                      p[std::string("proj.lora_") + n + ".lora_B"]) *
           s;
  };
  const auto base = at::linear(x, p["proj.weight"], p["proj.bias"]);
  // b is inactive; c's scaling is 0.25 * alpha / r.
  CHECK(max_abs(model->forward(x), base + delta("a", 2.0) + delta("c", 0.5)) <= 1e-5);
  b->set_active(*model, true);
  CHECK(max_abs(model->forward(x), base + delta("a", 2.0) + delta("b", 2.0) + delta("c", 0.5)) <= 1e-5);
}

TEST_CASE("recipe two-adapters: a frozen, active PEFT adapter and a DoRA adapter that continues training from PEFT's file") {
  const fs::path src = fs::path(test::source_dir()) / "tests/recipes";
  const fs::path out = fs::temp_directory_path() / "refit-test-two-adapters";
  io::remove_tree(out);
  Assembly assembly(load_recipe(src / "two-adapters.json", {"output.dir=" + out.string()}));
  // Built: the frozen adapter changes the output (it is active) and is frozen; the tuned one trains.
  {
    auto models = assembly.build_models();
    const auto& m = models->models().at(0);
    for (const auto& p : m.parameters) {
      if (p.path.find("lora_frozen") != std::string::npos) CHECK_FALSE(p.trainable);
      if (p.path.find("lora_tuned") != std::string::npos) CHECK(p.trainable);
    }
    REQUIRE(m.adapters.size() == 2);
    CHECK(m.adapters[0].first == "lora-frozen");
    const auto x = torch::linspace(-1, 1, 64).reshape({4, 16});
    torch::NoGradGuard ng;
    auto tm = std::dynamic_pointer_cast<TensorModel>(m.model);
    REQUIRE(tm);
    const auto y = tm->forward(x);
    m.adapters[0].second->set_active(*m.model, false);
    CHECK(max_abs(tm->forward(x), y) > 1e-3);
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  auto summary = cli::train(assembly, devnull.get());
  CHECK(summary.counters.step == 16);
  const auto written = cli::export_models(assembly, std::nullopt, "peft", out / "peft");
  CHECK(written.size() == 4);  // each adapter on its own: <model>-lora-<name>/
  // The frozen adapter is exported exactly as PEFT wrote it.
  auto frozen_in = io::read_adapter_files(src / "peft-mlp/frozen"),
       frozen_out = io::read_adapter_files(out / "peft/backbone-lora-frozen");
  REQUIRE(frozen_out.tensors.size() == frozen_in.tensors.size());
  for (const auto& [k, t] : frozen_in.tensors) CHECK(torch::equal(frozen_out.tensors.at(k), t));
  // The tuned one moved away from PEFT's values, a little (it started from them; from scratch its
  // B would be near zero).
  auto tuned_in = io::read_adapter_files(src / "peft-mlp/tuned"),
       tuned_out = io::read_adapter_files(out / "peft/backbone-lora-tuned");
  REQUIRE(tuned_out.tensors.size() == tuned_in.tensors.size());
  CHECK(tuned_out.config["use_dora"] == true);
  for (const auto& [k, t] : tuned_in.tensors) {
    const double moved = max_abs(tuned_out.tensors.at(k), t);
    CHECK(moved > 0);
    CHECK(moved < 0.5 * t.abs().max().item<double>());
  }
}

namespace {

/// A combination's factors against the exact ones (double) from the same sources:
///   linear: A = sum_i sign(w_i s_i) sqrt|w_i s_i| A_i, B = sum_i sqrt|w_i s_i| B_i;
///   cat:    A = [w_i s_i A_i] (rows), B = [B_i] (columns);
/// each element: the weight rounded to fp32 and multiplied (2 per term; cat's two scalars 4) and
/// the sum of the two terms (1): depth 4, relative to the same sums of |terms|; refit's and
/// PEFT's factors both within it.
///   svd: the rank-r truncated SVD of D = sum_i w_i s_i B_i A_i. Its factors are not sums of
/// products: the exact ones come from D's SVD in double, and an SVD computed in fp32 is the exact
/// one of D + E, ||E||_2 <= gamma_{mn}(2^-24) ||D||_F (backward stable, with the modest
/// polynomial taken as m n) + the fp32 rounding of D itself (depth r + 3). Wedin's theorem bounds
/// the singular vectors: ||dv_i|| <= sqrt(2) ||E|| / gap_i (gap_i: the distance from s_i to the
/// other singular values, s_{r+1} included); the singular values move by <= ||E||. A's rows are
/// v_i, B's columns s_i u_i: per element |dA| <= sqrt(2) ||E|| / gap_i, |dB| <= ||E|| + s_i
/// sqrt(2) ||E|| / gap_i. Each singular pair's sign is LAPACK's choice: aligned to the exact one.
void check_combination_factors(const std::string& what, io::SafetensorsFile& golden, const std::string& kind,
                               const torch::Tensor& A, const torch::Tensor& B, std::int64_t svd_rank) {
  const auto d = [&](const std::string& k) { return golden.load(k).to(torch::kDouble); };
  const bool conv = A.dim() == 4;
  const std::int64_t r = golden.load("one.A").size(0);
  // Sources: "one" (alpha 8), "two" (alpha 2), both rank r: scaling alpha / r; weights 0.7, -0.4.
  const double ws[] = {0.7 * 8.0 / r, -0.4 * 2.0 / r};
  const char* names[] = {"one", "two"};
  torch::Tensor a_exact, a_abs, b_exact, b_abs;
  if (kind == "linear") {
    a_exact = torch::zeros_like(d("one.A")), a_abs = torch::zeros_like(a_exact);
    b_exact = torch::zeros_like(d("one.B")), b_abs = torch::zeros_like(b_exact);
    for (int i = 0; i < 2; ++i) {
      const double wa = std::sqrt(std::abs(ws[i])) * (ws[i] >= 0 ? 1 : -1), wb = std::sqrt(std::abs(ws[i]));
      a_exact += wa * d(std::string(names[i]) + ".A"), a_abs += std::abs(wa) * d(std::string(names[i]) + ".A").abs();
      b_exact += wb * d(std::string(names[i]) + ".B"), b_abs += wb * d(std::string(names[i]) + ".B").abs();
    }
  } else if (kind == "cat") {
    a_exact = torch::cat({ws[0] * d("one.A"), ws[1] * d("two.A")}, 0), a_abs = a_exact.abs();
    b_exact = torch::cat({d("one.B"), d("two.B")}, 1), b_abs = b_exact.abs();
  }
  if (kind != "svd") {
    check_both_within(what + " A", A, golden.load(kind + ".A"), a_exact, a_abs, 4);
    check_both_within(what + " B", B, golden.load(kind + ".B"), b_exact, b_abs, 4);
    return;
  }
  const std::int64_t out = d("one.B").size(0);
  auto delta = torch::zeros({out, d("one.A").numel() / r}, torch::kDouble), delta_abs = torch::zeros_like(delta);
  for (int i = 0; i < 2; ++i) {
    const auto Bi = d(std::string(names[i]) + ".B").reshape({out, r}), Ai = d(std::string(names[i]) + ".A").reshape({r, -1});
    delta += ws[i] * at::mm(Bi, Ai), delta_abs += std::abs(ws[i]) * at::mm(Bi.abs(), Ai.abs());
  }
  auto [U, S, Vh] = at::linalg_svd(delta, false);
  const std::int64_t m = delta.size(0), n = delta.size(1);
  // ||E||_2 <= ||E||_F: the SVD's backward error and D's own fp32 rounding (elementwise, depth r + 3).
  const double E = gamma_n(m * n, kUnitFp32) * delta.norm().item<double>() +
                   depth_bound(r + 3, torch::kFloat) * delta_abs.norm().item<double>();
  for (const bool ours : {true, false}) {
    const auto a = (ours ? A : golden.load(kind + ".A")).to(torch::kDouble).reshape({svd_rank, -1});
    const auto b = (ours ? B : golden.load(kind + ".B")).to(torch::kDouble).reshape({out, svd_rank});
    for (std::int64_t i = 0; i < svd_rank; ++i) {
      const double s = S[i].item<double>();
      double gap = INFINITY;
      for (std::int64_t j = 0; j < S.size(0); ++j)
        if (j != i) gap = std::min(gap, std::abs(s - S[j].item<double>()));
      if (S.size(0) == svd_rank) gap = std::min(gap, s);  // s_{r+1} = 0
      REQUIRE(gap > 2 * E);                               // the bound needs separated singular values
      const double sign = (a[i] * Vh[i]).sum().item<double>() >= 0 ? 1 : -1;
      const double dv = std::sqrt(2.0) * E / (gap - E);
      const double ea = (sign * a[i] - Vh[i]).abs().max().item<double>();
      const double eb = (sign * b.select(1, i) - s * U.select(1, i)).abs().max().item<double>();
      INFO(what << (ours ? " refit" : " PEFT") << " singular pair " << i << ": |dA| " << ea << " <= " << dv << ", |dB| "
                << eb << " <= " << E + s * dv);
      CHECK(ea <= dv);
      CHECK(eb <= E + s * dv);
    }
  }
}

/// Two adapters with PEFT's factors, combined as "linear", "cat" and "svd": each combination's
/// factors and the output with only it active equal PEFT's add_weighted_adapter's.
template <class Net>
void check_combinations(const std::string& name, const std::string& layer, std::int64_t r, std::int64_t svd_rank) {
  Lora lora;
  auto golden =
      io::SafetensorsFile::open(fs::path(test::source_dir()) / "tests/golden/lora/combine" / (name + ".safetensors"));
  auto model = std::make_shared<Net>();
  torch::NoGradGuard ng;
  auto p = model->named_parameters();
  p[layer + ".weight"].copy_(golden.load("weight"));
  p[layer + ".bias"].copy_(golden.load("bias"));
  std::vector<AdapterPtr> all;
  for (auto [n, alpha] : {std::pair<const char*, int>{"one", 8}, {"two", 2}}) {
    all.push_back(lora.make(Json{{"name", n}, {"r", r}, {"alpha", alpha}, {"target_modules", {layer}}}));
    all.back()->attach(*model);
  }
  for (const char* kind : {"linear", "cat", "svd"}) {
    Json combine{{"adapters", {"one", "two"}}, {"weights", {0.7, -0.4}}, {"type", kind}};
    if (std::string(kind) == "svd") combine["svd_rank"] = svd_rank;
    if (all.size() == 2) {  // the sources' factors, before the first combination reads them
      p = model->named_parameters();
      for (const char* n : {"one", "two"})
        for (const char* f : {"A", "B"}) p[layer + ".lora_" + n + ".lora_" + f].copy_(golden.load(std::string(n) + "." + f));
    }
    all.push_back(lora.make(Json{{"name", kind}, {"combine", combine}}));
    all.back()->attach(*model);
  }
  p = model->named_parameters();
  const auto x = golden.load("x");
  for (std::size_t i = 2; i < all.size(); ++i) {
    const std::string kind = std::vector<std::string>{"linear", "cat", "svd"}[i - 2];
    for (std::size_t j = 0; j < all.size(); ++j) all[j]->set_active(*model, j == i);
    const auto A = p[layer + ".lora_" + kind + ".lora_A"], B = p[layer + ".lora_" + kind + ".lora_B"];
    REQUIRE(A.sizes() == golden.load(kind + ".A").sizes());
    REQUIRE(B.sizes() == golden.load(kind + ".B").sizes());
    const double ea = max_abs(A, golden.load(kind + ".A")), eb = max_abs(B, golden.load(kind + ".B"));
    const double ey = max_abs(model->forward(x), golden.load(kind + ".y"));
    std::printf("combine %s %s vs PEFT's add_weighted_adapter: A %.2e, B %.2e, y %.2e\n", name.c_str(), kind.c_str(), ea, eb,
                ey);
    check_combination_factors(name + " " + kind, golden, kind, A, B, svd_rank);
    // The output with only this combination active (r = alpha: scaling 1): refit's with its
    // factors and PEFT's with its own, each within the fp32 bound of the exact layer (double).
    for (const bool ours : {true, false}) {
      LoraLayer l;
      l.conv = A.dim() == 4, l.padding = {1, 1}, l.scaling = 1;
      l.W = golden.load("weight"), l.b = golden.load("bias");
      l.A = ours ? A : golden.load(kind + ".A"), l.B = ours ? B : golden.load(kind + ".B");
      torch::AutoGradMode grad(true);
      const LoraReference ref = lora_reference(l, x);
      check_within(name + " " + kind + (ours ? " refit" : " PEFT") + " y",
                   ours ? model->forward(x) : golden.load(kind + ".y"), ref.y, ref.y_abs, ref.n_y);
    }
    // The combination is exported as an adapter of its own (r = alpha = its rank, as PEFT's).
    auto files = all[i]->export_files(*model);
    CHECK(files.config["r"] == A.size(0));
    CHECK(files.config["lora_alpha"] == static_cast<double>(A.size(0)));
  }
}

}  // namespace

TEST_CASE("LoRA combinations on Linear: linear, cat and svd equal PEFT's add_weighted_adapter (golden)") {
  check_combinations<LinearNet>("linear", "proj", 4, 3);
}

TEST_CASE("LoRA combinations on Conv2d: linear, cat and svd equal PEFT's add_weighted_adapter (golden)") {
  check_combinations<ConvNet>("conv", "conv", 2, 2);
}

TEST_CASE("LoRA combinations: the sources must exist, be LoRA and (for linear) share a rank") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  lora.make(Json{{"name", "one"}, {"r", 2}, {"target_modules", {"proj"}}})->attach(*model);
  lora.make(Json{{"name", "two"}, {"r", 4}, {"target_modules", {"proj"}}})->attach(*model);
  lora.make(Json{{"name", "d"}, {"r", 4}, {"use_dora", true}, {"target_modules", {"proj"}}})->attach(*model);
  auto combine = [&](Json c) { return lora.make(Json{{"name", "mix"}, {"combine", c}}); };
  CHECK_THROWS_WITH(combine(Json{{"adapters", {"one", "nope"}}, {"weights", {1, 1}}})->attach(*model),
                    Catch::Contains("no lora adapter named \"nope\""));
  CHECK_THROWS_WITH(combine(Json{{"adapters", {"one", "two"}}, {"weights", {1, 1}}})->attach(*model),
                    Catch::Contains("\"linear\" needs adapters of one rank, got [2, 4]"));
  CHECK_THROWS_WITH(combine(Json{{"adapters", {"one", "d"}}, {"weights", {1, 1}}, {"type", "cat"}})->attach(*model),
                    Catch::Contains("\"d\" is a DoRA adapter"));
  auto cat = combine(Json{{"adapters", {"one", "two"}}, {"weights", {1, 0.5}}, {"type", "cat"}});
  cat->attach(*model);
  CHECK(model->named_parameters()["proj.lora_mix.lora_A"].size(0) == 6);
  // Config problems are reported at their keys.
  auto issues = std::make_shared<ConfigIssues>();
  lora.registry.adapters.parse(
      "lora", "/type",
      ConfigReader(Json{{"name", "m"}, {"r", 4}, {"combine", {{"adapters", {"a"}}, {"weights", {1, 2}}}}}, "/config",
                   issues));
  const auto list = issues->list();
  auto at = [&](const std::string& ptr) {
    for (const auto& i : list)
      if (i.pointer == ptr) return i.message;
    return std::string();
  };
  CHECK_THAT(at("/config/r"), Catch::Contains("takes this from its source adapters"));
  CHECK_THAT(at("/config/combine/weights"), Catch::Contains("one weight per adapter (1), got 2"));
}

}  // namespace refit_test_lora_adapters
