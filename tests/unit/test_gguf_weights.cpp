// Loading weights from GGUF files and transformers folders (framework/model/weights.h): tiny
// llama / qwen2 GGUFs against transformers' own reading of the same files (names, values, the
// q/k rows un-permuted), SmolLM2's layer 0 q/k against transformers' reverse permutation, tied
// embeddings, strict matching, and sharded safetensors checkpoints.
#include "test_support.h"

#include <unistd.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "crc32.h"
#include "io/gguf.h"
#include "io/gguf_tensor.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "model/gguf_names.h"
#include "model/weights.h"
#include "quant/gguf_blocks.h"
#include "refit/model.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_gguf_weights {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

/// A model whose parameters are exactly `shapes` (a dotted name becomes nested submodules), so
/// that loading can be tested on any layout without a decoder implementation.
class StateModel : public refit::Model {
 public:
  StateModel(const std::map<std::string, std::vector<std::int64_t>>& shapes, c10::ScalarType dtype) {
    for (const auto& [name, shape] : shapes) {
      torch::nn::Module* m = this;
      std::size_t start = 0;
      for (std::size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1) {
        const std::string part = name.substr(start, dot - start);
        auto* child = m->named_children().find(part);
        m = child ? child->get() : m->register_module(part, std::make_shared<torch::nn::Module>()).get();
      }
      m->register_parameter(name.substr(start), torch::zeros(shape, torch::TensorOptions().dtype(dtype)));
    }
  }
  std::vector<std::string> input_fields() const override { return {"x"}; }
  std::vector<std::string> output_fields() const override { return {"y"}; }
  refit::Fields forward_fields(const refit::Fields&) override { throw refit::Error("not a runnable model"); }
};

std::string golden(const std::string& name) { return refit::test::source_dir() + "/tests/golden/gguf/" + name; }

std::map<std::string, torch::Tensor> expected(const std::string& name) {
  return refit::io::SafetensorsFile::open(golden(name + ".expected.safetensors")).load_all();
}

std::map<std::string, std::vector<std::int64_t>> shapes_of(const std::map<std::string, torch::Tensor>& state) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const auto& kv : state) out[kv.first] = kv.second.sizes().vec();
  return out;
}

std::string load_error(refit::Model& m, const fs::path& file) {
  try {
    refit::load_weights(m, file, "decoder");
  } catch (const refit::Error& e) {
    return e.what();
  }
  return "no error";
}

/// Every parameter equals the expected tensor exactly (cast to the model's dtype).
void check_equal(const refit::Model& m, const std::map<std::string, torch::Tensor>& want) {
  const auto state = refit::model_state(m);
  REQUIRE(state.size() == want.size());
  for (const auto& [name, t] : state) {
    INFO(name);
    REQUIRE(want.count(name));
    CHECK(torch::equal(t, want.at(name).to(t.scalar_type())));
  }
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "refit-tests" / ("gguf-" + std::to_string(::getpid())) / name;
  refit::io::remove_tree(d);  // not fs::remove_all: LibTorch's copy of it crashes (io/remove_tree.h)
  fs::create_directories(d);
  return d;
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

}  // namespace

TEST_CASE("gguf weights: a tiny llama GGUF loads as transformers reads it (names, values, q/k rows un-permuted)") {
  const auto want = expected("tiny_llama");
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO(c10::toString(dtype));
    StateModel m(shapes_of(want), dtype);
    refit::load_weights(m, golden("tiny_llama.gguf"), "decoder");
    check_equal(m, want);  // exact: both dequantize in fp32 the same way; bf16 rounds that once
  }
  // The permutation is real: the file's own row order differs from transformers'.
  const auto f = refit::io::GgufFile::open(golden("tiny_llama.gguf"));
  for (const char* name : {"blk.0.attn_q.weight", "blk.1.attn_k.weight"}) {
    const auto raw = refit::io::load_gguf_tensor(f, name, torch::kFloat);
    const auto hf = want.at(*refit::gguf_to_transformers_name(name));
    CHECK(!torch::equal(raw, hf));
    CHECK(torch::equal(std::get<0>(raw.sort(0)), std::get<0>(hf.sort(0))));  // the same rows, reordered
  }
}

TEST_CASE("gguf weights: a qwen2 GGUF keeps transformers' q/k order and loads its q/k/v biases") {
  const auto want = expected("tiny_qwen2");
  REQUIRE(want.count("model.layers.1.self_attn.k_proj.bias"));
  StateModel m(shapes_of(want), torch::kFloat);
  refit::load_weights(m, golden("tiny_qwen2.gguf"), "decoder");
  check_equal(m, want);
  const auto layout = refit::gguf_llama_layout(refit::io::GgufFile::open(golden("tiny_qwen2.gguf")));
  CHECK(layout.architecture == "qwen2");
  CHECK(!layout.permuted_qk);
}

TEST_CASE("gguf weights: tied embeddings (no output.weight) load into a model without lm_head, and only there") {
  const auto tied = expected("tiny_llama_tied");
  REQUIRE(!tied.count("lm_head.weight"));
  StateModel m(shapes_of(tied), torch::kFloat);
  refit::load_weights(m, golden("tiny_llama_tied.gguf"), "decoder");
  check_equal(m, tied);

  const auto untied = expected("tiny_llama");
  StateModel with_head(shapes_of(untied), torch::kFloat);
  CHECK_THAT(load_error(with_head, golden("tiny_llama_tied.gguf")),
             Contains("does not match the model") && Contains("missing from the file (1):\n    lm_head.weight [40, 32]"));
  StateModel without_head(shapes_of(tied), torch::kFloat);
  CHECK_THAT(load_error(without_head, golden("tiny_llama.gguf")),
             Contains("unexpected in the file (1):\n    lm_head.weight [40, 32] (GGUF output.weight)"));
}

TEST_CASE("gguf weights: strict matching lists missing, unexpected and mismatched tensors with their GGUF names") {
  auto shapes = shapes_of(expected("tiny_llama"));
  shapes["model.layers.0.self_attn.q_proj.weight"] = {32, 16};
  shapes["model.layers.9.mlp.up_proj.weight"] = {64, 32};
  shapes.erase("model.layers.1.mlp.down_proj.weight");
  StateModel m(shapes, torch::kFloat);
  const std::string e = load_error(m, golden("tiny_llama.gguf"));
  CHECK_THAT(e, Contains("missing from the file (1):\n    model.layers.9.mlp.up_proj.weight [64, 32]"));
  CHECK_THAT(e, Contains("unexpected in the file (1):\n    model.layers.1.mlp.down_proj.weight [32, 64] (GGUF "
                         "blk.1.ffn_down.weight)"));
  CHECK_THAT(e, Contains("shape mismatches (1):\n    model.layers.0.self_attn.q_proj.weight: file [32, 32], model [32, "
                         "16] (GGUF blk.0.attn_q.weight)"));
  // Nothing was loaded: the parameters are still zeros.
  CHECK(refit::model_state(m).at("model.embed_tokens.weight").abs().sum().item<float>() == 0);
}

TEST_CASE("gguf weights: llama.cpp's names map to transformers' and no other") {
  CHECK(refit::gguf_to_transformers_name("token_embd.weight") == "model.embed_tokens.weight");
  CHECK(refit::gguf_to_transformers_name("output_norm.weight") == "model.norm.weight");
  CHECK(refit::gguf_to_transformers_name("output.weight") == "lm_head.weight");
  CHECK(refit::gguf_to_transformers_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight");
  CHECK(refit::gguf_to_transformers_name("blk.0.attn_v.bias") == "model.layers.0.self_attn.v_proj.bias");
  CHECK(refit::gguf_to_transformers_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight");
  CHECK(refit::gguf_to_transformers_name("blk.3.attn_norm.weight") == "model.layers.3.input_layernorm.weight");
  for (const char* bad : {"blk.01.attn_q.weight", "blk..attn_q.weight", "blk.1.attn_qkv.weight", "blk.1.attn_q.scale",
                          "token_embd", "rope_freqs.weight", "blk.-1.ffn_up.weight"})
    CHECK(!refit::gguf_to_transformers_name(bad));
  CHECK_THROWS_WITH(refit::gguf_unpermute_qk_rows(torch::zeros({6, 4}), 2, "q"), Contains("6 rows cannot be 2 heads"));
  // The inverse of llama.cpp's permute: rows (h, i, j) -> (h, j, i) within each head.
  const auto rows = torch::arange(8, torch::kFloat);
  CHECK(torch::equal(refit::gguf_unpermute_qk_rows(rows, 2, "q"), torch::tensor({0., 2., 1., 3., 4., 6., 5., 7.})));
}

TEST_CASE("gguf weights: SmolLM2's layer 0 q/k un-permuted equal transformers' reverse permutation, element for element") {
  const std::string path = refit::test::env_path("REFIT_SMOLLM2_GGUF");
  std::ifstream in(golden("smollm2.json"));
  const auto ref = nlohmann::json::parse(in);
  const auto f = refit::io::GgufFile::open(path);
  const auto layout = refit::gguf_llama_layout(f);
  CHECK(layout.n_head == 9);
  CHECK(layout.n_head_kv == 3);
  REQUIRE(layout.permuted_qk);
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}) {
    INFO(name);
    const auto heads = refit::gguf_qk_permutation_heads(layout, name);
    REQUIRE(heads);
    const auto w =
        refit::gguf_unpermute_qk_rows(refit::io::load_gguf_tensor(f, name, torch::kFloat), *heads, name).contiguous();
    const auto& want = ref["unpermuted"][name];
    CHECK(refit::test::crc32(w.data_ptr(), static_cast<std::size_t>(w.numel()) * 4) ==
          want["crc32_f32"].get<std::uint32_t>());
    const float* p = w.data_ptr<float>();
    for (const auto& s : want["samples"]) {
      std::uint32_t bits;
      std::memcpy(&bits, p + s[0].get<std::size_t>(), 4);
      REQUIRE(bits == s[1].get<std::uint32_t>());
    }
  }
  CHECK(!refit::gguf_qk_permutation_heads(layout, "blk.0.attn_v.weight"));
  // bf16 straight from the packed bytes = the fp32 values rounded by torch.
  const auto bf16 = refit::io::load_gguf_tensor(f, "token_embd.weight", torch::kBFloat16);
  CHECK(torch::equal(bf16, refit::io::load_gguf_tensor(f, "token_embd.weight", torch::kFloat).to(torch::kBFloat16)));
  CHECK_THROWS_WITH(refit::io::load_gguf_tensor(f, "token_embd.weight", torch::kLong), Contains("cannot be loaded as Long"));
}

TEST_CASE("weights: a sharded transformers checkpoint (index.json) and a folder load strictly") {
  const auto want = expected("tiny_llama");
  const fs::path dir = fresh_dir("sharded");
  std::map<std::string, torch::Tensor> a, b;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : want) {
    const bool first = name < "model.layers.1";
    (first ? a : b)[name] = t;
    index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  refit::io::save_safetensors(dir / "model-00001-of-00002.safetensors", a);
  refit::io::save_safetensors(dir / "model-00002-of-00002.safetensors", b);
  write_text(dir / "model.safetensors.index.json", index.dump());
  for (const fs::path& p : {dir / "model.safetensors.index.json", dir}) {
    INFO(p.string());
    StateModel m(shapes_of(want), torch::kBFloat16);
    refit::load_weights(m, p, "decoder");
    check_equal(m, want);
  }
  StateModel m(shapes_of(want), torch::kFloat);
  // A folder with model.safetensors takes it.
  const fs::path single = fresh_dir("single");
  refit::io::save_safetensors(single / "model.safetensors", want);
  refit::load_weights(m, single, "decoder");
  check_equal(m, want);
  CHECK_THAT(load_error(m, fresh_dir("empty")),
             Contains("holds neither model.safetensors nor model.safetensors.index.json"));

  // The index and its shards must agree; a shard is a file beside the index.
  auto bad = index;
  bad["weight_map"]["model.norm.weight"] = "../model-00002-of-00002.safetensors";
  write_text(dir / "bad.json", bad.dump());
  CHECK_THAT(load_error(m, dir / "bad.json"), Contains("weight_map/model.norm.weight names \"../model-00002-of-00002."
                                                       "safetensors\", not a file name in the index's folder"));
  bad = index;
  bad["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  write_text(dir / "bad.json", bad.dump());
  CHECK_THAT(load_error(m, dir / "bad.json"),
             Contains("weight_map puts \"model.norm.weight\" in model-00001-of-00002.safetensors, which does not hold it"));
  bad = index;
  bad["weight_map"].erase("model.norm.weight");
  write_text(dir / "bad.json", bad.dump());
  CHECK_THAT(load_error(m, dir / "bad.json"), Contains("holds \"model.norm.weight\", which weight_map does not put there"));
  write_text(dir / "bad.json", "{\"weights\": {}}");
  CHECK_THAT(load_error(m, dir / "bad.json"), Contains("expected a JSON object with a \"weight_map\" object"));
  // Strict across shards: a model with one more parameter.
  auto more = shapes_of(want);
  more["model.extra.weight"] = {2};
  StateModel bigger(more, torch::kFloat);
  CHECK_THAT(load_error(bigger, dir),
             Contains("sharded weights") && Contains("missing from the file (1):\n    model.extra.weight [2]"));
  refit::io::remove_tree(dir.parent_path());
}

}  // namespace refit_test_gguf_weights

// ---- GGUF blocks kept as read ("dtype": "gguf", quant/gguf_blocks.h) --------------------------

namespace refit_test_gguf_weights {

TEST_CASE("gguf blocks: Q8_0, Q4_0 and Q4_1 kept as read dequantize bit for bit as gguf-py, on the CPU and through "
          "the portable LibTorch path") {
  std::ifstream in(golden("types.json"));
  const auto ref = nlohmann::json::parse(in);
  const auto f = refit::io::GgufFile::open(golden("types.gguf"));
  const auto is_nan16 = [](std::uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; };
  std::size_t checked = 0;
  for (auto it = ref["tensors"].begin(); it != ref["tensors"].end(); ++it) {
    const auto& info = f.info(it.key());
    if (!refit::quant::gguf_blocks_supported(info.type) || !it.value().contains("f32")) continue;
    INFO(it.key() << " " << refit::io::gguf_type_name(info.type));
    // As a weight: the innermost dimension a row, the rest rows.
    const std::int64_t cols = info.shape.back(), rows = info.numel() / cols;
    auto raw = f.read_raw(it.key());
    const torch::Tensor bytes =
        torch::from_blob(raw.data(), {rows, static_cast<std::int64_t>(raw.size()) / rows}, torch::kUInt8).clone();
    const refit::quant::GgufBlocks b{info.type, bytes, {rows, cols}};
    const auto f32 = it.value()["f32"].get<std::vector<std::uint32_t>>();
    const auto bf16 = it.value()["bf16"].get<std::vector<std::uint16_t>>();
    for (const bool portable : {false, true}) {
      INFO((portable ? "portable" : "CPU"));
      const torch::Tensor w32 = portable ? refit::quant::dequantize_gguf_blocks_portable(b, torch::kFloat)
                                         : refit::quant::dequantize_gguf_blocks(b, torch::kFloat);
      const torch::Tensor w16 = portable ? refit::quant::dequantize_gguf_blocks_portable(b, torch::kBFloat16)
                                         : refit::quant::dequantize_gguf_blocks(b, torch::kBFloat16);
      REQUIRE(w32.numel() == static_cast<std::int64_t>(f32.size()));
      const auto* p32 = static_cast<const std::uint32_t*>(w32.const_data_ptr());
      const auto* p16 = static_cast<const std::uint16_t*>(w16.const_data_ptr());
      for (std::size_t i = 0; i < f32.size(); ++i) {
        INFO("element " << i);
        REQUIRE(p32[i] == f32[i]);
        // A NaN: c10's scalar cast gives 0x7FC0, torch's vectorised one 0xFFFF (both NaN).
        if (is_nan16(bf16[i])) REQUIRE(is_nan16(p16[i]));
        else
          REQUIRE(p16[i] == bf16[i]);
      }
    }
    ++checked;
  }
  CHECK(checked >= 3);
  // What does not fit is refused by what it is.
  auto b = refit::quant::GgufBlocks{refit::io::GgufType::Q4_1, torch::zeros({2, 20}, torch::kUInt8), {2, 32}};
  CHECK_NOTHROW(refit::quant::check_gguf_blocks(b));
  b.shape = {2, 64};
  CHECK_THROWS_WITH(refit::quant::check_gguf_blocks(b), Contains("blocks of a [2, 64] weight must be uint8 [2, 40]"));
  b.shape = {2, 48};
  CHECK_THROWS_WITH(refit::quant::check_gguf_blocks(b), Contains("rows are whole blocks of 32"));
  b.type = refit::io::GgufType::F16;
  CHECK_THROWS_WITH(refit::quant::check_gguf_blocks(b), Contains("GGUF type F16 is not kept as blocks"));
}

}  // namespace refit_test_gguf_weights
