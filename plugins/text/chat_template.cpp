// Chat templates (chat_template.h): the context transformers gives a template, the assistant
// spans found by sentinel substitution, the loss mask, and the chat JSONL reader.
#include "text/chat_template.h"

#include <algorithm>
#include <fstream>

#include "jinja_values.h"

namespace refit::text {

// ---- conversations -------------------------------------------------------------------------

namespace {
const char* json_type(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    default: return "a number";
  }
}
}  // namespace

Conversation parse_chat_record(const nlohmann::json& record, const std::string& where) {
  auto fail = [&](const std::string& pointer, const std::string& message) {
    throw refit::Error(where + ": " + pointer + ": " + message);
  };
  if (!record.is_object()) fail("", std::string("a chat record is an object with \"messages\", found ") + json_type(record));
  auto it = record.find("messages");
  if (it == record.end()) fail("/messages", "missing (a chat record holds {\"messages\": [{\"role\", \"content\"}, ...]})");
  if (!it->is_array()) fail("/messages", std::string("must be an array of messages, found ") + json_type(*it));
  if (it->empty()) fail("/messages", "no messages");
  Conversation out;
  for (std::size_t k = 0; k < it->size(); ++k) {
    const std::string at = "/messages/" + std::to_string(k);
    const auto& m = (*it)[k];
    if (!m.is_object()) fail(at, std::string("a message is an object with \"role\" and \"content\", found ") + json_type(m));
    ChatMessage msg;
    for (const auto& [key, value] : m.items()) {
      if (key == "role") {
        if (!value.is_string()) fail(at + "/role", std::string("must be a string, found ") + json_type(value));
        msg.role = value.get<std::string>();
        if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
          fail(at + "/role", "unknown role \"" + msg.role + "\" (system, user or assistant)");
      } else if (key == "content") {
        if (!value.is_string()) fail(at + "/content", std::string("must be a string, found ") + json_type(value));
        msg.content = value.get<std::string>();
      } else {
        fail(at + "/" + key, "unknown key (a message has \"role\" and \"content\")");
      }
    }
    if (!m.contains("role")) fail(at, "missing \"role\"");
    if (!m.contains("content")) fail(at, "missing \"content\"");
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<Conversation> read_chat_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw refit::Error("chat data: cannot open " + path);
  std::vector<Conversation> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw refit::Error(where + ": not JSON: " + e.what());
    }
    out.push_back(parse_chat_record(j, where));
  }
  return out;
}

LossMask parse_loss_mask(const std::string& name) {
  if (name == "train_on_assistant") return LossMask::train_on_assistant;
  if (name == "train_on_last") return LossMask::train_on_last;
  if (name == "train_on_all") return LossMask::train_on_all;
  throw refit::Error("unknown loss mask \"" + name + "\" (train_on_assistant, train_on_last or train_on_all)");
}

// ---- rendering -----------------------------------------------------------------------------

ChatTemplate ChatTemplate::from_string(std::string_view text, std::string label) {
  ChatTemplate t;
  t.template_ = jinja::Template::parse(text, std::move(label));
  return t;
}

std::map<std::string, jinja::Value> ChatTemplate::variables(const Conversation& messages, bool add_generation_prompt,
                                                            const ChatContext& context) const {
  using jinja::Value;
  std::map<std::string, Value> vars;
  jinja::List list;
  for (const auto& m : messages) {
    jinja::Dict d;
    d.items.emplace_back(Value::string("role"), Value::string(m.role));
    d.items.emplace_back(Value::string("content"), Value::string(m.content));
    list.push_back(Value::make_dict(std::move(d)));
  }
  // render_jinja_template: messages, tools=None, documents=None, add_generation_prompt, then the
  // tokenizer's special tokens and the caller's keyword arguments (which win).
  vars["messages"] = Value::make_list(std::move(list));
  vars["tools"] = Value::none();
  vars["documents"] = Value::none();
  vars["add_generation_prompt"] = Value::boolean(add_generation_prompt);
  vars["bos_token"] = Value::string(context.bos_token);
  vars["eos_token"] = Value::string(context.eos_token);
  if (!context.extra.is_object()) throw refit::Error(template_.label() + ": the extra template variables must be an object");
  for (const auto& [k, v] : context.extra.items()) {
    if (k == "messages" || k == "add_generation_prompt")
      throw refit::Error(template_.label() + ": the extra variable \"" + k + "\" would replace the conversation's");
    try {
      vars[k] = Value::from_json(v);
    } catch (const refit::Error& e) {
      throw refit::Error(template_.label() + ": the extra variable \"" + k + "\": " + e.what());
    }
  }
  return vars;
}

std::string ChatTemplate::render(const Conversation& messages, bool add_generation_prompt,
                                 const ChatContext& context) const {
  return template_.render(variables(messages, add_generation_prompt, context), context.limits);
}

namespace {

std::size_t back_to_boundary(const std::string& a, const std::string& b, std::size_t p) {
  auto continuation = [](const std::string& s, std::size_t at) {
    return at < s.size() && (static_cast<unsigned char>(s[at]) & 0xc0) == 0x80;
  };
  while (p > 0 && (continuation(a, p) || continuation(b, p))) --p;
  return p;
}

}  // namespace

RenderedChat ChatTemplate::render_with_spans(const Conversation& messages, const ChatContext& context,
                                             const std::string& end_of_turn) const {
  RenderedChat out;
  const std::string& label = template_.label();
  const std::string eot = end_of_turn.empty() ? context.eos_token : end_of_turn;
  if (template_.has_generation_blocks()) {
    // The template marks the assistant's tokens itself (transformers' {% generation %}).
    std::vector<jinja::GenerationSpan> spans;
    out.text = template_.render(variables(messages, false, context), context.limits, &spans);
    std::vector<std::size_t> assistant;
    for (std::size_t k = 0; k < messages.size(); ++k)
      if (messages[k].role == "assistant") assistant.push_back(k);
    if (spans.size() != assistant.size())
      throw refit::Error(label + ": the template's {% generation %} blocks (" + std::to_string(spans.size()) +
                         ") do not match the conversation's assistant messages (" + std::to_string(assistant.size()) + ")");
    for (std::size_t k = 0; k < spans.size(); ++k) out.assistant.push_back({assistant[k], spans[k].begin, spans[k].end});
    return out;
  }
  if (eot.empty()) throw refit::Error(label + ": no end-of-turn marker to find assistant turns by (set eos_token)");
  out.text = render(messages, false, context);
  // Sentinels of private-use characters that the output does not hold: no case mapping or
  // strip() changes them, and a common prefix or suffix cannot run into them. Two of different
  // lengths: a template whose layout depends on the content's length or value shows up as two
  // different splits.
  std::vector<char32_t> unused;
  for (char32_t c = 0xF8F0; c < 0xF900; ++c) {
    std::string s;
    jinja::detail::append_utf8(s, c);
    if (out.text.find(s) == std::string::npos) unused.push_back(c);
  }
  if (unused.size() < 2) throw refit::Error(label + ": the conversation uses the sentinel characters U+F8F0..U+F8FF");
  std::string sentinels[2];
  for (int k = 0; k < 3; ++k) jinja::detail::append_utf8(sentinels[0], unused[0]);
  for (int k = 0; k < 7; ++k) jinja::detail::append_utf8(sentinels[1], unused[1]);
  for (std::size_t k = 0; k < messages.size(); ++k) {
    if (messages[k].role != "assistant") continue;
    const std::string& text = out.text;
    const std::string where = label + ": assistant message " + std::to_string(k);
    std::size_t split[2][2];
    for (int v = 0; v < 2; ++v) {
      Conversation marked = messages;
      marked[k].content = sentinels[v];
      const std::string probe = render(marked, false, context);
      std::size_t p = 0;
      const std::size_t limit = std::min(text.size(), probe.size());
      while (p < limit && text[p] == probe[p]) ++p;
      p = back_to_boundary(text, probe, p);
      std::size_t q = 0;
      while (q < limit - p && text[text.size() - 1 - q] == probe[probe.size() - 1 - q]) ++q;
      while (q > 0 && ((static_cast<unsigned char>(text[text.size() - q]) & 0xc0) == 0x80 ||
                       (static_cast<unsigned char>(probe[probe.size() - q]) & 0xc0) == 0x80))
        --q;
      const std::string& sentinel = sentinels[v];
      if (probe.size() != p + sentinel.size() + q || probe.compare(p, sentinel.size(), sentinel) != 0)
        throw refit::Error(where + ": the template does not write the message's content once, unchanged in place (it "
                                   "moves, repeats or transforms it), so its tokens cannot be located");
      split[v][0] = p;
      split[v][1] = q;
    }
    const std::size_t begin = split[0][0], content_end = text.size() - split[0][1];
    // What stands in the content's place must be (a part of) the content: the template wrote it
    // as is or trimmed; anything else is layout that depends on the content.
    if (split[0][0] != split[1][0] || split[0][1] != split[1][1] ||
        messages[k].content.find(text.substr(begin, content_end - begin)) == std::string::npos)
      throw refit::Error(where + ": the template's layout depends on the message's content (its length or value), so "
                                 "its tokens cannot be located");
    if (text.compare(content_end, eot.size(), eot) != 0)
      throw refit::Error(where + ": the template does not close the turn with the end-of-turn marker \"" + eot +
                         "\" right after the content");
    out.assistant.push_back({k, begin, content_end + eot.size()});
  }
  return out;
}

std::vector<std::uint8_t> loss_mask(const RenderedChat& chat,
                                    const std::vector<std::pair<std::size_t, std::size_t>>& offsets, LossMask mode) {
  std::vector<std::uint8_t> mask(offsets.size(), mode == LossMask::train_on_all ? 1 : 0);
  if (mode == LossMask::train_on_all || chat.assistant.empty()) return mask;
  const std::size_t first = mode == LossMask::train_on_last ? chat.assistant.size() - 1 : 0;
  for (std::size_t t = 0; t < offsets.size(); ++t) {
    const auto [b, e] = offsets[t];
    for (std::size_t s = first; s < chat.assistant.size(); ++s)
      if (e > chat.assistant[s].begin && b < chat.assistant[s].end) mask[t] = 1;
  }
  return mask;
}

std::vector<std::pair<std::size_t, std::size_t>> token_byte_offsets(const refit::Tokenizer& tokenizer,
                                                                    const std::vector<std::int64_t>& ids,
                                                                    const std::string& text) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  out.reserve(ids.size());
  std::size_t at = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const auto bytes = tokenizer.token_bytes(ids[k]);
    if (!bytes)
      throw refit::Error("token offsets: the tokenizer does not keep the text's bytes (id " + std::to_string(ids[k]) + ")");
    if (text.compare(at, bytes->size(), *bytes) != 0)
      throw refit::Error("token offsets: token " + std::to_string(k) + " (id " + std::to_string(ids[k]) +
                         ") is not the text at byte " + std::to_string(at));
    out.emplace_back(at, at + bytes->size());
    at += bytes->size();
  }
  if (at != text.size())
    throw refit::Error("token offsets: the tokens cover " + std::to_string(at) + " of " + std::to_string(text.size()) +
                       " bytes");
  return out;
}

}  // namespace refit::text
