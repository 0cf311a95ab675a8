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
  CHECK_THROWS_WITH(declared_max_length(dir), Catch::Contains("sentence_bert_config.json: not a JSON object"));

  // The real MiniLM folder: 256, and the dataset says where it came from; the recipe's own wins.
  TextPlugin p;
  const auto records = write("declared.jsonl", "{\"text\": \"a b c\"}\n");
  CHECK_THAT(p.dataset("text_jsonl", {{"file", records.string()}})->describe(),
             Catch::Contains("WordPiece max_length 256 (sentence_bert_config.json max_seq_length)"));
  CHECK_THAT(p.dataset("text_jsonl", {{"file", records.string()}, {"max_length", 64}})->describe(),
             Catch::Contains("WordPiece max_length 64 (the recipe)"));
}
