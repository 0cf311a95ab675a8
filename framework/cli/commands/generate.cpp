#include "cli/commands/generate.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "io/atomic_output.h"
#include "precision/autocast_guard.h"
#include "text/open_tokenizer.h"
#include "train/checkpoint.h"

namespace refit::cli {

namespace {

struct GenerationPrompt {
  std::string text;                         // plain prompts
  std::vector<text::ChatMessage> messages;  // chat prompts (rendered with the template)
  bool chat = false;
};

/// One input line: a JSON object {"prompt": ...} or {"messages": [...]}, or plain text.
GenerationPrompt parse_prompt(const std::string& line, const std::string& where) {
  GenerationPrompt p;
  const auto first = line.find_first_not_of(" \t");
  if (first == std::string::npos || line[first] != '{') {
    p.text = line;
    p.messages = {{"user", line}};
    p.chat = true;
    return p;
  }
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::exception& e) {
    throw Error(where + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (j.is_object() && j.contains("messages")) {
    p.messages = text::parse_chat_record(j, where);
    p.chat = true;
    return p;
  }
  if (!j.contains("prompt") || !j["prompt"].is_string())
    throw Error(where + ": expected {\"prompt\": string} or {\"messages\": [...]}");
  p.text = j["prompt"].get<std::string>();
  p.messages = {{"user", p.text}};
  p.chat = true;
  return p;
}

std::vector<GenerationPrompt> read_prompts(const std::string& source) {
  std::vector<GenerationPrompt> out;
  auto read = [&](std::istream& in, const std::string& name) {
    std::string line;
    std::size_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      out.push_back(parse_prompt(line, name + " line " + std::to_string(number)));
    }
  };
  if (source == "-") {
    read(std::cin, "standard input");
  } else {
    std::ifstream in(source, std::ios::binary);
    if (!in) throw Error("--prompts: cannot read " + source);
    read(in, source);
  }
  if (out.empty()) throw Error("--prompts " + source + ": no prompts");
  return out;
}

/// The tokenizer: --tokenizer, else the training data's "tokenizer" (resolved like the recipe's paths).
std::string tokenizer_path(const Assembly& assembly, const GenerateOptions& o) {
  if (!o.tokenizer.empty()) return o.tokenizer;
  const auto& data = assembly.recipe().train_data;
  if (data.config && data.config->raw().is_object() && data.config->raw().contains("tokenizer") &&
      data.config->raw()["tokenizer"].is_string())
    return data.config->resolve(data.config->raw()["tokenizer"].get<std::string>()).string();
  throw Error("generate: no tokenizer (give --tokenizer, or a \"tokenizer\" in /data/train/config)");
}

/// Length of the longest prefix of `s` that ends on a whole UTF-8 character and does not end
/// with U+FFFD (a decoder's stand-in for bytes that a later token may complete).
std::size_t stable_prefix(const std::string& s) {
  static const std::string replacement = "\xEF\xBF\xBD";
  std::size_t n = s.size();
  while (n >= 3 && s.compare(n - 3, 3, replacement) == 0) n -= 3;
  return n;
}

struct Completion {
  std::vector<std::int64_t> ids;
  std::string text;
  std::string finish = "length";
  bool done = false;
};

/// logits.argmax(-1) for [rows, vocab] fp32 logits on the CPU: the first index of each row's
/// maximum, or of its first NaN (as argmax). LibTorch's amax (vectorised; NaN if the row holds
/// one), then a scan for the first match: LibTorch's argmax compares one element at a time
/// (0.4 ms of SmolLM2's 8 x 49,152 per decoding step).
torch::Tensor greedy_tokens(const torch::Tensor& logits) {
  if (logits.dim() != 2 || logits.scalar_type() != torch::kFloat || !logits.device().is_cpu() || !logits.is_contiguous() ||
      logits.size(1) < 1)
    return logits.argmax(-1);
  const std::int64_t rows = logits.size(0), vocab = logits.size(1);
  const torch::Tensor top = logits.amax(-1);
  torch::Tensor out = torch::empty({rows}, torch::kLong);
  auto* index = out.data_ptr<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* v = logits.const_data_ptr<float>() + r * vocab;
    const float t = top.const_data_ptr<float>()[r];
    std::int64_t at = 0;
    if (std::isnan(t))
      while (at < vocab && !std::isnan(v[at])) ++at;
    else
      while (at < vocab && v[at] != t) ++at;
    index[r] = at;
  }
  return out;
}

}  // namespace

torch::Tensor next_tokens(const torch::Tensor& logits, const SamplingOptions& o, at::Generator& generator) {
  if (o.temperature <= 0) return greedy_tokens(logits);
  torch::Tensor scores = logits.to(torch::kFloat) / o.temperature;
  const auto vocab = scores.size(-1);
  if (o.top_k > 0 && o.top_k < vocab) {
    const torch::Tensor kth = std::get<0>(scores.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, -std::numeric_limits<float>::infinity());
  }
  if (o.top_p < 1.0) {
    // transformers' TopPLogitsWarper: ascending order, drop the tokens whose cumulative
    // probability stays within 1 - p; the most likely token always stays.
    auto [sorted, index] = scores.sort(-1, /*descending=*/false);
    torch::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
    torch::Tensor remove = cumulative <= (1.0 - o.top_p);
    remove.narrow(-1, vocab - 1, 1).fill_(false);
    scores = scores.masked_fill(remove.scatter(-1, index, remove), -std::numeric_limits<float>::infinity());
  }
  return at::multinomial(scores.softmax(-1), 1, /*replacement=*/false, generator).squeeze(-1);
}

GenerateSummary generate(Assembly& assembly, const GenerateOptions& o, std::FILE* progress) {
  if (o.max_new_tokens < 1) throw Error("--max-new-tokens: expected at least 1");
  if (o.batch_size < 1) throw Error("--batch-size: expected at least 1");
  if (o.sampling.top_p <= 0 || o.sampling.top_p > 1) throw Error("--top-p: expected a value in (0, 1]");
  if (o.sampling.top_k < 0) throw Error("--top-k: expected 0 or more");
  const auto prompts = read_prompts(o.prompts);
  const auto tokenizer = text::open_tokenizer(tokenizer_path(assembly, o));
  const bool untrained = o.checkpoint && o.checkpoint->string() == "none";
  std::filesystem::path dir("none");
  if (!untrained) dir = assembly.checkpoint_to_restore(o.checkpoint);
  // Without a checkpoint, the recipe's models as loaded: fresh identity adapters add only time.
  auto registry = assembly.build_models(/*fresh_adapters=*/!untrained);
  if (!untrained) load_trainable_weights(dir, *registry);
  ModelMap models = registry->model_map();
  const std::string name = o.model.empty() ? assembly.objective()->required_models().back() : o.model;
  Model& model = model_named(models, name);
  IncrementalDecoder* decoder = model.decoder();
  if (!decoder) throw Error("generate: model \"" + name + "\" is not a decoder language model (no incremental decoder)");
  for (auto& m : registry->models()) m.model->eval();
  const torch::Device device = assembly.device();
  const Precision precision = assembly.precision();

  std::optional<std::int64_t> eos = tokenizer->eos_id();
  const std::int64_t pad = tokenizer->pad_id().value_or(eos.value_or(0));
  at::Generator generator = at::detail::createCPUGenerator(o.sampling.seed);
  std::optional<io::AtomicOutputFile> out;
  if (o.out) out.emplace(*o.out);
  const bool stream = !o.out;
  if (progress && !stream)
    std::fprintf(progress, "generate: %zu prompts, model %s, checkpoint %s, %s\n", prompts.size(), name.c_str(), dir.c_str(),
                 o.sampling.temperature > 0 ? "sampling" : "greedy");

  // InferenceMode: no autograd bookkeeping per op, and the llama plugin's fused inference loops
  // (plugins/llm/fused_inference.h), which a forward without gradients in training may not take.
  c10::InferenceMode inference;
  GenerateSummary summary;
  const auto started = std::chrono::steady_clock::now();
  // Streaming prints one completion at a time, as it is decoded.
  const std::size_t batch = stream ? 1 : static_cast<std::size_t>(o.batch_size);
  for (std::size_t first = 0; first < prompts.size(); first += batch) {
    const std::size_t b = std::min(batch, prompts.size() - first);
    std::vector<std::vector<std::int64_t>> encoded(b);
    std::size_t longest = 0;
    for (std::size_t i = 0; i < b; ++i) {
      const GenerationPrompt& p = prompts[first + i];
      if (o.chat_template && p.chat) {
        auto messages = p.messages;
        if (o.system && messages.front().role != "system") messages.insert(messages.begin(), {"system", *o.system});
        encoded[i] = tokenizer->encode(tokenizer->apply_chat_template(messages, true), false);
      } else {
        encoded[i] = tokenizer->encode(p.text, true);
      }
      longest = std::max(longest, encoded[i].size());
    }
    const auto P = static_cast<std::int64_t>(longest);
    if (P + o.max_new_tokens > decoder->max_positions())
      throw Error("generate: a prompt of " + std::to_string(P) + " tokens and " + std::to_string(o.max_new_tokens) +
                  " new tokens exceed the model's " + std::to_string(decoder->max_positions()) + " positions");
    // Left padding, as transformers' generate expects of a decoder-only model.
    torch::Tensor ids = torch::full({static_cast<std::int64_t>(b), P}, pad, torch::kLong);
    torch::Tensor mask = torch::zeros({static_cast<std::int64_t>(b), P}, torch::kLong);
    for (std::size_t i = 0; i < b; ++i) {
      const auto n = static_cast<std::int64_t>(encoded[i].size());
      if (n == 0) continue;
      ids[static_cast<std::int64_t>(i)].narrow(0, P - n, n).copy_(torch::tensor(at::ArrayRef<std::int64_t>(encoded[i])));
      mask[static_cast<std::int64_t>(i)].narrow(0, P - n, n).fill_(1);
    }
    ids = ids.to(device), mask = mask.to(device);
    std::vector<Completion> rows(b);
    std::size_t printed = 0;
    if (stream && progress) {
      std::fprintf(progress, "> %s\n",
                   prompts[first].text.empty() ? prompts[first].messages.back().content.c_str()
                                               : prompts[first].text.c_str());
      std::fflush(progress);
    }
    AutocastGuard guard(device.type(), autocast_dtype(precision), uses_autocast(precision));
    auto cache = decoder->start(static_cast<std::int64_t>(b), P + o.max_new_tokens);
    torch::Tensor logits = decoder->step(ids, mask, *cache);
    for (std::int64_t t = 0; t < o.max_new_tokens; ++t) {
      const torch::Tensor next = next_tokens(logits.to(torch::kCPU), o.sampling, generator);
      const auto* nx = next.data_ptr<std::int64_t>();
      bool all_done = true;
      for (std::size_t i = 0; i < b; ++i) {
        Completion& r = rows[i];
        if (r.done) continue;
        if (eos && nx[i] == *eos) {
          r.done = true, r.finish = "eos";
          continue;
        }
        r.ids.push_back(nx[i]);
        ++summary.tokens;
        r.text = tokenizer->decode(r.ids, /*skip_special_tokens=*/true);
        for (const auto& s : o.stop)
          if (auto at = r.text.find(s); !s.empty() && at != std::string::npos) {
            r.text.resize(at);
            r.done = true, r.finish = "stop";
          }
        all_done = all_done && r.done;
      }
      if (stream && progress) {
        // Hold back a trailing partial character and anything a stop string may still claim.
        std::size_t hold = 0;
        for (const auto& s : o.stop) hold = std::max(hold, s.size() > 0 ? s.size() - 1 : 0);
        std::size_t upto = stable_prefix(rows[0].text);
        if (!rows[0].done) upto = upto > hold ? upto - hold : 0;
        if (rows[0].done) upto = rows[0].text.size();
        if (upto > printed) {
          std::fwrite(rows[0].text.data() + printed, 1, upto - printed, progress);
          std::fflush(progress);
          printed = upto;
        }
      }
      if (all_done) break;
      // A finished row goes on with padding, as transformers' generate does; its tokens are not kept.
      torch::Tensor feed = next.clone();
      for (std::size_t i = 0; i < b; ++i)
        if (rows[i].done) feed[static_cast<std::int64_t>(i)] = pad;
      mask = torch::cat({mask, torch::ones({static_cast<std::int64_t>(b), 1}, mask.options())}, 1);
      if (t + 1 < o.max_new_tokens) logits = decoder->step(feed.unsqueeze(1).to(device), mask, *cache);
    }
    if (stream && progress) {
      if (printed < rows[0].text.size())
        std::fwrite(rows[0].text.data() + printed, 1, rows[0].text.size() - printed, progress);
      std::fprintf(progress, "\n[%s, %zu tokens]\n", rows[0].finish.c_str(), rows[0].ids.size());
      std::fflush(progress);
    }
    if (out)
      for (std::size_t i = 0; i < b; ++i) {
        Json line = {{"id", first + i},
                     {"completion", rows[i].text},
                     {"tokens", rows[i].ids.size()},
                     {"finish_reason", rows[i].finish}};
        if (!prompts[first + i].text.empty()) line["prompt"] = prompts[first + i].text;
        out->write(line.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n");
      }
    summary.prompts += static_cast<std::int64_t>(b);
  }
  if (out) out->commit();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (progress && out)
    std::fprintf(progress, "wrote %s: %lld completions, %lld tokens, %.1f tokens/s\n", o.out->c_str(),
                 static_cast<long long>(summary.prompts), static_cast<long long>(summary.tokens),
                 summary.seconds > 0 ? static_cast<double>(summary.tokens) / summary.seconds : 0.0);
  return summary;
}

}  // namespace refit::cli
