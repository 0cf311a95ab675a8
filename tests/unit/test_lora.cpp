// The LoRA plugin against HF PEFT (tests/golden/make_lora_peft.py): forward, gradients and merge
// of LoRA on Linear and Conv2d; PEFT-written adapters load; refit-written adapters are what PEFT
// loaded and gave the same output for.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>

#include <torch/csrc/autograd/autograd.h>

#include "core/plugin_loader.h"
#include "io/adapter_files.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "refit/autocast.h"
#include "refit/layers.h"
#include "refit/regex.h"
#include "lora_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_lora {

using namespace refit;
namespace fs = std::filesystem;
using namespace refit::lora_test;

namespace {

fs::path golden(const std::string& p) { return fs::path(test::source_dir()) / "tests/golden/lora" / p; }


/// kernel 3, stride 3, padding 1, dilation 2 (tests/golden/make_lora_peft.py's DilatedConvNet).
class DilatedConvNet : public TensorModel {
 public:
  DilatedConvNet() {
    nn::Conv2dOptions o;
    o.in_channels = 3, o.out_channels = 4, o.kernel_size = {3, 3}, o.stride = {3, 3}, o.padding = {1, 1},
    o.dilation = {2, 2};
    conv = register_module("conv", std::make_shared<nn::Conv2d>(o));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return conv->forward(x); }
  std::shared_ptr<nn::Conv2d> conv;
};


/// The geometry of the adapted layer (its weights come from the files) and LoRA's scaling.
LoraLayer layer_shape(double scaling, bool conv, std::vector<std::int64_t> stride = {1, 1},
                      std::vector<std::int64_t> padding = {1, 1}, std::vector<std::int64_t> dilation = {1, 1}) {
  LoraLayer l;
  l.scaling = scaling, l.conv = conv, l.stride = stride, l.padding = padding, l.dilation = dilation;
  return l;
}

template <class Net>
void check_against_peft(const std::string& name, Json config, const char* layer, LoraLayer shape, bool mergeable = true) {
  Lora lora;
  auto model = std::make_shared<Net>();
  load_weights(*model, golden(name + "/base.safetensors"), name);
  auto expected = io::SafetensorsFile::open(golden(name + "/expected.safetensors"));
  auto x = expected.load("x");
  auto base_y = model->forward(x).detach();

  auto adapter = lora.make(config);
  adapter->attach(*model);
  CHECK(torch::equal(model->forward(x), base_y));  // B starts at zero: the delta is exactly 0, y the base's to the bit
  adapter->import_files(*model, io::read_adapter_files(golden(name + "/peft")));

  // The exact layer (double) from the same inputs: refit's and PEFT's fp32 results are each
  // within gamma~_n(2^-24) * P(|inputs|) of it (numeric_bounds.h; n in lora_reference).
  auto params = model->named_parameters();
  const std::string l = layer;
  shape.W = params[l + ".weight"].detach().clone(), shape.b = params[l + ".bias"].detach().clone();
  shape.A = params[l + ".lora_default.lora_A"].detach().clone(),
  shape.B = params[l + ".lora_default.lora_B"].detach().clone();
  const LoraReference ref = lora_reference(shape, x);

  auto y = model->forward(x);
  check_both_within_bound(name + " y", y, expected.load("y"), ref.y, ref.y_bound());
  (y * y).sum().backward();
  torch::Tensor ga, gb;
  for (const auto& p : model->named_parameters()) {
    if (p.key() == l + ".lora_default.lora_A") ga = p.value().grad();
    if (p.key() == l + ".lora_default.lora_B") gb = p.value().grad();
  }
  REQUIRE(ga.defined());
  REQUIRE(gb.defined());
  check_both_within(name + " grad_A", ga, expected.load("grad_A"), ref.grad_A, ref.grad_A_abs, ref.n_grad_A);
  check_both_within(name + " grad_B", gb, expected.load("grad_B"), ref.grad_B, ref.grad_B_abs, ref.n_grad_B);

  torch::NoGradGuard ng;
  auto weight_before = params[l + ".weight"].clone();
  if (!mergeable) {
    // PEFT's merge_and_unload changes this layer's output (recorded by the generator); refit
    // refuses to merge it and leaves the weight alone.
    CHECK(max_abs(expected.load("merged_y"), expected.load("y")) > 0.1);
    CHECK_THROWS_WITH(adapter->merge(*model), Catch::Contains("cannot merge into \"conv\": its dilation is [2, 2]"));
    CHECK(torch::equal(model->named_parameters()[l + ".weight"], weight_before));
    // The same computation again: within the bound of the exact value like the first.
    check_bound_ratio(name + " y again: refit", bound_ratio(model->forward(x), ref.y, ref.y_bound()));
    return;
  }
  // The merged weight W + s B A (double) and P = |W| + s |B| |A|: depth r (the product) + 2
  // (the scaling's rounding and multiply) + 1 (the sum).
  const auto d = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };
  const std::int64_t r = shape.rank(), out = shape.W.size(0);
  auto BA = [&](const torch::Tensor& B, const torch::Tensor& A) {
    return at::mm(B.reshape({out, r}), A.reshape({r, -1})).reshape(shape.W.sizes());
  };
  const auto merged_exact = d(shape.W) + shape.scaling * BA(d(shape.B), d(shape.A));
  const auto merged_abs = d(shape.W).abs() + shape.scaling * BA(d(shape.B).abs(), d(shape.A).abs());
  const std::int64_t n_merge = r + 3;
  adapter->merge(*model);
  check_both_within(name + " merged weight", model->named_parameters()[l + ".weight"], expected.load("merged_weight"),
                    merged_exact, merged_abs, n_merge);
  // The merged layer's output: conv(x, fl(W')) + b is the exact y to within the dot product (K),
  // the bias (1) and the merged weight's own error (n_merge), relative to
  // conv(|x|, |W| + s|B||A|) + |b| = y_abs (the same sums, regrouped): depth K + 1 + n_merge.
  check_within(name + " merged y", model->forward(x), ref.y, ref.y_abs, shape.k_base() + 1 + n_merge);
  adapter->unmerge(*model);
  // Unmerged: (fl(W + D) - D') is W to within n_merge + 1 roundings of |W| + 2 s|B||A|.
  const auto unmerge_abs = d(shape.W).abs() + 2 * shape.scaling * BA(d(shape.B).abs(), d(shape.A).abs());
  check_within(name + " unmerged weight", model->named_parameters()[l + ".weight"], d(weight_before), unmerge_abs,
               n_merge + 1);
  // Disabled: the base output from the unmerged weight. base_y (fp32, depth K + 1) and this one
  // each err by gamma_n * (conv(|x|,|W|) + |b|); the weight's change adds conv(|x|, gamma (|W| + 2 s|B||A|)),
  // in all <= 3 gamma_{n_y} y_abs (y_abs = conv(|x|,|W|) + |b| + s conv(|x|, |B||A|)).
  adapter->set_active(*model, false);
  check_within(name + " disabled y", model->forward(x), d(base_y), ref.y_abs, ref.n_y, 3);
  adapter->set_active(*model, true);
  adapter->eject(*model);
  CHECK(model->named_parameters().size() == 2);
  check_within(name + " ejected y", model->forward(x), d(base_y), ref.y_abs, ref.n_y, 3);
}

}  // namespace

TEST_CASE("LoRA on Linear: a PEFT adapter loads, forward, grads and merge match PEFT (golden)") {
  check_against_peft<LinearNet>("linear", Json{{"r", 4}, {"alpha", 8}, {"target_modules", {"proj"}}}, "proj",
                                layer_shape(8.0 / 4, false));
}

TEST_CASE("rsLoRA on Conv2d: a PEFT adapter loads, forward, grads and merge match PEFT (golden)") {
  check_against_peft<ConvNet>("conv", Json{{"r", 2}, {"alpha", 4}, {"use_rslora", true}, {"target_regex", "conv"}}, "conv",
                              layer_shape(4 / std::sqrt(2.0), true));
}

TEST_CASE("LoRA on a dilated Conv2d: lora_A without the dilation, as PEFT, its merge is refused (golden)") {
  check_against_peft<DilatedConvNet>("conv_dilated", Json{{"r", 3}, {"alpha", 6}, {"target_modules", {"conv"}}}, "conv",
                                     layer_shape(6.0 / 3, true, {3, 3}, {1, 1}, {2, 2}), /*mergeable=*/false);
}

TEST_CASE("LoRA merge folds active adapters only, as PEFT, the output does not change") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  auto active = lora.make(Json{{"r", 4}, {"alpha", 8}, {"target_modules", {"proj"}}});
  auto inactive = lora.make(Json{{"name", "off"}, {"r", 2}, {"alpha", 2}, {"target_modules", {"proj"}}});
  active->attach(*model);
  inactive->attach(*model);
  torch::NoGradGuard ng;
  auto params = model->named_parameters();
  params["proj.lora_default.lora_B"].copy_(torch::linspace(0.5, -0.5, 24).reshape({6, 4}));
  params["proj.lora_off.lora_B"].copy_(torch::linspace(-1, 1, 12).reshape({6, 2}));
  inactive->set_active(*model, false);
  const auto x = torch::linspace(-2, 2, 40).reshape({5, 8});
  const auto y = model->forward(x).clone(), base = params["proj.weight"].clone();
  const auto delta = 2.0 * at::matmul(params["proj.lora_default.lora_B"], params["proj.lora_default.lora_A"]);

  active->merge(*model);
  inactive->merge(*model);  // not active: nothing to fold
  CHECK(max_abs(params["proj.weight"], base + delta) <= 1e-6);
  CHECK(max_abs(model->forward(x), y) <= 1e-5);
  inactive->unmerge(*model);  // was not merged: nothing to subtract
  active->unmerge(*model);
  CHECK(max_abs(params["proj.weight"], base) <= 1e-6);
  // Activated, it merges like any other.
  inactive->set_active(*model, true);
  const auto y2 = model->forward(x).clone();
  inactive->merge(*model);
  CHECK(max_abs(model->forward(x), y2) <= 1e-5);
  CHECK(max_abs(params["proj.weight"], base) > 1e-2);
}

TEST_CASE("refit writes PEFT files that PEFT loads to the same output (golden)") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  load_weights(*model, golden("linear/base.safetensors"), "linear");
  auto adapter = lora.make(Json{{"r", 4}, {"alpha", 8}, {"target_regex", "proj"}});
  adapter->attach(*model);
  {
    torch::NoGradGuard ng;
    auto params = model->named_parameters();
    params["proj.lora_default.lora_A"].copy_(torch::linspace(-1, 1, 32).reshape({4, 8}));
    params["proj.lora_default.lora_B"].copy_(torch::linspace(0.5, -0.5, 24).reshape({6, 4}));
  }
  AdapterFiles files = adapter->export_files(*model);
  CHECK(files.config["peft_type"] == "LORA");
  CHECK(files.config["target_modules"] == Json::array({"proj"}));
  CHECK(files.tensors.count("base_model.model.proj.lora_A.weight") == 1);
  if (std::getenv("REFIT_REGENERATE_GOLDEN")) io::write_adapter_files(golden("refit_written"), files);

  // What PEFT verified is exactly what refit writes today.
  auto verified = io::read_adapter_files(golden("refit_written"));
  CHECK(verified.config == files.config);
  REQUIRE(verified.tensors.size() == files.tensors.size());
  for (const auto& kv : files.tensors) CHECK(torch::equal(verified.tensors.at(kv.first), kv.second));
  // And PEFT's output with it equals refit's.
  auto x = io::SafetensorsFile::open(golden("linear/expected.safetensors")).load("x");
  auto peft_y = io::SafetensorsFile::open(golden("refit_written/peft_output.safetensors")).load("y");
  LoraLayer shape = layer_shape(8.0 / 4, false);
  auto params = model->named_parameters();
  shape.W = params["proj.weight"], shape.b = params["proj.bias"];
  shape.A = params["proj.lora_default.lora_A"], shape.B = params["proj.lora_default.lora_B"];
  const LoraReference ref = lora_reference(shape, x);  // exact y, P(|inputs|) and depth (numeric_bounds.h)
  torch::NoGradGuard ng;
  check_both_within_bound("refit-written y", model->forward(x), peft_y, ref.y, ref.y_bound());
}

TEST_CASE("LoRA options: scaling, initialisation, several named adapters, config mismatch") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  auto a = lora.make(Json{{"r", 4}, {"alpha", 16}, {"target_modules", {"proj"}}});
  auto b = lora.make(Json{{"name", "second"}, {"r", 2}, {"init", "gaussian"}, {"target_modules", {"proj"}}});
  a->attach(*model);
  b->attach(*model);
  auto params = model->named_parameters();
  auto A = params["proj.lora_default.lora_A"];
  auto G = params["proj.lora_second.lora_A"];
  // Kaiming-uniform with a = sqrt(5) on [r, in]: bound = 1 / sqrt(in).
  CHECK(A.abs().max().item<double>() <= 1.0 / std::sqrt(8.0));
  CHECK(A.abs().max().item<double>() > 0.5 / std::sqrt(8.0));
  CHECK(params["proj.lora_default.lora_B"].abs().sum().item<double>() == 0.0);
  CHECK(G.sizes() == torch::IntArrayRef({2, 8}));
  CHECK_THROWS_WITH(lora.make(Json{{"r", 4}, {"alpha", 8}, {"target_modules", {"nope"}}})->attach(*model),
                    Catch::Contains("no layer matched the targets; adaptable layers: proj"));
  auto other = lora.make(Json{{"r", 2}, {"alpha", 8}, {"target_modules", {"proj"}}, {"name", "third"}});
  other->attach(*model);
  CHECK_THROWS_WITH(other->import_files(*model, io::read_adapter_files(golden("linear/peft"))),
                    Catch::Contains("r: file 4, recipe 2"));
  auto parameter_rule = a->parameter_rules().at(0);
  const auto re = compile_regex(parameter_rule.pattern, nullptr);
  REQUIRE(re);
  CHECK(regex_full_match("proj.lora_default.lora_A", *re));
  CHECK_FALSE(regex_full_match("proj.weight", *re));
}

TEST_CASE("a PEFT adapter config that is not an object, or whose lora_alpha is not a number, is refused (fuzz finds)") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  auto a = lora.make(Json{{"r", 4}, {"alpha", 8}, {"target_modules", {"proj"}}});
  a->attach(*model);
  AdapterFiles files = io::read_adapter_files(golden("linear/peft"));
  CHECK_NOTHROW(a->import_files(*model, files));
  // get<double>() threw nlohmann's type_error, which no caller expects from a damaged file.
  for (const Json& alpha : {Json("8"), Json(nullptr), Json::array({8})}) {
    files.config["lora_alpha"] = alpha;
    CHECK_THROWS_WITH(a->import_files(*model, files), Catch::Contains("lora_alpha: file " + alpha.dump() + ", recipe 8"));
  }
  // A config that is not an object looked like one without any key: accepted unchecked.
  std::ifstream in(golden("linear/peft/adapter_model.safetensors"), std::ios::binary);
  const std::string weights((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(weights.size() > 8);
  auto bytes = std::shared_ptr<std::uint8_t>(new std::uint8_t[weights.size()], std::default_delete<std::uint8_t[]>());
  std::memcpy(bytes.get(), weights.data(), weights.size());
  CHECK_THROWS_WITH(io::adapter_files_from_bytes(bytes, weights.size(), "[1, 2]", "/a"),
                    Catch::Contains("/a/adapter_config.json: not a JSON object"));
  CHECK_NOTHROW(io::adapter_files_from_bytes(bytes, weights.size(), "{}", "/a"));
}

namespace {

class WideNet : public TensorModel {
 public:
  WideNet() { proj = register_module("proj", std::make_shared<nn::Linear>(64, 48)); }
  torch::Tensor forward(const torch::Tensor& x) override { return proj->forward(x); }
  std::shared_ptr<nn::Linear> proj;
};

/// The adapted layer's output and the gradients of x, A and B, computed by the plugin (one
/// autograd node for the delta) or op by op as autograd records PyTorch's LoRA forward
/// (linear(linear(x, A), B) * scaling under the same autocast state).
struct Outcome {
  torch::Tensor y, dx, dA, dB;
};

Outcome run_layer(WideNet& net, const torch::Tensor& x_in, double scaling, bool reference) {
  auto params = net.named_parameters();
  auto A = params["proj.lora_default.lora_A"], B = params["proj.lora_default.lora_B"];
  auto W = params["proj.weight"], b = params["proj.bias"];
  // A layer's input is some earlier op's output, not a leaf (autocast caches casts of leaves).
  auto x_leaf = x_in.detach().clone().requires_grad_(true);
  auto x = x_leaf * 1;
  torch::Tensor y;
  if (reference) {
    A = A.detach().clone().requires_grad_(true), B = B.detach().clone().requires_grad_(true);
    const bool autocast = at::autocast::is_autocast_enabled(x.device().type());
    auto base = at::linear(autocast ? x : x.to(W.scalar_type()), W, b);
    auto d = at::linear(at::linear(autocast ? x : x.to(A.scalar_type()), A), B);
    if (scaling != 1.0) d = d * scaling;
    y = base + d.to(base.scalar_type());
  } else {
    A.mutable_grad() = torch::Tensor(), B.mutable_grad() = torch::Tensor();
    y = net.forward(x);
  }
  (y.to(torch::kFloat).pow(2) * torch::linspace(-1, 1, y.size(-1))).sum().backward();
  return {y.detach(), x_leaf.grad(), A.grad(), B.grad()};
}

}  // namespace

TEST_CASE("LoRA on Linear: the one-node delta equals PyTorch's op-by-op autograd bit for bit") {
  Lora lora;
  for (double alpha : {8.0, 20.0}) {  // scaling 1 (the multiply is skipped) and 2.5
    for (int mode = 0; mode < 4; ++mode) {
      // 0: fp32; 1: bf16 autocast, fp32 input; 2: bf16 autocast, bf16 input; 3: no autocast, bf16 input
      INFO("alpha " << alpha << ", mode " << mode);
      torch::manual_seed(7);
      auto net = std::make_shared<WideNet>();
      lora.make(Json{{"r", 8}, {"alpha", alpha}, {"target_regex", "proj"}})->attach(*net);
      {
        torch::NoGradGuard ng;
        net->named_parameters()["proj.lora_default.lora_B"].normal_();  // B starts at zero
        if (mode >= 2) net->named_parameters()["proj.weight"].set_data(net->proj->weight.to(torch::kBFloat16));
        if (mode == 3) net->named_parameters()["proj.bias"].set_data(net->proj->bias.to(torch::kBFloat16));
      }
      for (int dims : {3, 2, 1}) {  // [2, 5, 64] and [64] (reshaped inside), [10, 64] (used as is)
        INFO("input dims " << dims);
        auto x = dims == 3 ? torch::randn({2, 5, 64}) : dims == 2 ? torch::randn({10, 64}) : torch::randn({64});
        if (mode >= 2) x = x.to(torch::kBFloat16);
        std::optional<AutocastGuard> autocast;
        if (mode == 1 || mode == 2) autocast.emplace(c10::DeviceType::CPU, torch::kBFloat16, true);
        auto fused = run_layer(*net, x, alpha / 8, false), ref = run_layer(*net, x, alpha / 8, true);
        CHECK(fused.y.scalar_type() == ref.y.scalar_type());
        CHECK(fused.y.sizes() == ref.y.sizes());
        CHECK(torch::equal(fused.y, ref.y));
        CHECK(fused.dx.scalar_type() == x.scalar_type());
        CHECK(fused.dx.sizes() == x.sizes());
        CHECK(torch::equal(fused.dx, ref.dx));
        CHECK(fused.dA.scalar_type() == torch::kFloat);
        CHECK(torch::equal(fused.dA, ref.dA));
        CHECK(torch::equal(fused.dB, ref.dB));
      }
    }
  }
}

TEST_CASE("LoRA fused delta: higher-order gradients are refused, \"fused\": false gives them") {
  Lora lora;
  for (bool fused : {true, false}) {
    INFO("fused " << fused);
    torch::manual_seed(1);
    auto net = std::make_shared<WideNet>();
    lora.make(Json{{"r", 4}, {"target_regex", "proj"}, {"fused", fused}})->attach(*net);
    auto A = net->named_parameters()["proj.lora_default.lora_A"];
    {
      torch::NoGradGuard ng;
      net->named_parameters()["proj.lora_default.lora_B"].normal_();
    }
    auto y = net->forward(torch::randn({3, 64}));
    auto first = [&] {
      return torch::autograd::grad({y.pow(2).sum()}, {A}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    };
    if (fused) {
      CHECK_THROWS_WITH(first(), Catch::Contains("set \"fused\": false"));
    } else {
      auto g = first()[0];
      auto gg = torch::autograd::grad({g.pow(2).sum()}, {A})[0];
      CHECK(gg.abs().sum().item<double>() > 0);
    }
  }
}

}  // namespace refit_test_lora
