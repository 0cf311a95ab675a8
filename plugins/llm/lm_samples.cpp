#include "llm/lm_samples.h"

#include <algorithm>

#include "refit/error.h"

namespace refit::llm {

std::size_t TokenizedSample::targets() const {
  std::size_t n = 0;
  for (std::size_t i = 1; i < labels.size(); ++i) n += labels[i] != kIgnoreIndex;
  return n;
}

std::vector<std::int64_t> labels_from_spans(const std::vector<std::int64_t>& ids, const std::vector<ByteSpan>& offsets,
                                            const std::vector<ByteSpan>& spans, bool all) {
  if (offsets.size() != ids.size())
    throw Error("labels_from_spans: " + std::to_string(ids.size()) + " ids but " + std::to_string(offsets.size()) +
                " offsets");
  std::vector<std::int64_t> labels(ids.size(), kIgnoreIndex);
  std::size_t s = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (all) {
      labels[i] = ids[i];
      continue;
    }
    const auto [b, e] = offsets[i];
    if (b >= e) continue;
    // Spans are sorted and tokens come in text order: advance past spans that end before this token.
    while (s < spans.size() && spans[s].second <= b) ++s;
    if (s < spans.size() && spans[s].first < e) labels[i] = ids[i];
  }
  return labels;
}

double PackingStats::fill() const {
  return packs == 0 ? 0.0 : static_cast<double>(tokens) / static_cast<double>(packs * max_length);
}

std::vector<PackedSequence> pack_samples(const std::vector<TokenizedSample>& samples, std::size_t max_length,
                                         PackingStats* stats) {
  if (max_length < 2) throw Error("packing: max_length must be at least 2");
  std::vector<PackedSequence> packs;
  PackingStats st;
  for (const auto& sample : samples) {
    if (sample.input_ids.size() != sample.labels.size())
      throw Error("packing: a sample has " + std::to_string(sample.input_ids.size()) + " ids but " +
                  std::to_string(sample.labels.size()) + " labels");
    if (sample.input_ids.empty()) continue;
    const std::size_t n = std::min(sample.input_ids.size(), max_length);
    st.truncated += n < sample.input_ids.size();
    if (packs.empty() || packs.back().input_ids.size() + n > max_length) packs.emplace_back();
    PackedSequence& p = packs.back();
    const auto segment = static_cast<std::int64_t>(++p.samples);
    for (std::size_t i = 0; i < n; ++i) {
      p.input_ids.push_back(sample.input_ids[i]);
      // The first token of a sample is never a target: the token before it belongs to another sample.
      p.labels.push_back(i == 0 ? kIgnoreIndex : sample.labels[i]);
      p.position_ids.push_back(static_cast<std::int64_t>(i));
      p.segment_ids.push_back(segment);
    }
    ++st.samples;
    st.tokens += n;
  }
  st.packs = packs.size();
  st.max_length = max_length;
  if (stats) *stats = st;
  return packs;
}

}  // namespace refit::llm
