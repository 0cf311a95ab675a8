// The quantized weight formats (refit/quantized.h, framework/quant/quantize.h) against
// bitsandbytes 0.50.2's CPU functions (tests/golden/make_quantized.py) on real weights: MiniLM's
// layer-0 query, the quickstart ViT's layer-0 query, SmolLM2's layer-0 k_proj (from its GGUF, as
// transformers dequantizes it) and 40 values whose last block is short. Packed bytes, block
// maxima (plain and double-quantized) and int8 rows must be identical, and dequantized values
// equal bit for bit: both sides run the same float32 operations.
#include "test_support.h"

#include <cstring>

#include "io/gguf.h"
#include "io/gguf_tensor.h"
#include "io/safetensors.h"
#include "model/gguf_names.h"
#include "quant/dequantize_cpu.h"
#include "quant/quantize.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_quantized {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace refit;

namespace {

io::SafetensorsFile golden() {
  return io::SafetensorsFile::open(fs::path(test::source_dir()) / "tests/golden/quantized.safetensors");
}

/// The weight the fixture quantized, read by refit from its source (the small ones are stored).
torch::Tensor source_weight(const std::string& name, const io::SafetensorsFile& g) {
  if (g.contains(name + ".weight")) return g.load(name + ".weight");
  if (name == "minilm")
    return io::SafetensorsFile::open(fs::path(test::env_path("REFIT_MINILM_DIR")) / "model.safetensors")
        .load("encoder.layer.0.attention.self.query.weight")
        .to(torch::kFloat);
  if (name == "smollm2") {
    const auto f = io::GgufFile::open(test::env_path("REFIT_SMOLLM2_GGUF"));
    const torch::Tensor w = io::load_gguf_tensor(f, "blk.0.attn_k.weight", torch::kFloat);
    const auto heads = gguf_qk_permutation_heads(gguf_llama_layout(f), "blk.0.attn_k.weight");
    REQUIRE(heads);
    return gguf_unpermute_qk_rows(w, *heads, "blk.0.attn_k.weight");
  }
  FAIL("no source for " + name);
  return {};
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

const std::vector<std::string> kWeights{"minilm", "vit", "smollm2", "odd"};

}  // namespace

TEST_CASE("quantized: the NF4 and dynamic-map tables are bitsandbytes'") {
  auto g = golden();
  const auto& nf4 = quant::nf4_code();
  const auto& dynamic = quant::dynamic_code();
  CHECK(bitwise_equal(torch::from_blob(const_cast<float*>(nf4.data()), {16}, torch::kFloat), g.load("nf4_code")));
  CHECK(bitwise_equal(torch::from_blob(const_cast<float*>(dynamic.data()), {256}, torch::kFloat), g.load("dynamic_code")));
}

TEST_CASE("quantized: NF4 bytes and block maxima equal bitsandbytes' quantize_4bit on real weights") {
  auto g = golden();
  for (const auto& name : kWeights) {
    INFO(name);
    const torch::Tensor w = source_weight(name, g);
    const auto q = quant::quantize_nf4(w);
    CHECK(q.shape == w.sizes().vec());
    CHECK(bitwise_equal(q.packed, g.load(name + ".nf4.packed")));
    CHECK(bitwise_equal(q.absmax, g.load(name + ".nf4.absmax")));
    CHECK(q.bytes() == (w.numel() + 1) / 2 + 4 * ((w.numel() + 63) / 64));
    const torch::Tensor d = quant::dequantize_nf4(q);
    if (g.contains(name + ".nf4.dequantized"))
      CHECK(bitwise_equal(d.reshape(-1), g.load(name + ".nf4.dequantized").reshape(-1)));
    // Every value is within half the widest NF4 gap (between -1 and -0.6962: 0.1520 of the block
    // maximum) of the weight.
    const torch::Tensor maxima = q.absmax.repeat_interleave(64).narrow(0, 0, w.numel());
    CHECK(((d.reshape(-1) - w.reshape(-1)).abs() <= 0.1520 * maxima * (1 + 1e-6)).all().item<bool>());
    CHECK(d.scalar_type() == torch::kFloat);
    CHECK(quant::dequantize_nf4(q, torch::kBFloat16).scalar_type() == torch::kBFloat16);
  }
}

TEST_CASE("quantized: NF4 with double quantization equals bitsandbytes' compress_statistics") {
  auto g = golden();
  for (const auto& name : kWeights) {
    INFO(name);
    const torch::Tensor w = source_weight(name, g);
    quant::Nf4Options o;
    o.double_quantization = true;
    const auto q = quant::quantize_nf4(w, o);
    CHECK(q.double_quantized());
    CHECK(bitwise_equal(q.packed, g.load(name + ".nf4.packed")));
    CHECK(bitwise_equal(q.absmax, g.load(name + ".nf4dq.absmax")));
    CHECK(bitwise_equal(q.absmax_scale, g.load(name + ".nf4dq.absmax_scale")));
    CHECK(q.offset == g.load(name + ".nf4dq.offset").item<float>());
    if (g.contains(name + ".nf4dq.dequantized"))
      CHECK(bitwise_equal(quant::dequantize_nf4(q).reshape(-1), g.load(name + ".nf4dq.dequantized").reshape(-1)));
    // The 8-bit maxima stay within the map's resolution of the plain ones (its widest step near
    // 1 is 0.0138 of the largest |maximum - offset| of a block of 256).
    const torch::Tensor plain = g.load(name + ".nf4.absmax");
    const torch::Tensor spread = (plain - q.offset).abs().max();
    CHECK(((quant::nf4_block_maxima(q) - plain).abs() <= 0.0070 * spread + 1e-7).all().item<bool>());
  }
}

TEST_CASE("quantized: int8 rows equal bitsandbytes' int8_vectorwise_quant, and dequantize as it does") {
  auto g = golden();
  for (const auto& name : {"minilm", "vit", "smollm2"}) {
    INFO(name);
    const torch::Tensor w = source_weight(name, g);
    const auto q = quant::quantize_int8(w);
    CHECK(bitwise_equal(q.weight, g.load(std::string(name) + ".int8.weight")));
    if (g.contains(std::string(name) + ".int8.dequantized"))
      CHECK(bitwise_equal(quant::dequantize_int8(q), g.load(std::string(name) + ".int8.dequantized")));
    // Rounding to the nearest step: within half a step (row max / 254) of the weight.
    CHECK(((quant::dequantize_int8(q) - w).abs() <= q.scale.unsqueeze(1) / 254 * (1 + 1e-5)).all().item<bool>());
  }
}

TEST_CASE("quantized: planted bugs in the NF4 quantizer change bytes the fixture pins") {
  // The comparisons above are exact; each of these plausible mistakes must break them.
  auto g = golden();
  const torch::Tensor w = source_weight("minilm", g);
  const torch::Tensor want = g.load("minilm.nf4.packed");
  // Low nibble first instead of high.
  const auto q = quant::quantize_nf4(w);
  const torch::Tensor swapped = q.packed.bitwise_left_shift(4).bitwise_or(q.packed.bitwise_right_shift(4));
  CHECK_FALSE(bitwise_equal(swapped, want));
  // Blocks of 128 instead of 64.
  quant::Nf4Options wide;
  wide.blocksize = 128;
  CHECK_FALSE(bitwise_equal(quant::quantize_nf4(w, wide).packed, want));
  // The weight flattened in the other order (blocks over columns of the [out, in] matrix).
  CHECK_FALSE(bitwise_equal(quant::quantize_nf4(w.t().contiguous()).packed, want));
}

TEST_CASE("quantized: bad weights and block sizes are clear errors") {
  CHECK_THROWS_WITH(quant::quantize_nf4(torch::tensor({1.0f, NAN})), Contains("NaN or an infinite value"));
  quant::Nf4Options o;
  o.blocksize = 48;
  CHECK_THROWS_WITH(quant::quantize_nf4(torch::ones({96}), o), Contains("power of two in [16, 4096], got 48"));
  CHECK_THROWS_WITH(quant::quantize_nf4(torch::empty({0})), Contains("empty"));
  CHECK_THROWS_WITH(quant::quantize_int8(torch::ones({4})), Contains("2-d weight"));
  CHECK_THROWS_WITH(quant::quantize_int8(torch::zeros({2, 3})), Contains("all zeros"));
  // A zero block is not an error in NF4: its maximum is 0 and its values dequantize to 0.
  const auto q = quant::quantize_nf4(torch::zeros({64}));
  CHECK(quant::dequantize_nf4(q).abs().max().item<float>() == 0);
}

TEST_CASE("quantized: the CPU's one-pass dequantization gives the portable LibTorch path's values bit for bit "
          "(NF4 with and without double quantization, a short last block, int8, in float32 and bfloat16)") {
  torch::manual_seed(3);
  for (const std::vector<std::int64_t>& shape :
       std::vector<std::vector<std::int64_t>>{{96, 256}, {7, 45}, {1, 1}, {3, 1000}, {513, 64}}) {
    const torch::Tensor w = torch::randn(shape) * 0.05;
    for (const std::int64_t blocksize : {16, 64, 256}) {
      for (const bool dq : {false, true}) {
        quant::Nf4Options o;
        o.blocksize = blocksize;
        o.double_quantization = dq;
        const quant::Nf4Weight q = quant::quantize_nf4(w, o);
        for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
          INFO(shape[0] << "x" << shape[1] << " blocksize " << blocksize << " double " << dq << " " << c10::toString(dtype));
          const torch::Tensor fast = quant::dequantize_nf4_fast(q, dtype), portable = quant::dequantize_nf4(q, dtype);
          CHECK(fast.sizes() == portable.sizes());
          CHECK(fast.scalar_type() == dtype);
          CHECK(torch::equal(fast, portable));
        }
      }
    }
    if (shape.size() == 2) {
      const quant::Int8Weight q = quant::quantize_int8(w);
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        INFO("int8 " << shape[0] << "x" << shape[1] << " " << c10::toString(dtype));
        CHECK(torch::equal(quant::dequantize_int8_fast(q, dtype), quant::dequantize_int8(q, dtype)));
      }
    }
  }
}

}  // namespace refit_test_quantized
