// (IA)^3 (Liu et al. 2022, "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than
// In-Context Learning"): one learned scale per output channel of chosen Linear layers,
// y = base(x) * l. The scale is trainable float32 on a frozen (bf16) base, starts at 1 (the
// model is unchanged until it trains), and the layer computes its base product once: the
// adapter receives it (LayerAdapter::adapt) instead of recomputing it. The complete adapter
// plugin walked through in docs/plugins.md; built out of tree against the installed SDK by
// tests/integration/out_of_tree.sh, and in the test tree as the test plugin "ia3".
#include "refit/layer_targets.h"
#include "refit/plugin.h"

namespace {

using namespace refit;

/// The scale of one layer: "ia3_l" [out], under the layer's submodule "ia3_<name>".
class Ia3Scale : public nn::LayerAdapter {
 public:
  explicit Ia3Scale(std::int64_t out_features) { ia3_l = register_parameter("ia3_l", torch::ones({out_features})); }
  torch::Tensor adapt(const torch::Tensor& input, const torch::Tensor& output, const nn::AdaptableLayer& layer) override {
    (void)input, (void)layer;
    // Scale the last dimension (Linear: [..., out]); in the output's dtype, as the base's.
    return output * ia3_l.to(output.scalar_type());
  }
  torch::Tensor ia3_l;
};

struct Ia3Options {
  std::string name = "default";
  LayerTargets targets;
  static Ia3Options from_config(const ConfigReader& c) {
    Ia3Options o;
    o.name = c.optional<std::string>("name", o.name);
    o.targets = LayerTargets::from_config(c);
    o.targets.layer_types = {"linear"};
    return o;
  }
  std::string key() const { return "ia3_" + name; }
};

class Ia3Adapter : public Adapter {
 public:
  explicit Ia3Adapter(Ia3Options o) : options_(std::move(o)) {}
  void attach(Model& model) override {
    for (auto& [path, layer] : target_layers(model, options_.targets, "ia3 \"" + options_.name + "\""))
      layer->add_adapter(options_.key(), std::make_shared<Ia3Scale>(layer->weight.size(0)));
  }
  /// The scales are trainable float32 (master weights), whatever the base's dtype.
  std::vector<ParameterRule> parameter_rules() const override {
    ParameterRule r;
    r.pattern = "(.*\\.)?" + options_.key() + "\\.ia3_l";
    r.trainable = true;
    r.dtype = c10::kFloat;
    return {r};
  }
  void set_active(Model& model, bool active) override {
    for (auto& [path, layer] : adaptable_layers(model))
      if (auto a = layer->adapter(options_.key())) a->active = active;
  }

 private:
  Ia3Options options_;
};

void register_ia3(Registry& r) {
  r.adapters.add("ia3", "(IA)^3: a learned scale per output channel of the targeted Linear layers",
                 [](const ConfigReader& c) -> Builder<Adapter> {
                   auto o = Ia3Options::from_config(c);
                   return [o](const BuildContext&) { return std::make_shared<Ia3Adapter>(o); };
                 });
}

}  // namespace

REFIT_PLUGIN("ia3", "1.0.0", register_ia3)
