#include "llm/lm_datasets.h"

#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "llm/wordnet.h"
#include "refit/error.h"
#include "refit/registry.h"
#include "text/open_tokenizer.h"
#include "text/read_file.h"

namespace refit::llm {

namespace {

using text::SplitOptions;

/// Calls `f(json, line_number)` for every non-blank line of a JSON-lines file.
template <class F>
void for_each_json_line(const std::string& file, F&& f) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read " + file);
  std::string line;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::exception& e) {
      throw Error(file + " line " + std::to_string(number) + ": not valid JSON (" + e.what() + ")");
    }
    f(j, number);
  }
}

std::string where(const std::string& file, std::size_t line, const std::string& pointer) {
  return file + " line " + std::to_string(line) + " at " + pointer;
}

std::string string_at(const Json& j, const std::string& key, const std::string& file, std::size_t line,
                      const std::string& pointer) {
  if (!j.is_object() || !j.contains(key)) throw Error(where(file, line, pointer) + ": missing \"" + key + "\"");
  const Json& v = j[key];
  if (!v.is_string())
    throw Error(where(file, line, pointer + "/" + key) + ": expected a string, found " + std::string(v.type_name()));
  return v.get<std::string>();
}

/// A sample cut to its first `max_length` tokens.
void cut(TokenizedSample& s, std::size_t max_length) {
  if (s.input_ids.size() <= max_length) return;
  s.input_ids.resize(max_length);
  s.labels.resize(max_length);
}

torch::Tensor ids_tensor(const std::vector<std::int64_t>& v) {
  return torch::tensor(at::ArrayRef<std::int64_t>(v), torch::kLong);
}

/// The records of the part the split chooses, then at most `limit`.
template <class T>
std::vector<T> choose(std::vector<T> records, const LmDataOptions& o) {
  std::vector<T> out;
  for (auto i : text::split_indices(records.size(), o.split)) out.push_back(std::move(records[i]));
  if (o.limit && static_cast<std::int64_t>(out.size()) > *o.limit) out.resize(static_cast<std::size_t>(*o.limit));
  return out;
}

std::vector<TokenizedSample> tokenize_chats(const text::LmTokenizer& tok, std::vector<std::vector<text::ChatMessage>> chats,
                                            const LmDataOptions& o) {
  std::vector<TokenizedSample> out;
  out.reserve(chats.size());
  for (auto& c : chats) {
    if (o.system && c.front().role != "system") c.insert(c.begin(), text::ChatMessage{"system", *o.system});
    out.push_back(tokenize_chat(tok, c, o.loss_mask, static_cast<std::size_t>(o.max_length)));
  }
  return out;
}

std::shared_ptr<Dataset> make_dataset(const std::string& name, std::shared_ptr<const text::LmTokenizer> tok,
                                      std::vector<TokenizedSample> samples, const LmDataOptions& o, std::size_t records) {
  return std::make_shared<LmDataset>(name, std::move(samples), std::move(tok), o.max_length, o.packing, records);
}

}  // namespace

LmDataOptions LmDataOptions::from_config(const ConfigReader& c) {
  LmDataOptions o;
  o.tokenizer = c.required<std::string>("tokenizer");
  if (c.has("tokenizer") && c.raw()["tokenizer"].is_string()) o.tokenizer = c.resolve(o.tokenizer).string();
  o.chat_template = c.maybe<std::string>("chat_template");
  o.system = c.maybe<std::string>("system");
  o.max_length = c.number_in<std::int64_t>("max_length", 512, 2, std::int64_t{1} << 24);
  const std::string mask =
      c.choice("loss_mask", {"train_on_assistant", "train_on_last", "train_on_all"}, std::string("train_on_assistant"));
  o.loss_mask = text::parse_loss_mask(mask);
  o.packing = c.optional<bool>("packing", false);
  o.split = SplitOptions::from_config(c);
  o.limit = c.maybe<std::int64_t>("limit");
  if (o.limit && *o.limit < 1) c.error("limit", "expected at least 1");
  return o;
}

LmDataOptions LmDataOptions::for_run(std::uint64_t run_seed) const {
  LmDataOptions o = *this;
  o.split = split.for_run(run_seed);
  return o;
}

TokenizedSample tokenize_chat(const text::LmTokenizer& tokenizer, const text::Conversation& messages, text::LossMask mask,
                              std::size_t max_length) {
  const text::RenderedChat chat = tokenizer.render_for_training(messages);
  std::vector<ByteSpan> spans;
  for (const auto& a : chat.assistant) spans.emplace_back(a.begin, a.end);
  if (mask == text::LossMask::train_on_last && !spans.empty()) spans = {spans.back()};
  std::vector<ByteSpan> offsets;
  // The template writes every special token itself (transformers tokenizes its output with
  // add_special_tokens=False).
  TokenizedSample s;
  s.input_ids = tokenizer.encode_with_offsets(chat.text, offsets);
  s.labels = labels_from_spans(s.input_ids, offsets, spans, mask == text::LossMask::train_on_all);
  cut(s, max_length);
  return s;
}

LmDataset::LmDataset(std::string name, std::vector<TokenizedSample> samples,
                     std::shared_ptr<const text::LmTokenizer> tokenizer, std::int64_t max_length, bool packing,
                     std::size_t records)
    : name_(std::move(name)), tokenizer_(std::move(tokenizer)), packing_(packing), records_(records) {
  if (samples.empty()) throw Error(name_ + ": no records left after the split");
  auto pad = tokenizer_->pad_id();
  if (!pad) pad = tokenizer_->eos_id();
  pad_id_ = pad.value_or(0);
  for (const auto& s : samples) targets_ += s.targets();
  if (packing_) packs_ = pack_samples(samples, static_cast<std::size_t>(max_length), &packing_stats_);
  else
    samples_ = std::move(samples);
}

std::int64_t LmDataset::size() const { return static_cast<std::int64_t>(packing_ ? packs_.size() : samples_.size()); }

std::vector<FieldInfo> LmDataset::fields() const {
  std::vector<FieldInfo> f{{"input_ids", true, static_cast<double>(pad_id_), "attention_mask"},
                           {"labels", true, static_cast<double>(kIgnoreIndex), "attention_mask"}};
  // Packed or not, so that a model configured for packed batches ("packed": true) reads the same
  // fields from packed training data and unpacked evaluation data.
  f.push_back({"position_ids", true, 0.0, "attention_mask"});
  f.push_back({"segment_ids", true, 0.0, "attention_mask"});
  return f;
}

Example LmDataset::get(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(name_ + ": sample " + std::to_string(index) + " out of range (" + std::to_string(size()) + ")");
  Example e;
  if (packing_) {
    const auto& p = packs_[static_cast<std::size_t>(index)];
    e.set("input_ids", ids_tensor(p.input_ids));
    e.set("labels", ids_tensor(p.labels));
    e.set("position_ids", ids_tensor(p.position_ids));
    e.set("segment_ids", ids_tensor(p.segment_ids));
  } else {
    const auto& s = samples_[static_cast<std::size_t>(index)];
    const auto n = static_cast<std::int64_t>(s.input_ids.size());
    e.set("input_ids", ids_tensor(s.input_ids));
    e.set("labels", ids_tensor(s.labels));
    e.set("position_ids", torch::arange(n, torch::kLong));
    e.set("segment_ids", torch::ones({n}, torch::kLong));
  }
  return e;
}

std::string LmDataset::describe() const {
  std::string d = name_ + ": " + std::to_string(records_) + " records, " + std::to_string(targets_) + " target tokens";
  if (packing_)
    d += ", packed into " + std::to_string(packs_.size()) + " sequences (" +
         std::to_string(static_cast<int>(100 * packing_stats_.fill() + 0.5)) + "% full)";
  return d;
}

void register_lm_datasets(Registry& r) {
  r.datasets.add(
      "chat_jsonl",
      "conversations (JSON lines of {\"messages\": [{role, content}]}) rendered with the tokenizer's chat template; "
      "tokenizer, chat_template, system, max_length, loss_mask, packing, split, limit",
      [](const ConfigReader& c) -> Builder<Dataset> {
        auto o = LmDataOptions::from_config(c);
        const std::string file = c.path("file").string();
        return [=](const BuildContext& ctx) -> std::shared_ptr<Dataset> {
          const LmDataOptions run = o.for_run(ctx.seed);
          auto tok = text::open_tokenizer(run.tokenizer, run.chat_template);
          auto chats = choose(text::read_chat_jsonl(file), run);
          const std::size_t n = chats.size();
          return make_dataset("chat_jsonl " + file, tok, tokenize_chats(*tok, std::move(chats), run), run, n);
        };
      });
  r.datasets.add("prompt_completion_jsonl",
                 "JSON lines of {prompt, completion}: a user and an assistant turn of the chat template (or \"template\": "
                 "\"none\": the plain text prompt + completion + EOS, loss on the completion); the shared LM keys",
                 [](const ConfigReader& c) -> Builder<Dataset> {
                   auto o = LmDataOptions::from_config(c);
                   const std::string file = c.path("file").string();
                   const std::string prompt_key = c.optional<std::string>("prompt_key", "prompt");
                   const std::string completion_key = c.optional<std::string>("completion_key", "completion");
                   const bool chat = c.choice("template", {"chat", "none"}, std::string("chat")) == "chat";
                   return [=](const BuildContext& ctx) -> std::shared_ptr<Dataset> {
                     const LmDataOptions run = o.for_run(ctx.seed);
                     auto tok = text::open_tokenizer(run.tokenizer, run.chat_template);
                     std::vector<std::pair<std::string, std::string>> pairs;
                     for_each_json_line(file, [&](const Json& j, std::size_t line) {
                       pairs.emplace_back(string_at(j, prompt_key, file, line, ""),
                                          string_at(j, completion_key, file, line, ""));
                     });
                     pairs = choose(std::move(pairs), run);
                     const std::size_t n = pairs.size();
                     std::vector<TokenizedSample> samples;
                     if (chat) {
                       std::vector<std::vector<text::ChatMessage>> chats;
                       for (auto& [p, q] : pairs) chats.push_back({{"user", p}, {"assistant", q}});
                       samples = tokenize_chats(*tok, std::move(chats), run);
                     } else {
                       const auto eos = tok->eos_id();
                       if (!eos)
                         throw Error("prompt_completion_jsonl: the tokenizer has no EOS token to end a completion with");
                       for (auto& [p, q] : pairs) {
                         std::vector<ByteSpan> offsets;
                         const std::string text = p + q;
                         TokenizedSample s;
                         s.input_ids = tok->encode_with_offsets(text, offsets);
                         s.labels = labels_from_spans(s.input_ids, offsets, {{p.size(), text.size()}},
                                                      run.loss_mask == text::LossMask::train_on_all);
                         s.input_ids.push_back(*eos);
                         s.labels.push_back(*eos);
                         cut(s, static_cast<std::size_t>(run.max_length));
                         samples.push_back(std::move(s));
                       }
                     }
                     return make_dataset("prompt_completion_jsonl " + file, tok, std::move(samples), run, n);
                   };
                 });
  r.datasets.add(
      "text",
      "a plain text file for continued pretraining: documents (\"lines\" or blank-line \"paragraphs\") each followed "
      "by EOS, every token trained, long ones cut into max_length pieces; the shared LM keys",
      [](const ConfigReader& c) -> Builder<Dataset> {
        auto o = LmDataOptions::from_config(c);
        const std::string file = c.path("file").string();
        const bool lines = c.choice("documents", {"lines", "paragraphs"}, std::string("paragraphs")) == "lines";
        return [=](const BuildContext& ctx) -> std::shared_ptr<Dataset> {
          const LmDataOptions run = o.for_run(ctx.seed);
          auto tok = text::open_tokenizer(run.tokenizer, run.chat_template);
          const auto eos = tok->eos_id();
          std::vector<std::string> docs;
          std::istringstream in(text::read_whole_file(file, "text"));
          std::string line, doc;
          auto flush = [&] {
            if (doc.find_first_not_of(" \t\r\n") != std::string::npos) docs.push_back(doc);
            doc.clear();
          };
          while (std::getline(in, line)) {
            if (lines) {
              doc = line;
              flush();
            } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
              flush();
            } else {
              doc += (doc.empty() ? "" : "\n") + line;
            }
          }
          flush();
          docs = choose(std::move(docs), run);
          std::vector<TokenizedSample> samples;
          const auto max = static_cast<std::size_t>(run.max_length);
          for (const auto& d : docs) {
            auto ids = tok->encode(d, /*add_special_tokens=*/true);
            if (eos) ids.push_back(*eos);
            for (std::size_t b = 0; b < ids.size(); b += max) {
              TokenizedSample s;
              s.input_ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(b),
                                 ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), b + max)));
              s.labels = s.input_ids;
              samples.push_back(std::move(s));
            }
          }
          return make_dataset("text " + file, tok, std::move(samples), run, docs.size());
        };
      });
  r.datasets.add(
      "wordnet",
      "WordNet's glosses (Debian wordnet-base) as chat pairs: \"What does X mean as a noun?\" -> the definition; dir, "
      "parts [noun, verb, adj, adv], max_definition_chars; the shared LM keys",
      [](const ConfigReader& c) -> Builder<Dataset> {
        auto o = LmDataOptions::from_config(c);
        WordNetOptions w;
        w.dir = c.optional<std::string>("dir", w.dir);
        w.parts = c.optional<std::vector<std::string>>("parts", w.parts);
        for (std::size_t i = 0; i < w.parts.size(); ++i)
          if (w.parts[i] != "noun" && w.parts[i] != "verb" && w.parts[i] != "adj" && w.parts[i] != "adv")
            c.error("parts", "unknown part of speech \"" + w.parts[i] + "\" (expected noun, verb, adj or adv)");
        w.max_definition_chars =
            c.number_in<std::size_t>("max_definition_chars", w.max_definition_chars, 1, std::size_t{1} << 20);
        return [=](const BuildContext& ctx) -> std::shared_ptr<Dataset> {
          const LmDataOptions run = o.for_run(ctx.seed);
          auto tok = text::open_tokenizer(run.tokenizer, run.chat_template);
          auto pairs = choose(read_wordnet(w), run);
          std::vector<std::vector<text::ChatMessage>> chats;
          for (auto& p : pairs) chats.push_back({{"user", p.prompt}, {"assistant", p.response}});
          const std::size_t n = chats.size();
          return make_dataset("wordnet " + w.dir, tok, tokenize_chats(*tok, std::move(chats), run), run, n);
        };
      });
}

}  // namespace refit::llm
