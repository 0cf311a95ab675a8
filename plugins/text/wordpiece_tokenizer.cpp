// WordPieceAdapter (wordpiece_tokenizer.h); the decoder is tokenizers' decoders/wordpiece.rs.
#include "wordpiece_tokenizer.h"

#include <algorithm>

namespace refit::text {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
}

// decoders/wordpiece.rs `cleanup`, in its order.
void cleanup(std::string& t) {
  replace_all(t, " .", ".");
  replace_all(t, " ?", "?");
  replace_all(t, " !", "!");
  replace_all(t, " ,", ",");
  replace_all(t, " ' ", "'");
  replace_all(t, " n't", "n't");
  replace_all(t, " 'm", "'m");
  replace_all(t, " do not", " don't");
  replace_all(t, " 's", "'s");
  replace_all(t, " 've", "'ve");
  replace_all(t, " 're", "'re");
}

}  // namespace

WordPieceAdapter::WordPieceAdapter(std::shared_ptr<const WordPieceTokenizer> tokenizer) : tokenizer_(std::move(tokenizer)) {
  for (const auto& s : tokenizer_->config().special_tokens) {
    const std::int64_t id = tokenizer_->token_to_id(s);
    if (id >= 0) special_ids_.push_back(id);
  }
  std::sort(special_ids_.begin(), special_ids_.end());
}

std::vector<std::int64_t> WordPieceAdapter::encode(std::string_view text, bool add_special_tokens) const {
  return add_special_tokens ? tokenizer_->encode(text).input_ids : tokenizer_->tokenize_ids(text);
}

std::string WordPieceAdapter::decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens) const {
  const std::string& prefix = tokenizer_->config().continuing_subword_prefix;
  std::string out;
  bool first = true;
  for (std::int64_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= tokenizer_->vocab_size()) continue;  // as tokenizers: skipped
    if (skip_special_tokens && std::binary_search(special_ids_.begin(), special_ids_.end(), id)) continue;
    std::string t = tokenizer_->id_to_token(id);
    if (!first) {
      if (t.compare(0, prefix.size(), prefix) == 0) t.erase(0, prefix.size());
      else
        t.insert(0, " ");
    }
    cleanup(t);
    out += t;
    first = false;
  }
  return out;
}

std::optional<std::int64_t> WordPieceAdapter::token_to_id(std::string_view token) const {
  const std::int64_t id = tokenizer_->token_to_id(token);
  return id < 0 ? std::nullopt : std::optional<std::int64_t>(id);
}

std::optional<std::string> WordPieceAdapter::id_to_token(std::int64_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= tokenizer_->vocab_size()) return std::nullopt;
  return tokenizer_->id_to_token(id);
}

std::optional<std::int64_t> WordPieceAdapter::pad_id() const {
  const std::int64_t id = tokenizer_->pad_id();
  return id < 0 ? std::nullopt : std::optional<std::int64_t>(id);
}

}  // namespace refit::text
