#pragma once
// A language model's tokenizer with its chat template, opened from a path, for the LM datasets
// (plugins/llm) and refit generate: a `.gguf` file (its byte-level BPE vocabulary, merges and
// `tokenizer.chat_template`), a tokenizer.json (with tokenizer_config.json's chat template beside
// it when present), or a folder holding those files. No LibTorch.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "refit/tokenizer.h"
#include "text/chat_template.h"

namespace refit::text {


class LmTokenizer {
 public:
  /// `template_source`: the chat template's text (it names the end-of-turn marker).
  LmTokenizer(std::shared_ptr<const Tokenizer> tokenizer, std::shared_ptr<const ChatTemplate> chat_template,
              std::string template_source, std::string label);
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& label() const { return label_; }

  std::vector<std::int64_t> encode(std::string_view text, bool add_special_tokens) const {
    return tokenizer_->encode(text, add_special_tokens);
  }
  /// The ids of `text` with each id's byte range [begin, end) in `text`. Byte-level BPE loses no
  /// byte, so the ranges are the ids' bytes laid end to end; a tokenizer that changes the text
  /// (a normaliser, an added prefix space) is refused here, by name.
  std::vector<std::int64_t> encode_with_offsets(std::string_view text,
                                                std::vector<std::pair<std::size_t, std::size_t>>& offsets) const;
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens) const {
    return tokenizer_->decode(ids, skip_special_tokens);
  }
  std::optional<std::int64_t> eos_id() const { return tokenizer_->eos_id(); }
  std::optional<std::int64_t> bos_id() const { return tokenizer_->bos_id(); }
  std::optional<std::int64_t> pad_id() const { return tokenizer_->pad_id(); }

  bool has_chat_template() const { return static_cast<bool>(template_); }
  /// Renders `messages` as transformers' apply_chat_template(tokenize=False) does, with the
  /// tokenizer's bos/eos tokens; `add_generation_prompt` opens an assistant turn. Throws
  /// refit::Error without a template, or when the template refuses the conversation.
  std::string apply_chat_template(const Conversation& messages, bool add_generation_prompt) const;
  /// The rendered conversation with each assistant turn's bytes (ChatTemplate::render_with_spans).
  RenderedChat render_for_training(const Conversation& messages) const;

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const ChatTemplate> template_;
  std::string template_source_, label_;
};

/// Throws refit::Error naming the path on a missing or unreadable file, an unsupported tokenizer,
/// or a chat template the engine cannot parse (with its line:column). `chat_template`, when
/// given, replaces the files' template.
std::shared_ptr<const LmTokenizer> open_tokenizer(const std::string& path,
                                                  const std::optional<std::string>& chat_template = std::nullopt);

}  // namespace refit::text
