// The text plugin: BERT-family encoders.
#include "bert.h"
#include "refit/plugin.h"

namespace {

void register_text(refit::Registry& r) {
  r.models.add("bert",
               "BERT-family text encoder (transformers BertModel names; config_file: a config.json); reads input_ids, "
               "attention_mask, token_type_ids; features = mean | cls | pooler",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::text::BertOptions::from_config(c);
                 return [o](const refit::BuildContext&) { return std::make_shared<refit::text::Bert>(o); };
               });
}

}  // namespace

REFIT_PLUGIN("text", "0.1.0", register_text)
