// Chat templates: a conversation rendered with the template a model ships (GGUF
// `tokenizer.chat_template`, tokenizer_config.json's `chat_template`) byte for byte as
// transformers' `apply_chat_template(tokenize=False)` renders it, the byte ranges each assistant
// turn occupies in the result (for the loss mask), and the chat JSONL reader. The template
// language is jinja.h's. No LibTorch. See docs/text.md ("Chat templates").
//
// Thread safety: a ChatTemplate is immutable; its const members may run from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "refit/tokenizer.h"
#include "text/jinja.h"

namespace refit::text {

struct ChatMessage {
  std::string role;  ///< system, user or assistant
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

/// One chat JSONL record, {"messages": [{"role": ..., "content": ...}, ...]} (other top-level
/// keys are ignored). `where` names the record in errors ("data.jsonl:12"); each error adds the
/// JSON pointer: unknown role, missing or non-string content, an unknown key in a message.
Conversation parse_chat_record(const nlohmann::json& record, const std::string& where);
/// Every non-blank line of a chat JSONL file. Throws refit::Error naming file:line and pointer.
std::vector<Conversation> read_chat_jsonl(const std::string& path);

/// Which tokens a causal LM learns from (docs/text.md).
enum class LossMask {
  train_on_assistant,  ///< every assistant turn: its content and the end-of-turn marker after it
  train_on_last,       ///< the last assistant turn only
  train_on_all,        ///< every token
};
/// "train_on_assistant" | "train_on_last" | "train_on_all"; anything else throws.
LossMask parse_loss_mask(const std::string& name);

/// What the template sees besides the messages (transformers passes its tokenizer's special
/// tokens, tools=None, documents=None, and the caller's keyword arguments).
struct ChatContext {
  std::string bos_token;
  std::string eos_token;
  /// More variables (an object): e.g. {"date_string": "26 Jul 2024"}, "tools", "unk_token".
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  /// Output size and loop iterations one render may take (jinja.h).
  jinja::Limits limits;
};

/// An assistant turn in a rendered conversation: bytes [begin, end) of the text, its content
/// as the template wrote it plus the end-of-turn marker that follows.
struct AssistantSpan {
  std::size_t message = 0;  ///< index in the conversation
  std::size_t begin = 0, end = 0;
};

struct RenderedChat {
  std::string text;
  std::vector<AssistantSpan> assistant;  ///< in order
};

class ChatTemplate {
 public:
  /// Parses the template; throws jinja::TemplateError (line:column) on anything unsupported.
  static ChatTemplate from_string(std::string_view text, std::string label);

  /// The template's output for `messages`, as apply_chat_template(tokenize=False) gives it.
  /// raise_exception in the template throws jinja::TemplateRaised with its message.
  std::string render(const Conversation& messages, bool add_generation_prompt, const ChatContext& context = {}) const;

  /// The rendered conversation (no generation prompt) with each assistant turn's bytes.
  /// `end_of_turn` is the marker the template writes after an assistant's content (empty: the
  /// context's eos_token; `<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3, `</s>` for
  /// Mistral). How the turns are found (docs/text.md): each assistant content is replaced in
  /// turn by a sentinel of private-use characters absent from the output, and the render
  /// compared with the original; the two must differ in exactly that one place, holding exactly
  /// the sentinel, and the marker must follow the content. Otherwise (a template that moves,
  /// repeats or inspects the content) it throws rather than guess.
  RenderedChat render_with_spans(const Conversation& messages, const ChatContext& context = {},
                                 const std::string& end_of_turn = {}) const;

  const jinja::Template& engine() const { return template_; }

 private:
  std::map<std::string, jinja::Value> variables(const Conversation& messages, bool add_generation_prompt,
                                                const ChatContext& context) const;
  jinja::Template template_;
};

/// The loss mask of one tokenized conversation: token k spans bytes [offsets[k].first,
/// offsets[k].second) of `chat.text`, and is 1 when it overlaps a selected assistant span (the
/// rule transformers' return_assistant_tokens_mask uses), 0 otherwise.
std::vector<std::uint8_t> loss_mask(const RenderedChat& chat,
                                    const std::vector<std::pair<std::size_t, std::size_t>>& offsets, LossMask mode);

/// The bytes of the text each id covers, for a tokenizer whose pieces concatenate to the text
/// (byte-level BPE: Tokenizer::token_bytes). Throws for one that does not keep the text, or
/// when the pieces do not add up to `text`.
std::vector<std::pair<std::size_t, std::size_t>> token_byte_offsets(const refit::Tokenizer& tokenizer,
                                                                    const std::vector<std::int64_t>& ids,
                                                                    const std::string& text);

}  // namespace refit::text
