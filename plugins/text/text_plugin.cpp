// The text plugin: BERT-family encoders and text classification datasets tokenized by BERT's
// WordPiece (docs/text.md).
#include "bert.h"
#include "refit/plugin.h"
#include "text_datasets.h"
#include "text_lines.h"

namespace {

void register_text(refit::Registry& r) {
  r.models.add("bert",
               "BERT-family text encoder (transformers BertModel names; config_file: a config.json); reads input_ids, "
               "attention_mask, token_type_ids; features = mean | cls | max | pooler (default: the "
               "sentence-transformers folder's)",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::text::BertOptions::from_config(c);
                 return [o](const refit::BuildContext&) { return std::make_shared<refit::text::Bert>(o); };
               });
  using refit::text::TextOptions;
  r.datasets.add(
      "fortunes",
      "Debian's fortunes corpus, one class per category file; tokenizer, max_length, split {part, fractions, seed}",
      [](const refit::ConfigReader& c) -> refit::Builder<refit::Dataset> {
        auto o = TextOptions::from_config(c);
        auto dir = c.optional<std::string>("dir", "/usr/share/games/fortunes");
        auto categories = c.required<std::vector<std::string>>("categories");
        if (c.has("categories") && categories.size() < 2) c.error("categories", "expected at least two categories");
        return
            [=](const refit::BuildContext& ctx) { return refit::text::make_fortunes(o.for_run(ctx.seed), dir, categories); };
      });
  r.datasets.add("text_csv", "CSV (header; text, optional text_pair, label columns), WordPiece-tokenized",
                 [](const refit::ConfigReader& c) -> refit::Builder<refit::Dataset> {
                   auto o = TextOptions::from_config(c);
                   auto t = refit::text::TableOptions::from_config(c);
                   return [=](const refit::BuildContext& ctx) { return refit::text::make_text_csv(o.for_run(ctx.seed), t); };
                 });
  r.datasets.add("text_lines", "a plain text file, one input per line, read as needed (no labels: for refit predict)",
                 [](const refit::ConfigReader& c) -> refit::Builder<refit::Dataset> {
                   std::string tokenizer = c.required<std::string>("tokenizer");
                   if (c.has("tokenizer") && c.raw()["tokenizer"].is_string()) tokenizer = c.resolve(tokenizer).string();
                   const std::string file = c.path("file").string();
                   const std::pair<std::int64_t, std::string> max_length = refit::text::max_length_option(c, tokenizer);
                   return [=](const refit::BuildContext&) -> std::shared_ptr<refit::Dataset> {
                     auto words = std::make_shared<const refit::text::WordPieceTokenizer>(
                         refit::text::WordPieceTokenizer::from_directory(tokenizer));
                     return std::make_shared<refit::text::TextLines>(file, words, max_length.first, max_length.second);
                   };
                 });
  r.datasets.add("text_jsonl", "JSON lines (text, optional text_pair, label keys), WordPiece-tokenized",
                 [](const refit::ConfigReader& c) -> refit::Builder<refit::Dataset> {
                   auto o = TextOptions::from_config(c);
                   auto t = refit::text::TableOptions::from_config(c);
                   return
                       [=](const refit::BuildContext& ctx) { return refit::text::make_text_jsonl(o.for_run(ctx.seed), t); };
                 });
}

}  // namespace

REFIT_PLUGIN("text", "0.1.0", register_text)
