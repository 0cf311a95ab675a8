// The text plugin's datasets and config checks: CSV quoting, label columns (integers, names, and
// refused absurd ones), the seeded split (disjoint, covering), tokenized samples with their
// padding declared; a config.json with out-of-range values is an error, not a crash.
#include <filesystem>
#include <fstream>
#include <set>

#include "core/plugin_loader.h"
#include "data/loader.h"
#include "io/remove_tree.h"
#include "text/declared_max_length.h"
#include "text/wordpiece.h"
#include "text/text_datasets.h"
#include "data_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_text_datasets {

using namespace refit;
namespace fs = std::filesystem;

namespace {

fs::path write(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / "refit-text-tests";
  fs::create_directories(p);
  p /= name;
  std::ofstream(p) << text;
  return p;
}

struct TextPlugin {
  Registry registry;
  PluginLoader loader{registry};
  TextPlugin() { loader.load("text"); }
  std::vector<ConfigIssue> model_issues(Json config) {
    auto issues = std::make_shared<ConfigIssues>();
    registry.models.parse("bert", "/type", ConfigReader(std::move(config), "/config", issues));
    return issues->list();
  }
  /// Built for a run whose /training/seed is `run_seed`.
  DatasetPtr dataset(const std::string& type, Json config, std::uint64_t run_seed = 0) {
    config["tokenizer"] = test::env_path("REFIT_MINILM_DIR");
    auto issues = std::make_shared<ConfigIssues>();
    auto builder = registry.datasets.parse(type, "/type", ConfigReader(std::move(config), "/config", issues));
    if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
    BuildContext ctx;
    ctx.seed = run_seed;
    return builder(ctx);
  }
};

}  // namespace

TEST_CASE("csv parsing: quoted fields with commas, doubled quotes and newlines, an open quote names its line") {
  const auto rows = text::parse_csv("text,label\n\"a, \"\"b\"\"\nc\",1\nplain,0\n");
  REQUIRE(rows.size() == 3);
  CHECK(rows[1][0] == "a, \"b\"\nc");
  CHECK(rows[2] == std::vector<std::string>{"plain", "0"});
  CHECK_THROWS_WITH(text::parse_csv("text,label\nok,1\n\"never closed,0\n"), Catch::Contains("line 3 is never closed"));
}

TEST_CASE("text_csv and text_jsonl: tokenized samples, label names, a seeded disjoint split") {
  TextPlugin plugin;
  std::string csv = "text,label\n";
  for (int i = 0; i < 40; ++i)
    csv += "\"record number " + std::to_string(i) + ", short\"," + (i % 2 ? "spam" : "ham") + "\n";
  const auto file = write("small.csv", csv);
  std::set<std::string> seen;
  std::size_t total = 0;
  for (const char* part : {"train", "val", "test"}) {
    auto ds = plugin.dataset("text_csv", Json{{"file", file.string()},
                                              {"max_length", 8},
                                              {"split", {{"part", part}, {"fractions", {0.5, 0.25, 0.25}}, {"seed", 3}}}});
    total += static_cast<std::size_t>(ds->size());
    CHECK(ds->num_classes() == 2);  // "ham" = 0, "spam" = 1
    for (std::int64_t i = 0; i < ds->size(); ++i) {
      const Example e = ds->get(i);
      CHECK(e.at("input_ids").size(0) <= 8);
      CHECK(e.at("input_ids")[0].item<std::int64_t>() == 101);  // [CLS]
      seen.insert(c10::str(e.at("input_ids")));
    }
  }
  CHECK(total == 40);
  CHECK(seen.size() == 40);  // disjoint and covering
  auto all = plugin.dataset("text_csv", Json{{"file", file.string()}});
  CHECK(field_names(all->fields()) == std::vector<std::string>{"input_ids", "attention_mask", "token_type_ids", "labels"});
  DataLoader loader(all, LoaderOptions{4, false, false, 0});
  const Batch b = loader.batch(0, 0);
  CHECK(b.at("attention_mask").sizes() == b.at("input_ids").sizes());

  const auto jsonl =
      write("pairs.jsonl", "{\"q\": \"Is it?\", \"a\": \"Yes.\", \"y\": 1}\n\n{\"q\": \"No?\", \"a\": \"No.\", \"y\": 0}\n");
  auto pairs =
      plugin.dataset("text_jsonl", Json{{"file", jsonl.string()}, {"text", "q"}, {"text_pair", "a"}, {"label", "y"}});
  REQUIRE(pairs->size() == 2);
  CHECK(pairs->get(0).at("token_type_ids").sum().item<std::int64_t>() > 0);  // the second text has type 1
  CHECK(all->class_names() == std::vector<std::string>{"ham", "spam"});
}

TEST_CASE("text_csv and text_jsonl without labels: no \"labels\" field, unless the config names a label that is missing") {
  TextPlugin plugin;
  const std::vector<std::string> unlabelled{"input_ids", "attention_mask", "token_type_ids"};
  // No "label" column and none named: texts to predict on.
  const auto csv = write("texts.csv", "id,text\n1,first text\n2,\"second, with a comma\"\n");
  auto texts = plugin.dataset("text_csv", Json{{"file", csv.string()}});
  REQUIRE(texts->size() == 2);
  CHECK(field_names(texts->fields()) == unlabelled);
  CHECK_FALSE(texts->get(1).has("labels"));
  CHECK(texts->num_classes() == -1);
  CHECK(texts->class_names().empty());
  CHECK_THAT(texts->describe(), Catch::Contains("2 records, no labels"));
  // "label": null ignores a label column that is there.
  const auto labelled = write("labelled.csv", "text,label\na,x\nb,y\n");
  CHECK(field_names(plugin.dataset("text_csv", Json{{"file", labelled.string()}, {"label", nullptr}})->fields()) ==
        unlabelled);
  // A label the config names must be there.
  CHECK_THROWS_WITH(plugin.dataset("text_csv", Json{{"file", csv.string()}, {"label", "label"}}),
                    Catch::Contains("no column \"label\" (columns: id, text)"));
  // JSONL: the first record decides; a later record without the label is an error naming its line.
  const auto jsonl = write("texts.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  CHECK(field_names(plugin.dataset("text_jsonl", Json{{"file", jsonl.string()}})->fields()) == unlabelled);
  const auto ragged = write("ragged.jsonl", "{\"text\": \"a\", \"label\": 1}\n{\"text\": \"b\"}\n");
  CHECK_THROWS_WITH(plugin.dataset("text_jsonl", Json{{"file", ragged.string()}}),
                    Catch::Contains("line 2: no key \"label\""));
  const auto late = write("late.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\", \"label\": 1}\n");
  CHECK_THROWS_WITH(plugin.dataset("text_jsonl", Json{{"file", late.string()}}),
                    Catch::Contains("line 2: has a \"label\" key, which the first record lacks"));
  CHECK_THROWS_WITH(plugin.dataset("text_jsonl", Json{{"file", jsonl.string()}, {"label", "y"}}),
                    Catch::Contains("line 1: no key \"y\""));
}

TEST_CASE("text split: without a seed of its own it is the run's /training/seed") {
  TextPlugin plugin;
  std::string csv = "text,label\n";
  for (int i = 0; i < 40; ++i) csv += "\"record number " + std::to_string(i) + "\"," + (i % 2 ? "spam" : "ham") + "\n";
  const auto file = write("seeded.csv", csv);
  auto records = [&](Json split, std::uint64_t run_seed) {
    auto ds = plugin.dataset("text_csv", Json{{"file", file.string()}, {"max_length", 8}, {"split", split}}, run_seed);
    std::vector<std::string> out;
    for (std::int64_t i = 0; i < ds->size(); ++i) out.push_back(c10::str(ds->get(i).at("input_ids")));
    return out;
  };
  const Json unseeded = {{"part", "val"}, {"fractions", {0.5, 0.25, 0.25}}};
  // Run seed 0 is the split's former default 0; another run seed, another split.
  Json zero = unseeded;
  zero["seed"] = 0;
  CHECK(records(unseeded, 0) == records(zero, 0));
  CHECK(records(unseeded, 3) != records(unseeded, 0));
  CHECK(records(unseeded, 3) == records(unseeded, 3));
  // The parts of one run seed stay disjoint and covering.
  std::set<std::string> seen;
  for (const char* part : {"train", "val", "test"})
    for (auto& r : records(Json{{"part", part}, {"fractions", {0.5, 0.25, 0.25}}}, 3)) CHECK(seen.insert(r).second);
  CHECK(seen.size() == 40);
  // A split that sets its seed keeps it whatever the run's.
  Json seven = unseeded;
  seven["seed"] = 7;
  CHECK(records(seven, 3) == records(seven, 0));
}

TEST_CASE("text datasets refuse absurd label columns and malformed lines with the place named") {
  TextPlugin plugin;
  const auto huge = write("huge.csv", "text,label\na,0\nb,99999999999999999999\n");
  // A value past int64 is not an integer: the column is read as names (2 classes), nothing is
  // allocated per value.
  CHECK(plugin.dataset("text_csv", Json{{"file", huge.string()}})->num_classes() == 2);
  // An integer column of ids is not a class index: refused, not allocated.
  const auto big = write("big.csv", "text,label\na,0\nb,5000000\n");
  CHECK_THROWS_WITH(plugin.dataset("text_csv", Json{{"file", big.string()}}), Catch::Contains("is not a class index below"));
  const auto ragged = write("ragged.csv", "text,label\na,0,extra\n");
  CHECK_THROWS_WITH(plugin.dataset("text_csv", Json{{"file", ragged.string()}}), Catch::Contains("row 2 has 3 fields"));
  const auto bad = write("bad.jsonl", "{\"text\": \"a\", \"label\": 0}\nnot json\n");
  CHECK_THROWS_WITH(plugin.dataset("text_jsonl", Json{{"file", bad.string()}}),
                    Catch::Contains("line 2: not a JSON object"));
}

TEST_CASE("bert: a config.json with values out of range is reported at config_file, never divided by") {
  TextPlugin plugin;
  const auto config = write("config.json", "{\"hidden_size\": 384, \"num_attention_heads\": 0, \"vocab_size\": -5, "
                                           "\"layer_norm_eps\": \"small\", \"hidden_act\": \"relu\"}");
  const auto issues = plugin.model_issues(Json{{"config_file", config.string()}});
  std::string all;
  for (const auto& i : issues) all += i.to_string() + "\n";
  CHECK_THAT(all, Catch::Contains("/config/config_file: num_attention_heads: expected a value in [1, 4096], got 0"));
  CHECK_THAT(all, Catch::Contains("/config/config_file: vocab_size: expected a value in [1, 16777216], got -5"));
  CHECK_THAT(all, Catch::Contains("/config/config_file: layer_norm_eps: expected a number in"));
  CHECK_THAT(all, Catch::Contains("hidden_act \"relu\" is not supported"));
}

TEST_CASE("text_lines: one input a line read as needed (empty lines, CRLF, no final break), tokenized as text_jsonl") {
  TextPlugin plugin;
  const auto file = write("lines.txt", "Hello, world!\r\n\nThe quick brown fox.\nlast line without a break");
  auto lines = plugin.dataset("text_lines", Json{{"file", file.string()}, {"max_length", 16}});
  REQUIRE(lines->size() == 4);
  CHECK(field_names(lines->fields()) == std::vector<std::string>{"input_ids", "attention_mask", "token_type_ids"});
  // The same ids as the in-memory dataset gives the same texts.
  const auto jsonl = write("lines.jsonl", "{\"text\": \"Hello, world!\", \"label\": \"a\"}\n"
                                          "{\"text\": \"\", \"label\": \"a\"}\n"
                                          "{\"text\": \"The quick brown fox.\", \"label\": \"a\"}\n"
                                          "{\"text\": \"last line without a break\", \"label\": \"a\"}\n");
  auto records = plugin.dataset("text_jsonl", Json{{"file", jsonl.string()}, {"max_length", 16}});
  for (std::int64_t i = 0; i < 4; ++i) {
    INFO("line " << i + 1);
    CHECK(torch::equal(lines->get(i).at("input_ids"), records->get(i).at("input_ids")));
  }
  CHECK(lines->get(1).at("input_ids").size(0) == 2);  // an empty line: [CLS] [SEP]
  CHECK_THROWS_WITH(lines->get(4), Catch::Contains("line 5 is out of range (the file has 4 lines)"));
  DataLoader loader(lines, LoaderOptions{3, false, false, 0});
  CHECK(loader.batches_per_epoch() == 2);
  CHECK(loader.batch(0, 1).size() == 1);
}

TEST_CASE("max_length: a text input without one truncates where the model folder says, naming the source") {
  const fs::path dir = fs::temp_directory_path() / "refit-text-tests" / "declared";
  io::remove_tree(dir);  // (std::filesystem::remove_all may resolve to libtorch.so's copy: io/remove_tree.h)
  fs::create_directories(dir);
  const auto put = [&](const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; };
  using text::declared_max_length;
  CHECK_FALSE(declared_max_length(dir));  // neither file
  put("tokenizer_config.json", R"({"model_max_length": 1000000000000000019884624838656})");
  CHECK_FALSE(declared_max_length(dir));  // transformers' "no limit"
  put("tokenizer_config.json", R"({"model_max_length": 512})");
  CHECK(declared_max_length(dir)->tokens == 512);
  CHECK(declared_max_length(dir)->source == "tokenizer_config.json model_max_length");
  put("sentence_bert_config.json", R"({"max_seq_length": 256, "do_lower_case": false})");
  CHECK(declared_max_length(dir)->tokens == 256);  // sentence-transformers' setting first
  CHECK(declared_max_length(dir)->source == "sentence_bert_config.json max_seq_length");
  for (const std::string bad : {"{\"max_seq_length\": 2.5}", "{\"max_seq_length\": \"256\"}", "{\"max_seq_length\": 2}"}) {
    put("sentence_bert_config.json", bad);
    CHECK_THROWS_WITH(declared_max_length(dir),
                      Catch::Contains("sentence_bert_config.json: \"max_seq_length\" must be an integer"));
  }
  put("sentence_bert_config.json", "not json");
  CHECK_THROWS_WITH(declared_max_length(dir), Catch::Contains("sentence_bert_config.json: not JSON"));
  put("sentence_bert_config.json", "[256]");
  CHECK_THROWS_WITH(declared_max_length(dir), Catch::Contains("sentence_bert_config.json: not a JSON object"));

  // The real MiniLM folder: 256, and the dataset says where it came from; the recipe's own wins.
  TextPlugin p;
  const auto records = write("declared.jsonl", "{\"text\": \"a b c\"}\n");
  CHECK_THAT(p.dataset("text_jsonl", {{"file", records.string()}})->describe(),
             Catch::Contains("WordPiece max_length 256 (sentence_bert_config.json max_seq_length)"));
  CHECK_THAT(p.dataset("text_jsonl", {{"file", records.string()}, {"max_length", 64}})->describe(),
             Catch::Contains("WordPiece max_length 64 (the recipe)"));
}

namespace {

/// A sentence-transformers folder for a tiny BERT (hidden 8): config.json, and the files given.
struct StFolder {
  fs::path dir;
  explicit StFolder(const std::string& name) : dir(fs::temp_directory_path() / "refit-text-tests" / name) {
    io::remove_tree(dir);  // (std::filesystem::remove_all may resolve to libtorch.so's copy: io/remove_tree.h)
    fs::create_directories(dir / "1_Pooling");
    put("config.json", R"({"vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                           "intermediate_size": 16, "max_position_embeddings": 16})");
  }
  void put(const std::string& name, const std::string& text) const { std::ofstream(dir / name) << text; }
  /// modules.json as sentence-transformers writes it: Transformer, Pooling (1_Pooling), and
  /// Normalize when `normalize`.
  void modules(bool normalize) const {
    std::string m = R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})";
    if (normalize)
      m += R"(, {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})";
    put("modules.json", m + "]");
  }
  /// 1_Pooling/config.json with `mode` the one true pooling mode.
  void pooling(const std::string& mode) const {
    std::string c = R"({"word_embedding_dimension": 8)";
    for (const char* m : {"pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                          "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"})
      c += std::string(", \"") + m + "\": " + (mode == m ? "true" : "false");
    put("1_Pooling/config.json", c + R"(, "include_prompt": true})");
  }
  Json config(Json extra = Json::object()) const {
    Json c{{"config_file", (dir / "config.json").string()}};
    for (auto& [k, v] : extra.items()) c[k] = v;
    return c;
  }
};

/// The bert model's line in the run header (Model::describe()), or its config issues.
std::string header(TextPlugin& p, const Json& config) {
  auto issues = std::make_shared<ConfigIssues>();
  auto builder = p.registry.models.parse("bert", "/type", ConfigReader(config, "/config", issues));
  if (!issues->empty()) return std::string("issues: ") + ConfigError(issues->list()).what();
  return builder(BuildContext{})->describe();
}

}  // namespace

TEST_CASE("bert pooling: without output/normalize in the recipe, the sentence-transformers folder's, named in the header") {
  TextPlugin p;
  StFolder st("pooling");
  // No modules.json: nothing declared (sentence-transformers then mean-pools, unnormalised).
  CHECK(header(p, st.config()) == "bert, 1 layers, hidden 8, features mean (the default), normalize false (the default)");
  st.modules(true);
  st.pooling("pooling_mode_mean_tokens");
  CHECK(header(p, st.config()) ==
        "bert, 1 layers, hidden 8, features mean (1_Pooling/config.json pooling_mode_mean_tokens), "
        "normalize true (modules.json Normalize)");
  st.pooling("pooling_mode_cls_token");
  CHECK_THAT(header(p, st.config()), Catch::Contains("features cls (1_Pooling/config.json pooling_mode_cls_token)"));
  st.pooling("pooling_mode_max_tokens");
  CHECK_THAT(header(p, st.config()), Catch::Contains("features max (1_Pooling/config.json pooling_mode_max_tokens)"));
  st.modules(false);  // no Normalize module: the folder says unnormalised
  CHECK_THAT(header(p, st.config()), Catch::EndsWith("normalize false (modules.json, no Normalize)"));
  // The recipe's values win, each on its own.
  CHECK_THAT(header(p, st.config({{"output", "mean"}})),
             Catch::Contains("features mean (the recipe), normalize false (modules.json, no Normalize)"));
  st.modules(true);
  CHECK_THAT(header(p, st.config({{"normalize", false}})),
             Catch::Contains("features max (1_Pooling/config.json pooling_mode_max_tokens), normalize false (the recipe)"));
  CHECK_THAT(header(p, st.config({{"output", "pooler"}, {"normalize", false}})),
             Catch::Contains("features pooler (the recipe), normalize false (the recipe)"));
  // The Pooling module's folder is the one modules.json names; the module types may live in newer
  // packages (matched by class name).
  fs::create_directories(st.dir / "pool");
  st.put("pool/config.json", R"({"pooling_mode_cls_token": true})");
  st.put("modules.json", R"([{"path": "", "type": "sentence_transformers.models.Transformer"},
                             {"path": "pool", "type": "sentence_transformers.sentence_transformer.modules.Pooling"}])");
  CHECK_THAT(header(p, st.config()), Catch::Contains("features cls (pool/config.json pooling_mode_cls_token), "
                                                     "normalize false (modules.json, no Normalize)"));
}

TEST_CASE("bert pooling: a malformed or unsupported folder is an error naming the file and key, none when the recipe sets "
          "the value") {
  TextPlugin p;
  StFolder st("pooling-bad");
  st.modules(true);
  const std::string pooling = (st.dir / "1_Pooling" / "config.json").string();
  const std::string modules = (st.dir / "modules.json").string();
  // Modes the bert model does not compute: an error at config_file naming the file and the key...
  for (const std::string mode :
       {"pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"}) {
    INFO(mode);
    st.pooling(mode);
    CHECK_THAT(header(p, st.config()), Catch::Contains("/config/config_file: " + pooling + ": \"" + mode +
                                                       "\" is not supported (the bert model computes"));
    // ... but none when the recipe chooses the pooling itself.
    CHECK_THAT(header(p, st.config({{"output", "mean"}})), Catch::StartsWith("bert, 1 layers"));
  }
  st.put("1_Pooling/config.json", R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})");
  CHECK_THAT(header(p, st.config()),
             Catch::Contains(pooling + ": \"pooling_mode_cls_token\" and \"pooling_mode_mean_tokens\" are both true"));
  st.put("1_Pooling/config.json", R"({"pooling_mode_cls_token": false})");
  CHECK_THAT(header(p, st.config()), Catch::Contains(pooling + ": no \"pooling_mode_...\" is true"));
  // Types and bounds.
  st.put("1_Pooling/config.json", R"({"pooling_mode_mean_tokens": 1})");
  CHECK_THAT(header(p, st.config()),
             Catch::Contains(pooling + ": \"pooling_mode_mean_tokens\" must be true or false, got 1"));
  st.put("1_Pooling/config.json", R"({"pooling_mode_mean_tokens": true, "include_prompt": "yes"})");
  CHECK_THAT(header(p, st.config()), Catch::Contains(pooling + ": \"include_prompt\" must be true or false"));
  st.put("1_Pooling/config.json", R"({"pooling_mode_mean_tokens": true, "word_embedding_dimension": 384})");
  CHECK_THAT(header(p, st.config()),
             Catch::Contains(pooling + ": \"word_embedding_dimension\" is 384, but the model's hidden_size is 8"));
  st.put("1_Pooling/config.json", R"({"pooling_mode_mean_tokens": true, "word_embedding_dimension": -1})");
  CHECK_THAT(header(p, st.config()), Catch::Contains(pooling + ": \"word_embedding_dimension\" must be an integer in"));
  st.put("1_Pooling/config.json", "{\"pooling_mode_mean_tokens\": tru");
  CHECK_THAT(header(p, st.config()), Catch::Contains(pooling + ": not JSON"));
  st.put("1_Pooling/config.json", "[true]");
  CHECK_THAT(header(p, st.config()), Catch::Contains(pooling + ": not a JSON object"));
  fs::remove(st.dir / "1_Pooling" / "config.json");
  CHECK_THAT(header(p, st.config()),
             Catch::Contains(pooling + ": cannot be read (modules.json lists the Pooling module in \"1_Pooling\")"));
  // A malformed Pooling file is not read when the recipe sets the pooling.
  CHECK_THAT(header(p, st.config({{"output", "cls"}})), Catch::EndsWith("normalize true (modules.json Normalize)"));
  st.pooling("pooling_mode_mean_tokens");
  // modules.json: its shape, the Pooling module's folder, modules the bert model does not compute.
  st.put("modules.json", "not json");
  CHECK_THAT(header(p, st.config()), Catch::Contains("/config/config_file: " + modules + ": not JSON"));
  st.put("modules.json", R"({"1": "1_Pooling"})");
  CHECK_THAT(header(p, st.config()), Catch::Contains(modules + ": not a JSON array of modules"));
  st.put("modules.json", R"([{"path": ""}])");
  CHECK_THAT(header(p, st.config()), Catch::Contains(modules + ": module 0: expected an object with a string \"type\""));
  st.put("modules.json", R"([{"path": 1, "type": "sentence_transformers.models.Pooling"}])");
  CHECK_THAT(header(p, st.config()), Catch::Contains(modules + ": module 0: \"path\" must be a string, got 1"));
  for (const std::string path : {"../1_Pooling", "/etc", ""}) {
    st.put("modules.json", R"([{"path": ")" + path + R"(", "type": "sentence_transformers.models.Pooling"}])");
    CHECK_THAT(header(p, st.config()),
               Catch::Contains(modules + ": module 0: \"path\" must name a folder inside the model folder"));
  }
  // A Pooling module without "path" (the model-folder fuzz target's first find: reading the
  // missing key for the message was undefined behaviour).
  st.put("modules.json", R"([{"type": "sentence_transformers.models.Pooling"}])");
  CHECK_THAT(header(p, st.config()),
             Catch::Contains(modules + ": module 0: \"path\" must name a folder inside the model folder, got none"));
  st.put("modules.json", R"([{"path": "", "type": "sentence_transformers.models.Transformer"}])");
  CHECK_THAT(header(p, st.config()), Catch::Contains(modules + ": lists no Pooling module; set \"output\" in the recipe"));
  st.put("modules.json", R"([{"path": "", "type": "sentence_transformers.models.Transformer"},
                             {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                             {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])");
  CHECK_THAT(header(p, st.config()), Catch::Contains(modules + ": module 2: \"sentence_transformers.models.Dense\" is not "
                                                               "supported by the bert model"));
  // The recipe that sets both reads nothing from the folder.
  CHECK(header(p, st.config({{"output", "mean"}, {"normalize", true}})) ==
        "bert, 1 layers, hidden 8, features mean (the recipe), normalize true (the recipe)");
}

TEST_CASE("bert pooling: the real all-MiniLM-L6-v2 folder declares mean pooling and normalisation") {
  TextPlugin p;
  const fs::path dir = test::env_path("REFIT_MINILM_DIR");
  const Json config{{"config_file", (dir / "config.json").string()}};
  CHECK(header(p, config) == "bert, 6 layers, hidden 384, features mean (1_Pooling/config.json pooling_mode_mean_tokens), "
                             "normalize true (modules.json Normalize)");
  // And the model computes it: unit-norm features of a padded batch (initialised weights).
  auto issues = std::make_shared<ConfigIssues>();
  ModelPtr model = p.registry.models.parse("bert", "/type", ConfigReader(config, "/config", issues))(BuildContext{});
  model->eval();
  torch::NoGradGuard no_grad;
  const auto features = model
                            ->run(Fields{{"input_ids", torch::tensor({{101, 7592, 102, 0}, {101, 7592, 2088, 102}})},
                                         {"attention_mask", torch::tensor({{1, 1, 1, 0}, {1, 1, 1, 1}})},
                                         {"token_type_ids", torch::zeros({2, 4}, torch::kLong)}})
                            .at("features");
  CHECK(features.sizes() == torch::IntArrayRef{2, 384});
  CHECK(((features.norm(2, {1}) - 1).abs() < 1e-5).all().item<bool>());
}

TEST_CASE(
    "bert: max pooling is the largest state of the real tokens, padding excluded (sentence-transformers' max_tokens)") {
  TextPlugin p;
  StFolder st("max-pooling");
  torch::manual_seed(0);
  auto issues = std::make_shared<ConfigIssues>();
  ModelPtr model = p.registry.models.parse("bert", "/type",
                                           ConfigReader(st.config({{"output", "max"}}), "/config", issues))(BuildContext{});
  REQUIRE(issues->empty());
  model->eval();
  torch::NoGradGuard no_grad;
  const auto ids = torch::tensor({{2, 5, 9, 3, 0, 0}, {2, 7, 8, 11, 13, 3}});
  const auto mask = torch::tensor({{1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  const Fields out = model->run(
      Fields{{"input_ids", ids}, {"attention_mask", mask}, {"token_type_ids", torch::zeros({2, 6}, torch::kLong)}});
  const auto states = out.at("last_hidden_state");
  // The largest state over the real tokens, feature by feature (a max rounds nothing: exact).
  CHECK(torch::equal(out.at("features")[0], std::get<0>(states[0].slice(0, 0, 4).max(0))));
  CHECK(torch::equal(out.at("features")[1], std::get<0>(states[1].max(0))));
  // The check can see padding: the padded positions' states exceed the real tokens' maximum in
  // some feature (seeded initialisation), so a max over every position would differ.
  CHECK_FALSE(torch::equal(out.at("features")[0], std::get<0>(states[0].max(0))));
}

}  // namespace refit_test_text_datasets
