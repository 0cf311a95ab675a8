// Building a model for its weights file (BuildContext::weights_follow) and streaming the file into
// the declared dtypes and storage (model/weights.h, WeightTargets): the built model holds no
// memory for its parameters, and the streamed load ends in exactly the tensors that building in
// float32, loading and casting or quantizing at registration gives, for a dense bf16 base and an
// NF4 one (whose untied lm_head stays dense, as transformers keeps it); the frozen-base
// fingerprint covers the packed weights.
#include <ATen/ATen.h>

#include "core/plugin_loader.h"
#include "model/model_registry.h"
#include "model/weights.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "refit/layer_targets.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_weight_streaming {

using namespace refit;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct StreamFixture {
  Registry registry;
  PluginLoader loader{registry};
  StreamFixture() { loader.load("llm"); }

  ModelPtr build(const fs::path& dir, bool weights_follow) {
    auto issues = std::make_shared<ConfigIssues>();
    BuildContext ctx;
    ctx.weights_follow = weights_follow;
    ModelPtr m =
        registry.models.parse("llama", "/type",
                              ConfigReader(Json{{"config_file", (dir / "config.json").string()}}, "/config", issues))(ctx);
    REQUIRE(issues->empty());
    return m;
  }
};

/// Every parameter and buffer by path, as registration left them.
std::map<std::string, torch::Tensor> tensors_of(const Model& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value();
  return out;
}

}  // namespace

TEST_CASE("weights: a model built for its weights file holds no parameter memory, and the streamed load gives the "
          "tensors registration gave before, in bf16 and in NF4") {
  StreamFixture f;
  for (const std::string name : {"tiny_llama", "tiny_qwen2"}) {
    const auto dir = fs::path(test::source_dir()) / "tests/golden/llama" / name;
    {
      ModelPtr placeholders = f.build(dir, /*weights_follow=*/true);
      std::int64_t elements = 0;
      for (const auto& p : placeholders->named_parameters()) {
        INFO(p.key());
        CHECK(nn::is_unloaded(p.value()));
        CHECK(p.value().storage().nbytes() == p.value().element_size());  // one element behind the whole shape
        elements += p.value().numel();
      }
      CHECK(elements > 10000);
    }
    for (const std::string storage : {"bf16", "nf4"}) {
      INFO(name << " " << storage);
      ModelSpec spec;
      spec.name = "lm";
      spec.trainable = false;
      spec.dtype = c10::kBFloat16;
      if (storage == "nf4") {
        spec.storage.format = "nf4";
        spec.storage.blocksize = 32;
      }
      // Before: built in float32 with a random initialisation, loaded, then cast or quantized.
      ModelPtr before = f.build(dir, false);
      load_weights(*before, dir / "model.safetensors", "lm");
      ModelRegistry before_registry(Precision::bf16_mixed);
      before_registry.add(before, spec, torch::kCPU);
      // Streamed: placeholders filled in the declared dtype, projections packed as they are read.
      ModelPtr streamed = f.build(dir, true);
      load_weights(*streamed, dir / "model.safetensors", "lm", weight_targets(spec, *streamed));
      for (const auto& p : streamed->named_parameters()) {
        INFO(p.key());
        CHECK_FALSE(nn::is_unloaded(p.value()));
        CHECK(p.value().scalar_type() == torch::kBFloat16);  // read in its final dtype
      }
      std::size_t packed_at_load = 0;
      for (auto& [path, layer] : adaptable_layers(*streamed)) packed_at_load += layer->quantized_weight() != nullptr;
      ModelRegistry streamed_registry(Precision::bf16_mixed);
      streamed_registry.add(streamed, spec, torch::kCPU);

      const auto a = tensors_of(*before), b = tensors_of(*streamed);
      REQUIRE(a.size() == b.size());
      for (const auto& [path, t] : a) {
        INFO(path);
        REQUIRE(b.count(path));
        CHECK(t.scalar_type() == b.at(path).scalar_type());
        CHECK(torch::equal(t, b.at(path)));  // bit for bit: the same values, packed the same way
      }
      std::size_t quantized = 0;
      bool lm_head_dense = true;
      for (auto& [path, layer] : adaptable_layers(*streamed)) {
        quantized += layer->quantized_weight() != nullptr;
        if (path == "lm_head") lm_head_dense = layer->quantized_weight() == nullptr;
      }
      CHECK(packed_at_load == quantized);                                    // nothing was left for registration to pack
      const std::size_t projections = name == "tiny_llama" ? 2 * 7 : 1 * 7;  // layers x (q, k, v, o, gate, up, down)
      CHECK(quantized == (storage == "nf4" ? projections : 0u));             // never lm_head
      CHECK(lm_head_dense);
      CHECK(a.count("lm_head.weight") == (name == "tiny_qwen2" ? 1u : 0u));
    }
  }
}

TEST_CASE("weights: a placeholder refuses writes, and a file that does not match is refused before a tensor is read") {
  StreamFixture f;
  const auto dir = fs::path(test::source_dir()) / "tests/golden/llama/tiny_llama";
  ModelPtr m = f.build(dir, true);
  auto w = m->named_parameters()["model.norm.weight"];
  CHECK_THROWS_WITH(w.detach().uniform_(), Contains("single memory location"));
  // A file for another architecture: the strict check refuses it before any tensor is read.
  const auto qwen = fs::path(test::source_dir()) / "tests/golden/llama/tiny_qwen2/model.safetensors";
  CHECK_THROWS_WITH(load_weights(*m, qwen, "lm"), Contains("does not match the model"));
}

TEST_CASE("weights: the frozen-base fingerprint covers a quantized base's packed weights") {
  StreamFixture f;
  const auto dir = fs::path(test::source_dir()) / "tests/golden/llama/tiny_llama";
  ModelSpec spec;
  spec.name = "lm";
  spec.trainable = false;
  spec.dtype = c10::kBFloat16;
  spec.storage.format = "nf4";
  spec.storage.blocksize = 32;
  ModelPtr m = f.build(dir, true);
  load_weights(*m, dir / "model.safetensors", "lm", weight_targets(spec, *m));
  ModelRegistry models(Precision::bf16_mixed);
  models.add(m, spec, torch::kCPU);
  const std::string before = base_fingerprint(models);
  CHECK(base_fingerprint(models) == before);  // a function of the base alone
  // One packed byte of one projection (two of its 4-bit codes) changed: another base.
  torch::Tensor packed = m->named_buffers()["model.layers.1.mlp.down_proj.weight_nf4.packed"];
  {
    torch::NoGradGuard ng;
    packed[7].bitwise_xor_(0x11);
  }
  CHECK(base_fingerprint(models) != before);
}

TEST_CASE("weights: a base read from files is fingerprinted by their digest, not its bytes, another file, dtype or "
          "storage is another base, and a checkpoint holding the fingerprint of the bytes still loads") {
  StreamFixture f;
  const auto golden = fs::path(test::source_dir()) / "tests/golden/llama/tiny_llama";
  const fs::path work = fs::temp_directory_path() / "refit-tests" / "base-digest";
  io::remove_tree(work);
  fs::create_directories(work / "copy");
  fs::copy_file(golden / "model.safetensors", work / "copy" / "renamed.safetensors");
  const auto load = [&](const fs::path& file, c10::ScalarType dtype, const std::string& storage) {
    ModelSpec spec;
    spec.name = "lm";
    spec.trainable = false;
    spec.dtype = dtype;
    spec.storage.format = storage;
    spec.storage.blocksize = 32;
    ModelPtr m = f.build(golden, true);
    LoadedWeights loaded = load_weights(*m, file, "lm", weight_targets(spec, *m));
    auto models = std::make_unique<ModelRegistry>(Precision::bf16_mixed);
    models->add(m, spec, torch::kCPU);
    models->set_loaded_weights("lm", std::move(loaded));
    return models;
  };
  auto models = load(golden / "model.safetensors", c10::kBFloat16, "");
  const std::string fingerprint = base_fingerprint(*models);
  CHECK(base_fingerprint(*load(work / "copy" / "renamed.safetensors", c10::kBFloat16, "")) == fingerprint);
  CHECK(base_fingerprint(*load(golden / "model.safetensors", c10::kFloat, "")) != fingerprint);
  CHECK(base_fingerprint(*load(golden / "model.safetensors", c10::kBFloat16, "nf4")) != fingerprint);

  // The last float of one projection changed in the file: another base.
  auto tensors = io::SafetensorsFile::open(golden / "model.safetensors").load_all();
  auto& down = tensors.at("model.layers.1.mlp.down_proj.weight");
  down.view({-1})[-1] += 1;
  io::save_safetensors(work / "edited.safetensors", tensors);
  CHECK(base_fingerprint(*load(work / "edited.safetensors", c10::kBFloat16, "")) != fingerprint);

  // The tensors' bytes are not read: a change in memory (which no run makes) goes unseen by
  // the digest fingerprint, and is seen by the bytes one.
  const std::string bytes_before = base_fingerprint(*models, BaseFingerprint::bytes);
  CHECK(bytes_before != fingerprint);
  {
    torch::NoGradGuard ng;
    models->models()[0].model->named_parameters()["model.norm.weight"].add_(1);
  }
  CHECK(base_fingerprint(*models) == fingerprint);
  const std::string bytes_after = base_fingerprint(*models, BaseFingerprint::bytes);
  CHECK(bytes_after != bytes_before);

  // A checkpoint written before digests (its fingerprint is of the bytes) is still accepted
  // when the bytes match; one of another base is refused.
  auto fresh = load(golden / "model.safetensors", c10::kBFloat16, "");
  // As refit < 0.6.0 wrote it: the bytes' fingerprint, and no base_fingerprint_kind.
  const auto old_checkpoint = [&](const fs::path& root, const std::string& fingerprint) {
    const auto dir = save_checkpoint(root, *fresh, fingerprint, {}, {});
    const auto file = dir / "trainable.safetensors";
    auto meta = io::SafetensorsFile::open(file).metadata();
    const auto tensors = io::SafetensorsFile::open(file).load_all();
    meta.erase("base_fingerprint_kind");
    io::save_safetensors(file, tensors, meta);
    return dir;
  };
  const std::string bytes = base_fingerprint(*fresh, BaseFingerprint::bytes);
  CHECK_NOTHROW(load_trainable_weights(old_checkpoint(work / "old", bytes), *fresh));
  CHECK_THROWS_WITH(load_trainable_weights(old_checkpoint(work / "other", bytes_after), *fresh),
                    Contains("was trained on another frozen base"));
  // A checkpoint of this version with the bytes' fingerprint is not taken for an old one.
  CHECK_THROWS_WITH(load_trainable_weights(save_checkpoint(work / "new", *fresh, bytes, {}, {}), *fresh),
                    Contains("was trained on another frozen base"));
}

}  // namespace refit_test_weight_streaming
