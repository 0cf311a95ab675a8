#include "quant/quantized_weight.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "precision/few_rows_bf16.h"
#include "quant/dequantize_cpu.h"
#include "refit/error.h"

namespace refit::quant {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What a backward needs to rebuild the weight from the saved packed tensors.
enum Format : std::int64_t { kNf4 = 0, kInt8 = 1, kGgufBlocks = 2 };

torch::Tensor dense_of(std::int64_t format, const std::vector<std::int64_t>& meta, double offset, const torch::Tensor& a,
                       const torch::Tensor& b, const torch::Tensor& c, c10::ScalarType dtype) {
  if (format == kInt8) return dequantize_int8_fast(Int8Weight{a, b}, dtype);
  if (format == kGgufBlocks)
    return dequantize_gguf_blocks(GgufBlocks{static_cast<io::GgufType>(meta[0]), a, {meta[1], meta[2]}}, dtype);
  Nf4Weight q;
  q.packed = a;
  q.absmax = b;
  q.absmax_scale = c;
  q.offset = static_cast<float>(offset);
  q.blocksize = meta[0];
  q.absmax_blocksize = meta[1];
  q.shape.assign(meta.begin() + 2, meta.end());
  return dequantize_nf4_fast(q, dtype);
}

/// y = x W^T + b with W rebuilt from its packed tensors in the forward and again in the backward:
/// the graph holds the packed weight (a quarter or an eighth of bf16's bytes), never a dense copy.
struct QuantizedLinear : torch::autograd::Function<QuantizedLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, const torch::Tensor& bias,
                               const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, std::int64_t format,
                               std::vector<std::int64_t> meta, double offset, std::int64_t compute) {
    const auto dtype = static_cast<c10::ScalarType>(compute);
    const torch::Tensor w = dense_of(format, meta, offset, a, b, c, dtype);
    ctx->save_for_backward({a, b, c});
    ctx->saved_data["format"] = format;
    ctx->saved_data["meta"] = meta;
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["compute"] = compute;
    // No bias arrives as an empty tensor (autograd's apply needs defined inputs).
    const bool has_bias = bias.numel() > 0;
    ctx->saved_data["bias"] = has_bias && bias.requires_grad();
    return at::linear(input, w, has_bias ? c10::optional<torch::Tensor>(bias) : c10::nullopt);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["compute"].toInt());
    const torch::Tensor& g = grads[0];
    const torch::Tensor w = dense_of(ctx->saved_data["format"].toInt(), ctx->saved_data["meta"].toIntVector(),
                                     ctx->saved_data["offset"].toDouble(), saved[0], saved[1], saved[2], dtype);
    torch::Tensor grad_input = at::matmul(g.to(dtype), w);
    torch::Tensor grad_bias;
    if (ctx->saved_data["bias"].toBool()) grad_bias = g.reshape({-1, g.size(-1)}).sum(0);
    return {grad_input, grad_bias, {}, {}, {}, {}, {}, {}, {}};
  }
};

class StoredWeight : public QuantizedWeight {
 public:
  StoredWeight(std::int64_t format, std::vector<std::int64_t> shape, c10::ScalarType compute)
      : format_(format), shape_(std::move(shape)), compute_(compute) {}
  std::string format() const override { return format_ == kNf4 ? "nf4" : "int8"; }
  std::vector<std::int64_t> shape() const override { return shape_; }
  c10::ScalarType compute_dtype() const override { return compute_; }
  /// Under InferenceMode (refit generate) a product of few bf16 rows may read the packed weight in
  /// place (few_rows: precision/few_rows_bf16.h, the numbers of the dequantized weight's product);
  /// anything else dequantizes the weight for the product, in an autograd node that saves the
  /// packed tensors.
  torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& bias) const override {
    if (c10::InferenceMode::is_enabled() && compute_ == c10::kBFloat16 && shape_.size() == 2 && input.dim() >= 1 &&
        input.size(-1) == shape_[1] && input.numel() > 0 && (!bias.defined() || bias.numel() == shape_[0])) {
      const torch::Tensor y = few_rows(input.reshape({-1, shape_[1]}), bias);
      if (y.defined()) {
        std::vector<std::int64_t> out = input.sizes().vec();
        out.back() = shape_[0];
        return y.view(out);
      }
    }
    torch::Tensor a, b, c;
    std::vector<std::int64_t> meta;
    double offset = 0;
    parts(a, b, c, meta, offset);
    const torch::Tensor none = torch::empty({0}, input.options());
    return QuantizedLinear::apply(input, bias.defined() ? bias : none, a, b.defined() ? b : none, c.defined() ? c : none,
                                  format_, meta, offset, static_cast<std::int64_t>(compute_));
  }

 protected:
  virtual void parts(torch::Tensor& a, torch::Tensor& b, torch::Tensor& c, std::vector<std::int64_t>& meta,
                     double& offset) const = 0;
  /// rows [M, K] (bf16) times the weight, plus bias, by a few-row kernel reading the packed weight
  /// in place; undefined where none takes these operands here.
  virtual torch::Tensor few_rows(const torch::Tensor& rows, const torch::Tensor& bias) const { return {}; }

 private:
  std::int64_t format_;
  std::vector<std::int64_t> shape_;
  c10::ScalarType compute_;
};

class Nf4Stored final : public StoredWeight {
 public:
  Nf4Stored(Nf4Weight q, c10::ScalarType compute) : StoredWeight(kNf4, q.shape, compute), q_(std::move(q)) {
    if (!q_.absmax_scale.defined()) q_.absmax_scale = torch::empty({0}, torch::kFloat);
  }
  std::int64_t bytes() const override { return q_.bytes(); }
  std::vector<std::pair<std::string, torch::Tensor>> tensors() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out{{"packed", q_.packed}, {"absmax", q_.absmax}};
    if (q_.double_quantized()) out.emplace_back("absmax_scale", q_.absmax_scale);
    return out;
  }
  torch::Tensor dequantize(c10::ScalarType dtype) const override { return dequantize_nf4_fast(q_, dtype); }


 protected:
  /// The packed nibbles decoded in registers, a quarter of bf16's bytes read.
  torch::Tensor few_rows(const torch::Tensor& rows, const torch::Tensor& bias) const override {
    const std::int64_t N = q_.shape[0], K = q_.shape[1];
    const bool maxima_ok = q_.double_quantized() ? q_.absmax.is_contiguous() && q_.absmax_scale.is_contiguous() &&
                                                       q_.absmax_scale.scalar_type() == torch::kFloat
                                                 : q_.absmax.scalar_type() == torch::kFloat && q_.absmax.is_contiguous();
    if (!q_.packed.device().is_cpu() || !q_.packed.is_contiguous() || !maxima_ok ||
        !precision::few_rows_nf4_fits(rows, N, K, q_.blocksize))
      return {};
    precision::Nf4Rows w;
    w.packed = q_.packed.const_data_ptr<std::uint8_t>();
    if (q_.double_quantized()) {
      w.absmax_u8 = q_.absmax.const_data_ptr<std::uint8_t>();
      w.absmax_scale = q_.absmax_scale.const_data_ptr<float>();
      w.offset = q_.offset;
    } else {
      w.absmax_f32 = q_.absmax.const_data_ptr<float>();
    }
    w.blocksize = q_.blocksize;
    w.absmax_blocksize = q_.absmax_blocksize;
    return precision::few_rows_nf4_mm(rows, w, N, K, bias);
  }

  void parts(torch::Tensor& a, torch::Tensor& b, torch::Tensor& c, std::vector<std::int64_t>& meta,
             double& offset) const override {
    a = q_.packed, b = q_.absmax, c = q_.absmax_scale;
    meta = {q_.blocksize, q_.absmax_blocksize};
    meta.insert(meta.end(), q_.shape.begin(), q_.shape.end());
    offset = q_.offset;
  }

 private:
  Nf4Weight q_;
};

class Int8Stored final : public StoredWeight {
 public:
  Int8Stored(Int8Weight q, c10::ScalarType compute)
      : StoredWeight(kInt8, q.weight.sizes().vec(), compute), q_(std::move(q)) {}
  std::int64_t bytes() const override { return q_.bytes(); }
  std::vector<std::pair<std::string, torch::Tensor>> tensors() const override {
    return {{"weight", q_.weight}, {"scale", q_.scale}};
  }
  torch::Tensor dequantize(c10::ScalarType dtype) const override { return dequantize_int8_fast(q_, dtype); }


 protected:
  /// The int8 rows decoded in registers, half of bf16's bytes read.
  torch::Tensor few_rows(const torch::Tensor& rows, const torch::Tensor& bias) const override {
    const std::int64_t N = q_.weight.size(0), K = q_.weight.size(1);
    if (!q_.weight.device().is_cpu() || !q_.weight.is_contiguous() || q_.scale.scalar_type() != torch::kFloat ||
        !q_.scale.is_contiguous() || !precision::few_rows_int8_fits(rows, N, K))
      return {};
    return precision::few_rows_int8_mm(rows, q_.weight.const_data_ptr<std::int8_t>(), q_.scale.const_data_ptr<float>(), N, K,
                                       bias);
  }

  void parts(torch::Tensor& a, torch::Tensor& b, torch::Tensor& c, std::vector<std::int64_t>& meta,
             double& offset) const override {
    a = q_.weight, b = q_.scale, c = torch::Tensor();
    meta.clear();
    offset = 0;
  }

 private:
  Int8Weight q_;
};

/// A GGUF tensor's blocks as read: each product dequantizes them (gguf_blocks.h).
class GgufStored final : public StoredWeight {
 public:
  GgufStored(GgufBlocks b, c10::ScalarType compute) : StoredWeight(kGgufBlocks, b.shape, compute), b_(std::move(b)) {}
  /// "q4_0", "q4_1", "q8_0": the layer's buffers live under weight_<format>.
  std::string format() const override {
    std::string name = io::gguf_type_name(b_.type);
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return name;
  }
  std::int64_t bytes() const override { return b_.blocks.numel(); }
  std::vector<std::pair<std::string, torch::Tensor>> tensors() const override { return {{"blocks", b_.blocks}}; }
  torch::Tensor dequantize(c10::ScalarType dtype) const override { return dequantize_gguf_blocks(b_, dtype); }


 protected:
  /// The blocks decoded in registers, as read.
  torch::Tensor few_rows(const torch::Tensor& rows, const torch::Tensor& bias) const override {
    const std::int64_t N = b_.shape[0], K = b_.shape[1];
    if (!b_.blocks.device().is_cpu() || !b_.blocks.is_contiguous() || !precision::few_rows_gguf_fits(rows, N, K)) return {};
    const auto type = b_.type == io::GgufType::Q4_0   ? precision::GgufBlockType::q4_0
                      : b_.type == io::GgufType::Q4_1 ? precision::GgufBlockType::q4_1
                                                      : precision::GgufBlockType::q8_0;
    return precision::few_rows_gguf_mm(rows, b_.blocks.const_data_ptr<std::uint8_t>(), type, N, K, bias);
  }
  void parts(torch::Tensor& a, torch::Tensor& b, torch::Tensor& c, std::vector<std::int64_t>& meta,
             double& offset) const override {
    a = b_.blocks, b = torch::Tensor(), c = torch::Tensor();
    meta = {static_cast<std::int64_t>(b_.type), b_.shape[0], b_.shape[1]};
    offset = 0;
  }

 private:
  GgufBlocks b_;
};

void check_compute(c10::ScalarType compute) {
  if (compute != torch::kBFloat16 && compute != torch::kHalf && compute != torch::kFloat)
    throw Error(std::string("a quantized weight computes in bfloat16, float16 or float32, not ") + c10::toString(compute));
}

}  // namespace

std::shared_ptr<QuantizedWeight> make_nf4_weight(const torch::Tensor& dense, const Nf4Options& options,
                                                 c10::ScalarType compute) {
  check_compute(compute);
  Nf4Weight q = quantize_nf4(dense, options);
  const auto device = dense.device();
  q.packed = q.packed.to(device);
  q.absmax = q.absmax.to(device);
  if (q.absmax_scale.defined()) q.absmax_scale = q.absmax_scale.to(device);
  return std::make_shared<Nf4Stored>(std::move(q), compute);
}

std::shared_ptr<QuantizedWeight> make_gguf_weight(GgufBlocks blocks, c10::ScalarType compute) {
  check_compute(compute);
  check_gguf_blocks(blocks);
  blocks.blocks = blocks.blocks.contiguous();
  return std::make_shared<GgufStored>(std::move(blocks), compute);
}

std::shared_ptr<QuantizedWeight> make_int8_weight(const torch::Tensor& dense, c10::ScalarType compute) {
  check_compute(compute);
  Int8Weight q = quantize_int8(dense);
  q.weight = q.weight.to(dense.device());
  q.scale = q.scale.to(dense.device());
  return std::make_shared<Int8Stored>(std::move(q), compute);
}

}  // namespace refit::quant
