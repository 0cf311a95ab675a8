#pragma once
// Small bf16 matrix products on the CPU through ATen's batch-reduce GEMM microkernel.
//
// Why: every LoRA product has the rank (e.g. 16) as one of its dimensions, so each is ~0.5 M
// multiply-adds: a few microseconds of arithmetic. Through at::mm each one costs ~20 us on the
// 2-core development CPU, almost all of it oneDNN building or looking up a matmul primitive and
// copying B into the layout its kernel reads. Here B is interleaved into that layout (VNNI: pairs
// of K rows) by a plain loop and the microkernel (at::native::cpublas::brgemm, the one ATen's CPU
// flash attention calls) runs directly: ~5 us. The kernel accumulates in fp32 and the result is
// rounded once to bf16, as at::mm's is; tests/unit/test_lora_small_mm.cpp checks the results are
// at::mm's bit for bit on this CPU (NaN stays NaN, its payload bits may differ), and the first
// call checks it again, for every packing branch, before the path is used.
#include <torch/types.h>

namespace refit::lora {

/// Whether the microkernel can run here: a CPU with AVX512-BF16 that oneDNN may use
/// (ONEDNN_MAX_CPU_ISA) and no AMX (the layout this file packs), LibTorch's microkernel present.
bool small_mm_bf16_supported();

/// Whether the LoRA layers use it: supported, REFIT_LORA_SMALL_MM not "0", and its first products
/// (every packing branch) equal to LibTorch's own kernel's, bit for bit.
bool small_mm_bf16_available();

/// Products small_mm_bf16 has computed in this process (its self-check's included): tests check
/// which path a layer took by it.
std::uint64_t small_mm_bf16_calls();

/// Whether small_mm_bf16 is worth it for an [M, K] x [K, N] product: the microkernel runs on one
/// thread, so only products small enough that at::mm's fixed cost dominates are routed to it.
bool small_mm_bf16_fits(std::int64_t m, std::int64_t k, std::int64_t n);

/// Whether products with this many rows may take the path: ATen keeps one compiled kernel per
/// shape for the life of the process, so only the first 64 distinct row counts are admitted.
bool small_mm_bf16_admit(std::int64_t rows);

/// a [M, K] x b [K, N] in bf16 for CPU tensors of any strides (transposed views included); returns
/// a contiguous [M, N]. An fp32 operand is rounded to bf16 as it is packed (the bits of
/// `x.to(kBFloat16)`, without the separate tensor); an fp32 result is the bf16 result widened
/// (the bits of `.to(kFloat)` of it). `transpose_a` / `transpose_b`: use a^T / b^T (as a .t()
/// view would, without its dispatch). Requires small_mm_bf16_supported() (the layers also
/// require small_mm_bf16_available(); the tests compare it wherever it can run).
torch::Tensor small_mm_bf16(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType out_dtype = torch::kBFloat16,
                            bool transpose_a = false, bool transpose_b = false);

}  // namespace refit::lora
