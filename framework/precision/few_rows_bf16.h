#pragma once
// bf16 products with few rows on the CPU: y = x · Wᵀ for x [M, K] with M <= 16 and a weight W
// [N, K] stored row-major, as a Linear layer computes them when it decodes one token per sequence
// (refit generate, predict on small batches).
//
// Such a product reads each weight once and does 2M FLOPs per weight: its time is the time to
// stream W from memory. LibTorch's CPU kernels are far from that there: oneDNN's bf16 matmul packs
// W into its blocked layout on every call, and the fp32 route widens W to fp32 first. Measured on
// SmolLM2-135M's decoding shapes (2-core Intel Xeon, AVX512-BF16, weights not in cache): 4 to 16
// GB/s of weight for LibTorch, 15 to 40 GB/s for this kernel (docs/performance.md, "Decoding").
//
// This kernel streams W once, a few rows at a time, prefetching rows ahead, and keeps x in L1: for
// each block of W rows it forms the dot products of several x rows at once with them, accumulating
// in fp32, and rounds each result once to bf16 (round to nearest even), adding an optional bias in
// fp32 first, as the fp32 route does.
// The vector loop is chosen at run time (ATen's own limit, ATEN_CPU_CAPABILITY, and oneDNN's,
// ONEDNN_MAX_CPU_ISA, are honoured, so the AVX2 emulation runs the AVX2 loop):
//   * AVX512-BF16: VDPBF16PS, two exact bf16 products added into each fp32 lane per instruction;
//   * AVX-512F and AVX2 (FMA): bf16 widened to fp32 in registers (exact: the even elements of a
//     32-bit lane shifted up, the odd ones masked), fused multiply-adds; K in segments of 768 so
//     that x (in fp32) stays in L1.
// Where both run, bf16_products.cpp times them per weight shape on first use (a Xeon's two FMA
// units have twice VDPBF16PS's throughput; other CPUs differ) and keeps the faster.
// The arithmetic is a native bf16 kernel's: exact products, fp32 sums (in another order),
// one rounding. Each (row, output) dot product is computed the same way whatever M is, so a
// decoding step gives a sequence the same results alone as in a batch (up to the limit). AVX512-BF16 flushes subnormal inputs
// and sums to zero, as oneDNN's bf16 kernels do; the FMA loops keep them.
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace refit::precision {

/// The vector loops the kernel has.
enum class FewRowsIsa { none, avx2, avx512, avx512_bf16 };
std::string isa_name(FewRowsIsa isa);

/// The best loop this CPU runs and ATen's and oneDNN's ISA limits allow; `none` elsewhere.
FewRowsIsa few_rows_isa();

/// Whether this CPU runs `isa`'s loop, whatever the environment's limits (tests run each one).
bool few_rows_runs_here(FewRowsIsa isa);

/// The most rows the kernel takes with `isa` (more rows, more arithmetic per weight: beyond it,
/// the blocked kernels' reuse of W wins; chosen by bench/few_rows_bf16.cpp, docs/performance.md).
std::int64_t few_rows_limit(FewRowsIsa isa);

/// Whether mm(a, b) / addmm(bias, a, b) fit the kernel: a and b bf16 on the CPU, a [M, K] with
/// 1 <= M <= few_rows_limit(), unit column stride, b = Wᵀ for a W [N, K] with unit column stride
/// (b's stride(0) is 1), and `bias` (undefined, or bf16 [N] or [M, N] broadcast from [N]).
bool few_rows_bf16_fits(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias = {},
                        FewRowsIsa isa = few_rows_isa());

/// round_bf16(a · b + bias) with fp32 accumulation, for operands few_rows_bf16_fits accepts with
/// `isa` (which must not be `none` and must run on this CPU). A new contiguous [M, N] bf16 tensor.
at::Tensor few_rows_bf16_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias = {},
                            FewRowsIsa isa = few_rows_isa());

/// An NF4 weight [N, K] in bitsandbytes' layout (refit/quantized.h): `packed` N K / 2 bytes (the
/// first of two elements in the high nibble), one maximum per `blocksize` elements of a row,
/// float32 (`absmax_f32`) or double-quantized (`absmax_u8` codes of the signed dynamic map, one
/// `absmax_scale` per `absmax_blocksize` blocks, `offset` added).
struct Nf4Rows {
  const std::uint8_t* packed = nullptr;
  const float* absmax_f32 = nullptr;
  const std::uint8_t* absmax_u8 = nullptr;
  const float* absmax_scale = nullptr;
  float offset = 0;
  std::int64_t blocksize = 64, absmax_blocksize = 256;
};

/// Whether few_rows_nf4_mm takes x [M, K] against an NF4 W [N, K]: x bf16 on the CPU, M <= the
/// limit, unit column stride; K and the blocksize multiples of 32, the blocksize dividing K;
/// `isa` (the AVX-512 loop for AVX-512 and AVX512-BF16, the AVX2 loop for AVX2) runs here.
bool few_rows_nf4_fits(const at::Tensor& x, std::int64_t N, std::int64_t K, std::int64_t blocksize,
                       FewRowsIsa isa = few_rows_isa());

/// round_bf16(x · Wᵀ + bias) for an NF4 W, dequantized in registers to the bf16 values
/// dequantize_nf4(q, bf16) holds (each code's value times its block's maximum in fp32, rounded
/// once): bit for bit few_rows_bf16_mm(x, that weight ᵀ, bias) with the FMA loop of the same
/// width, reading a quarter of its bytes. Decoding with a QLoRA base (quant/quantized_weight.cpp,
/// under InferenceMode).
at::Tensor few_rows_nf4_mm(const at::Tensor& x, const Nf4Rows& w, std::int64_t N, std::int64_t K,
                           const at::Tensor& bias = {}, FewRowsIsa isa = few_rows_isa());

/// Whether few_rows_int8_mm takes x [M, K] against an int8 W [N, K] (LLM.int8()'s weight-only
/// rows): x bf16 on the CPU, M <= the limit, unit column stride, K a multiple of 32, `isa`'s loop
/// here (as few_rows_nf4_fits).
bool few_rows_int8_fits(const at::Tensor& x, std::int64_t N, std::int64_t K, FewRowsIsa isa = few_rows_isa());

/// round_bf16(x · Wᵀ + bias) for W = weight [N, K] (row-major int8) with one scale per row,
/// dequantized in registers to the bf16 values dequantize_int8_fast(q, bf16) holds ((w x scale)
/// x 1/127 in fp32, rounded once): bit for bit few_rows_bf16_mm on that weight with the FMA loop of
/// the same width.
at::Tensor few_rows_int8_mm(const at::Tensor& x, const std::int8_t* weight, const float* scale, std::int64_t N,
                            std::int64_t K, const at::Tensor& bias = {}, FewRowsIsa isa = few_rows_isa());

/// A GGUF block type few_rows_gguf_mm decodes (llama.cpp's layouts: Q4_0 18 bytes, Q4_1 20, Q8_0
/// 34 per 32 elements).
enum class GgufBlockType { q4_0, q4_1, q8_0 };

/// Whether few_rows_gguf_mm takes x [M, K] against W [N, K] in GGUF blocks (as few_rows_int8_fits).
bool few_rows_gguf_fits(const at::Tensor& x, std::int64_t N, std::int64_t K, FewRowsIsa isa = few_rows_isa());

/// round_bf16(x · Wᵀ + bias) for W in GGUF blocks (`blocks`: N rows of K / 32 blocks, as
/// quant/gguf_blocks.h keeps them), dequantized in registers to the bf16 values
/// dequantize_gguf_blocks(b, bf16) holds (gguf-py's fp32 arithmetic, rounded once): bit for bit
/// few_rows_bf16_mm on that weight with the FMA loop of the same width, reading 0.56 to 1.06
/// bytes a weight.
at::Tensor few_rows_gguf_mm(const at::Tensor& x, const std::uint8_t* blocks, GgufBlockType type, std::int64_t N,
                            std::int64_t K, const at::Tensor& bias = {}, FewRowsIsa isa = few_rows_isa());

}  // namespace refit::precision
