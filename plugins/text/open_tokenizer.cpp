#include "text/open_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "refit/error.h"
#include "text/byte_bpe.h"
#include "text/read_file.h"

namespace fs = std::filesystem;

namespace refit::text {

namespace {

/// tokenizer_config.json's token entries are a string or an AddedToken object {"content": ...}.
std::string token_string(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

/// The chat template of a tokenizer_config.json: a string, or a list of {name, template} whose
/// "default" is the one apply_chat_template uses without a name.
std::optional<std::string> config_template(const nlohmann::json& config, const fs::path& file) {
  if (!config.contains("chat_template")) return std::nullopt;
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const auto& entry : t)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  throw Error("tokenizer: " + file.string() + " at /chat_template: expected a string or a list with a \"default\" template");
}

std::string token_text(const Tokenizer& t, std::optional<std::int64_t> id) {
  if (!id) return "";
  return t.id_to_token(*id).value_or("");
}

}  // namespace

LmTokenizer::LmTokenizer(std::shared_ptr<const Tokenizer> tokenizer, std::shared_ptr<const ChatTemplate> chat_template,
                         std::string template_source, std::string label)
    : tokenizer_(std::move(tokenizer)), template_(std::move(chat_template)), template_source_(std::move(template_source)),
      label_(std::move(label)) {}

std::vector<std::int64_t> LmTokenizer::encode_with_offsets(std::string_view text,
                                                           std::vector<std::pair<std::size_t, std::size_t>>& offsets) const {
  auto ids = tokenizer_->encode(text, /*add_special_tokens=*/false);
  offsets = token_byte_offsets(*tokenizer_, ids, std::string(text));
  return ids;
}

namespace {

ChatContext context_of(const Tokenizer& t) {
  ChatContext c;
  c.bos_token = token_text(t, t.bos_id());
  c.eos_token = token_text(t, t.eos_id());
  return c;
}

/// The marker a template writes after an assistant's content: ChatML's <|im_end|>, Llama 3's
/// <|eot_id|>, else the EOS token (Mistral's </s>).
std::string end_of_turn(const ChatContext& c, const std::string& source) {
  for (const char* marker : {"<|im_end|>", "<|eot_id|>", "<|end|>"})
    if (source.find(marker) != std::string::npos) return marker;
  return c.eos_token;
}

}  // namespace

std::string LmTokenizer::apply_chat_template(const Conversation& messages, bool add_generation_prompt) const {
  if (!template_) throw Error("tokenizer " + label_ + ": no chat template (give \"chat_template\")");
  return template_->render(messages, add_generation_prompt, context_of(*tokenizer_));
}

RenderedChat LmTokenizer::render_for_training(const Conversation& messages) const {
  if (!template_) throw Error("tokenizer " + label_ + ": no chat template (give \"chat_template\")");
  const ChatContext c = context_of(*tokenizer_);
  return template_->render_with_spans(messages, c, end_of_turn(c, template_source_));
}

std::shared_ptr<const LmTokenizer> open_tokenizer(const std::string& path, const std::optional<std::string>& chat_template) {
  const fs::path p(path);
  if (!fs::exists(p)) throw Error("tokenizer: " + path + " does not exist");
  std::shared_ptr<const Tokenizer> tok;
  std::optional<std::string> source = chat_template;
  std::string label = path;
  if (p.extension() == ".gguf") {
    const io::GgufFile file = io::GgufFile::open(p);
    tok = std::make_shared<const ByteBpeTokenizer>(ByteBpeTokenizer::from_gguf(file));
    if (!source && file.has("tokenizer.chat_template")) source = file.get_string("tokenizer.chat_template");
  } else {
    const fs::path json = fs::is_directory(p) ? p / "tokenizer.json" : p;
    if (!fs::exists(json))
      throw Error("tokenizer: " + path +
                  " holds no tokenizer.json (a language model's tokenizer is a .gguf file, a "
                  "tokenizer.json or a folder with one)");
    tok = std::make_shared<const ByteBpeTokenizer>(ByteBpeTokenizer::from_tokenizer_json(json.string()));
    const fs::path config = json.parent_path() / "tokenizer_config.json";
    if (!source && fs::exists(config)) {
      nlohmann::json j =
          nlohmann::json::parse(read_whole_file(config.string(), "tokenizer"), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) throw Error("tokenizer: " + config.string() + " is not a JSON object");
      source = config_template(j, config);
    }
  }
  std::shared_ptr<const ChatTemplate> tmpl;
  if (source) tmpl = std::make_shared<const ChatTemplate>(ChatTemplate::from_string(*source, label + " chat template"));
  return std::make_shared<const LmTokenizer>(tok, tmpl, source.value_or(""), label);
}

}  // namespace refit::text
