// libFuzzer target: the GGUF reader (GgufFile::from_bytes, then every metadata accessor and every
// tensor read: dequantized to float32 and bf16 when refit reads its type, raw otherwise), and the
// path a tensor kept as its blocks takes ("dtype": "gguf", framework/model/weights.cpp): its raw
// bytes as uint8 [rows, row bytes], llama.cpp's q/k row permutation undone on whole rows of bytes,
// check_gguf_blocks, and both dequantizations of the blocks (one pass on the CPU; LibTorch
// operations, what other devices run), each of which must equal the reader's bit for bit (any NaN
// for a NaN): a difference aborts, as a crash does.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "io/gguf.h"
#include "model/gguf_names.h"
#include "quant/gguf_blocks.h"
#include "refit/error.h"

namespace {

bool same_bits_or_both_nan(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

bool bf16_nan(std::uint16_t v) { return (v & 0x7F80) == 0x7F80 && (v & 0x007F) != 0; }

/// Aborts unless `got` has the shape and dtype asked for and holds `want`'s values (float32 or
/// bfloat16, [rows, cols]).
void expect_equal(const at::Tensor& got, at::IntArrayRef shape, at::ScalarType dtype, const float* want,
                  const std::uint16_t* want16) {
  if (got.sizes() != shape || got.scalar_type() != dtype) std::abort();  // a finding, not an overflow below
  const auto c = got.contiguous();
  const std::int64_t n = c.numel();
  if (c.scalar_type() == at::kFloat) {
    const float* g = c.data_ptr<float>();
    for (std::int64_t i = 0; i < n; ++i)
      if (!same_bits_or_both_nan(g[i], want[i])) std::abort();
  } else {
    const auto* g = reinterpret_cast<const std::uint16_t*>(c.data_ptr());
    for (std::int64_t i = 0; i < n; ++i)
      if (g[i] != want16[i] && !(bf16_nan(g[i]) && bf16_nan(want16[i]))) std::abort();
  }
}

/// The blocks path on one tensor the reader dequantized to `dense` / `dense16`; `heads` (from the
/// input's last byte) the q/k permutation to undo, when the rows split into its halves.
void check_blocks(const refit::io::GgufFile& f, const refit::io::GgufTensorInfo& t, std::vector<float>& dense,
                  std::vector<std::uint16_t>& dense16, std::int64_t heads) {
  using refit::quant::GgufBlocks;
  auto raw = f.read_raw(t.name);
  const std::int64_t rows = t.shape[0], cols = t.shape[1];
  at::Tensor bytes = at::from_blob(raw.data(), {rows, static_cast<std::int64_t>(raw.size()) / rows}, at::kByte).clone();
  at::Tensor want = at::from_blob(dense.data(), {rows, cols}, at::kFloat);
  at::Tensor want16 = at::from_blob(dense16.data(), {rows, cols}, at::kShort);
  if (rows % (2 * heads) == 0) {
    // Row permutations move whole rows: the blocks' bytes and the reader's values alike.
    bytes = refit::gguf_unpermute_qk_rows(bytes, heads, "fuzz").contiguous();
    want = refit::gguf_unpermute_qk_rows(want, heads, "fuzz").contiguous();
    want16 = refit::gguf_unpermute_qk_rows(want16, heads, "fuzz").contiguous();
  }
  const GgufBlocks b{t.type, bytes, t.shape};
  try {
    refit::quant::check_gguf_blocks(b);
  } catch (const refit::Error&) {
    std::abort();  // the reader accepted the tensor, so its blocks must fit
  }
  const auto* w = want.data_ptr<float>();
  const auto* w16 = reinterpret_cast<const std::uint16_t*>(want16.data_ptr());
  try {
    const auto shape = want.sizes();
    expect_equal(refit::quant::dequantize_gguf_blocks(b, at::kFloat), shape, at::kFloat, w, w16);
    expect_equal(refit::quant::dequantize_gguf_blocks(b, at::kBFloat16), shape, at::kBFloat16, w, w16);
    expect_equal(refit::quant::dequantize_gguf_blocks_portable(b, at::kFloat), shape, at::kFloat, w, w16);
    expect_equal(refit::quant::dequantize_gguf_blocks_portable(b, at::kBFloat16), shape, at::kBFloat16, w,
                 w16);  // any NaN for a NaN
  } catch (const refit::Error&) {
    std::abort();  // blocks check_gguf_blocks accepted must dequantize
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto buf = std::shared_ptr<std::uint8_t>(new std::uint8_t[size ? size : 1], std::default_delete<std::uint8_t[]>());
  if (size) std::memcpy(buf.get(), data, size);
  const std::int64_t heads = size ? 1 + data[size - 1] % 4 : 1;
  try {
    auto f = refit::io::GgufFile::from_bytes(buf, size, "fuzz");
    for (const auto& kv : f.metadata()) {
      const std::string& key = kv.first;  // not a structured binding: clang < 16 cannot capture one
      // Each accessor either returns or throws refit::Error for a value of another type.
      const auto each = [&](auto&& get) {
        try {
          (void)get();
        } catch (const refit::Error&) {
        }
      };
      each([&] { return f.get_string(key); });
      each([&] { return f.get_uint(key); });
      each([&] { return f.get_int(key); });
      each([&] { return f.get_float(key); });
      each([&] { return f.get_bool(key); });
      each([&] { return f.get_string_array(key); });
      each([&] { return f.get_int_array(key); });
      each([&] { return f.get_float_array(key); });
    }
    for (const auto& t : f.tensors()) {
      // The reader bounds every tensor by the input's size, so these buffers are at most a few
      // times the input (a Q4_0 block: 18 bytes -> 32 floats).
      if (!refit::io::gguf_can_dequantize(t.type)) {
        (void)f.read_raw(t.name);
        continue;
      }
      std::vector<float> out(static_cast<std::size_t>(t.numel()));
      f.dequantize(t.name, out.data());
      std::vector<std::uint16_t> out16(out.size());
      f.dequantize_bf16(t.name, out16.data());
      if (refit::quant::gguf_blocks_supported(t.type) && t.shape.size() == 2) check_blocks(f, t, out, out16, heads);
    }
  } catch (const refit::Error&) {
  }
  return 0;
}
