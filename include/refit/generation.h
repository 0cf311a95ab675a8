#pragma once
// Token-by-token decoding with a cache, for `refit generate`: what a decoder language model
// offers beyond forward_fields(). The command asks a model for it through Model::decoder()
// rather than casting (a dynamic_cast across a plugin boundary is not reliable).
#include <cstdint>
#include <memory>

#include <torch/types.h>

namespace refit {

class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;
  /// The keys and values of the positions seen so far, for `batch` rows and at most `capacity`
  /// positions; opaque to the caller.
  struct Cache {
    virtual ~Cache() = default;
  };
  virtual std::unique_ptr<Cache> start(std::int64_t batch, std::int64_t capacity) = 0;
  /// Feeds `input_ids` [B, S] (a left-padded prompt, then one token per row) after the positions
  /// already in `cache`; `attention_mask` [B, cached + S] marks every slot so far (1: a token, 0:
  /// padding). Returns the logits of the last position [B, vocab] (float32).
  virtual torch::Tensor step(const torch::Tensor& input_ids, const torch::Tensor& attention_mask, Cache& cache) = 0;
  /// The most positions the model was trained for (its context length).
  virtual std::int64_t max_positions() const = 0;
};

}  // namespace refit
