#pragma once
// Token sequences for causal-LM training: which tokens carry a loss, and packing of short
// samples into one sequence. No LibTorch: plain vectors (lm_datasets.h turns them into fields).
//
// Labels follow transformers' convention: `labels` has the length of `input_ids`, holds the token
// id where the token is to be predicted and -100 where it is not; the objective shifts them
// (position t predicts label t+1), so labels[0] of a sample is never a target.
//
// Packing (torchtune's PackedDataset, Hugging Face's "padding-free" collation): samples are laid
// end to end into sequences of at most `max_length` tokens. Each packed token keeps its position
// within its own sample (position_ids restart at 0) and the number of its sample within the pack
// (segment_ids 1, 2, ...; 0 is padding); the model attends block-causally — a token sees the
// earlier tokens of its own sample only — and the first token of every sample gets label -100,
// so that the last token of the sample before it predicts nothing. The loss of a packed batch is
// then the loss of the same samples unpacked, token for token.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace refit::llm {

constexpr std::int64_t kIgnoreIndex = -100;

struct TokenizedSample {
  std::vector<std::int64_t> input_ids;
  std::vector<std::int64_t> labels;  // same length; kIgnoreIndex where no loss is taken
  /// Tokens with a loss after the shift (labels[1:] != -100).
  std::size_t targets() const;
};

/// Byte ranges [begin, end) of a rendered text.
using ByteSpan = std::pair<std::size_t, std::size_t>;

/// Labels for `ids` whose tokens cover the byte ranges `offsets` of the rendered text: a token
/// is a target when its range overlaps one of `spans` (sorted, disjoint); every token for
/// LossMask::all. Tokens with an empty range (added at no text position) are never targets
/// unless `all`.
std::vector<std::int64_t> labels_from_spans(const std::vector<std::int64_t>& ids, const std::vector<ByteSpan>& offsets,
                                            const std::vector<ByteSpan>& spans, bool all);

struct PackedSequence {
  std::vector<std::int64_t> input_ids, labels, position_ids, segment_ids;
  std::size_t samples = 0;
};

struct PackingStats {
  std::size_t samples = 0, packs = 0, tokens = 0, truncated = 0, max_length = 0;
  double fill() const;  // tokens / (packs * max_length)
};

/// Packs `samples` in order, first fit into the currently open sequence (a sample that does not
/// fit closes it and opens the next): the order of samples is kept, so a seeded shuffle before
/// packing gives a seeded packing. A sample longer than `max_length` is cut to it (counted in
/// `stats.truncated`).
std::vector<PackedSequence> pack_samples(const std::vector<TokenizedSample>& samples, std::size_t max_length,
                                         PackingStats* stats = nullptr);

}  // namespace refit::llm
