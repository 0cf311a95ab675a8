// The llm plugin: decoder language models (docs/models.md, "llama").
#include "llama.h"
#include "llm/lm_datasets.h"
#include "refit/plugin.h"

namespace {

void register_llm(refit::Registry& r) {
  r.models.add("llama",
               "Llama-architecture decoder LM (transformers LlamaForCausalLM names; also Qwen2, Mistral; config_file: a "
               "config.json, or gguf: a GGUF file's metadata); reads input_ids, attention_mask; returns logits, or "
               "hidden_states and lm_head_weight",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::llm::LlamaOptions::from_config(c);
                 return [o](const refit::BuildContext& ctx) {
                   auto built = o;
                   if (ctx.weights_follow) built.init = refit::nn::Init::none;
                   return std::make_shared<refit::llm::Llama>(built);
                 };
               });
  refit::llm::register_lm_datasets(r);
}

}  // namespace

REFIT_PLUGIN("llm", "0.1.0", register_llm)
