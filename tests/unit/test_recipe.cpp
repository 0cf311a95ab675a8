// Recipes: malformed input gives the expected JSON pointers, all problems at once.
#include <fstream>

#include "core/recipe_parser.h"
#include "run/assembly.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_recipe {

using namespace refit;
namespace fs = std::filesystem;

namespace {

const char* kGood = R"({
  "plugins": {"load": ["test_good"], "paths": ["PLUGIN_DIR"]},
  "models": [{"name": "net", "type": "test_net", "config": {"in": 4, "out": 2}, "trainable": true}],
  "data": {"train": {"type": "test_constant", "config": {"n": 32}}},
  "objective": {"type": "classification", "config": {"models": ["net"]}},
  "training": {"duration": "4:step", "batch_size": 8}
})";

Json good() {
  std::string text = kGood;
  text.replace(text.find("PLUGIN_DIR"), 10, test::test_plugin_dir());
  return Json::parse(text);
}

fs::path write_temp(const std::string& name, const std::string& text) {
  fs::path dir = fs::temp_directory_path() / "refit-tests";
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p) << text;
  return p;
}

/// Parses + resolves against the registry (what `refit validate` does); returns the issues.
std::vector<ConfigIssue> problems(Json doc) {
  try {
    Assembly s(parse_recipe(std::move(doc), "/tmp"));
  } catch (const ConfigError& e) {
    return e.issues();
  }
  return {};
}

}  // namespace

TEST_CASE("a good recipe validates") {
  auto issues = problems(good());
  for (const auto& i : issues) UNSCOPED_INFO(i.to_string());
  CHECK(issues.empty());
}

TEST_CASE("deep nesting is refused up front, and a deep wrongly typed value is reported without dumping it") {
  // 200000 levels: a recursive walk or dump would overflow the stack.
  const std::size_t n = 200000;
  auto deep = write_temp("deep.json", "{\"training\": " + std::string(n, '[') + std::string(n, ']') + "}");
  CHECK_THROWS_WITH(load_recipe(deep), Catch::Contains("nested more than 64 levels deep"));
  // Within the bound, a wrongly typed nested value is named by its pointer and described by size.
  Json d = good();
  Json v = 1;
  for (int i = 0; i < 50; ++i) v = Json::array({v});
  d["training"]["batch_size"] = v;
  auto issues = problems(d);
  REQUIRE(issues.size() == 1);
  CHECK_THAT(issues[0].to_string(), Catch::Contains("/training/batch_size: expected an integer, got array"));
}

TEST_CASE("environment variables in recipe strings: ${NAME} expands, an unset one is an error at its pointer") {
  setenv("REFIT_TEST_WEIGHTS_DIR", "/opt/w", 1);
  unsetenv("REFIT_TEST_UNSET");
  Json d = good();
  d["output"] = {{"dir", "${REFIT_TEST_WEIGHTS_DIR}/run"}};
  auto p = write_temp("env.json", d.dump());
  CHECK(load_recipe(p).output_dir == "/opt/w/run");
  d["output"]["dir"] = "${REFIT_TEST_UNSET}/run";
  p = write_temp("env.json", d.dump());
  CHECK_THROWS_WITH(load_recipe(p), Catch::Contains("/output/dir: the environment variable REFIT_TEST_UNSET is not set"));
}

TEST_CASE("bad JSON names the line and column") {
  auto p = write_temp("bad.json", "{\n  \"models\": [\n    {\"name\": \"x\",,}\n  ]\n}\n");
  try {
    load_recipe(p);
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("bad.json:3:") && Catch::Contains("invalid JSON"));
  }
}

TEST_CASE("a wrong type names its pointer") {
  Json d = good();
  d["training"]["batch_size"] = "eight";
  auto issues = problems(d);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].to_string() == "/training/batch_size: expected an integer, got string \"eight\"");
}

TEST_CASE("clip_grad_value must be positive, and model inputs must map to data field names") {
  Json d = good();
  d["training"]["clip_grad_value"] = 0;
  d["models"][0]["inputs"] = {{"features", 3}};
  auto issues = problems(d);
  CHECK(test::message_at(issues, "/training/clip_grad_value") ==
        "expected a positive number (gradients are clamped to [-v, v])");
  CHECK(test::message_at(issues, "/models/0/inputs/features") == "expected the name of a data field (a non-empty string)");
  d["training"]["clip_grad_value"] = 0.5;
  d["models"][0]["inputs"] = {{"features", "x"}};
  CHECK(problems(d).empty());
}

TEST_CASE("a malformed duration says what is expected") {
  Json d = good();
  d["training"]["duration"] = "10 steps";
  auto issues = problems(d);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].to_string() == "/training/duration: expected \"N:step|iteration|epoch\" with N > 0, got \"10 steps\"");
}

TEST_CASE("unknown keys get a did-you-mean, at the top level and inside factory configs") {
  Json d = good();
  d["trainng"] = Json::object();
  d["models"][0]["config"]["outt"] = 3;
  auto issues = problems(d);
  REQUIRE(issues.size() == 2);
  CHECK_THAT(test::message_at(issues, "/trainng"), Catch::Contains("did you mean \"training\""));
  CHECK_THAT(test::message_at(issues, "/models/0/config/outt"), Catch::Contains("did you mean \"out\""));
}

TEST_CASE("missing required keys are named") {
  Json d = good();
  d.erase("objective");
  d["models"][0].erase("trainable");
  auto issues = problems(d);
  CHECK(test::message_at(issues, "/objective") == "missing required key");
  CHECK(test::message_at(issues, "/models/0/trainable") == "missing required key");
}

TEST_CASE("unknown factory types and dangling model references are reported together") {
  Json d = good();
  d["models"][0]["type"] = "test_nett";
  d["objective"]["config"]["models"] = {"nett"};
  d["data"]["train"]["type"] = "nope";
  auto issues = problems(d);
  REQUIRE(issues.size() == 3);
  CHECK_THAT(test::message_at(issues, "/models/0/type"),
             Catch::Contains("unknown model type \"test_nett\" (did you mean \"test_net\"?)"));
  CHECK_THAT(test::message_at(issues, "/data/train/type"), Catch::Contains("unknown dataset type \"nope\""));
  CHECK_THAT(test::message_at(issues, "/objective/config/models/0"),
             Catch::Contains("no model named \"nett\" in /models (did you mean \"net\"?)"));
}

TEST_CASE("a missing plugin lists where it looked") {
  Json d = good();
  d["plugins"]["load"] = {"no-such-plugin"};
  auto issues = problems(d);
  auto msg = test::message_at(issues, "/plugins/load/0");
  CHECK_THAT(msg, Catch::Contains("plugin \"no-such-plugin\" not found") &&
                      Catch::Contains(test::test_plugin_dir() + "/librefit_no-such-plugin.so"));
}

TEST_CASE("overrides from --set apply before parsing (JSON or bare-string values)") {
  Json d = good();
  apply_overrides(d, {"training.seed=3", "training.precision=bf16-mixed", "models.0.config.out=5",
                      "training.clip_grad_norm=0.5"});
  CHECK(d["training"]["seed"] == 3);
  CHECK(d["training"]["precision"] == "bf16-mixed");
  CHECK(d["models"][0]["config"]["out"] == 5);
  Recipe r = parse_recipe(d, "/tmp");
  CHECK(r.issues->empty());
  CHECK(r.training.seed == 3);
  CHECK(r.training.precision == Precision::bf16_mixed);
  CHECK(r.training.clip_grad_norm == 0.5);
  CHECK_THROWS_WITH(apply_overrides(d, {"models.7.name=x"}), Catch::Contains("/models/7 is not an element"));
  CHECK_THROWS_WITH(apply_overrides(d, {"seed"}), Catch::Contains("expected KEY=VALUE"));
}

TEST_CASE("a --set override with an array index too large for an integer or text that is not UTF-8 is a ConfigError (fuzz "
          "finds)") {
  Json d = good();
  // std::stoul threw std::out_of_range; a value or key that is not UTF-8 became a string no
  // message or copy of the recipe could write (nlohmann's type_error 316).
  CHECK_THROWS_MATCHES(apply_overrides(d, {"models.99999999999999999999999.name=x"}), ConfigError,
                       Catch::Message("--set models.99999999999999999999999.name: /models/99999999999999999999999 is "
                                      "not an element of the array at /models"));
  CHECK_THROWS_MATCHES(apply_overrides(d, {"training.batch_size=\xff"}), ConfigError,
                       Catch::Message("--set training.batch_size=\xef\xbf\xbd: not UTF-8 text"));
  CHECK_THROWS_AS(apply_overrides(d, {"training.\xc3=1"}), ConfigError);
  CHECK(d == good());
  // Through the reader as refit train and refit validate call it.
  CHECK_THROWS_AS(load_recipe_text(d.dump(), "/tmp/r.json", {"training.batch_size=\xff"}), ConfigError);
  CHECK(load_recipe_text(d.dump(), "/tmp/r.json", {"training.batch_size=\"\xc3\xa9\""}).issues->size() == 1);
}

TEST_CASE(
    "a number too large for a double is invalid JSON at its line and column, not nlohmann's out_of_range (fuzz find)") {
  CHECK_THROWS_MATCHES(load_recipe_text("{\"name\": \"x\",\n  \"seed\": 1e400}", "/tmp/r.json"), ConfigError,
                       Catch::Message("/: /tmp/r.json:2:11: invalid JSON: number overflow parsing '1e400'"));
  CHECK_THROWS_MATCHES(load_recipe_text("[-99999990776E627963]", "/tmp/r.json"), ConfigError,
                       Catch::Message("/: /tmp/r.json:1:2: invalid JSON: number overflow parsing '-99999990776E627963'"));
}

TEST_CASE("relative paths resolve against the recipe's folder") {
  Json d = good();
  d["output"] = {{"dir", "../out/run1"}};
  d["plugins"]["paths"] = {"plugins"};
  auto p = write_temp("paths.json", d.dump());
  Recipe r = load_recipe(p);
  CHECK(r.output_dir == (p.parent_path().parent_path() / "out" / "run1"));
  REQUIRE(r.plugin_paths.size() == 1);
  CHECK(r.plugin_paths[0] == p.parent_path() / "plugins");
}

TEST_CASE("every shipped recipe parses and validates") {
  for (const auto& e : fs::recursive_directory_iterator(fs::path(test::source_dir()) / "recipes")) {
    if (e.path().extension() != ".json") continue;
    INFO(e.path());
    Recipe r = load_recipe(e.path());
    CHECK(r.issues->empty());
    CHECK_NOTHROW(Assembly(std::move(r)));
  }
}

TEST_CASE("a recipe with a NUL byte and garbage after its JSON is refused (nlohmann stops at a NUL)") {
  std::string text = "{\"name\": \"x\"}";
  text += std::string("\0{{{garbage", 11);
  auto p = write_temp("nul.json", text);
  CHECK_THROWS_WITH(load_recipe(p), Catch::Contains("1:14: a NUL byte"));
}

TEST_CASE("weight_decay_exempt: the run's default, a model's group, a rule's group") {
  Json d = good();
  d["optimizer"] = {{"weight_decay", 0.1}, {"weight_decay_exempt", "none"}};
  d["models"][0]["optimizer"] = {{"weight_decay_exempt", "1d_and_bias"}};
  d["models"][0]["parameters"] = Json::array({{{"match", "fc\\..*"},
                                               {"trainable", true},
                                               {"group", "fc"},
                                               {"optimizer", {{"lr", 0.5}, {"weight_decay_exempt", "none"}}}},
                                              {{"match", "fc2\\..*"}, {"trainable", true}, {"group", "fc2"}}});
  Recipe r = parse_recipe(d, "/tmp");
  CHECK(r.issues->empty());
  CHECK_FALSE(r.optimizer.exempt_1d_and_bias);
  CHECK(weight_decay_exemptions(r) == std::map<std::string, bool>{{"net", true}, {"fc", false}, {"fc2", true}});
  CHECK(parse_recipe(good(), "/tmp").optimizer.exempt_1d_and_bias);  // the default

  Json bad = good();
  bad["optimizer"] = {{"weight_decay_exempt", "biases"}};
  bad["models"][0]["parameters"] =
      Json::array({{{"match", "x"}, {"trainable", true}, {"optimizer", {{"weight_decay_exempt", "none"}}}}});
  auto issues = problems(bad);
  REQUIRE(issues.size() == 2);
  CHECK(issues[0].pointer == "/models/0/parameters/0/optimizer/weight_decay_exempt");
  CHECK_THAT(issues[0].message, Catch::Contains("give the rule a \"group\""));
  CHECK(issues[1].pointer == "/optimizer/weight_decay_exempt");
  CHECK_THAT(issues[1].message, Catch::Contains("expected one of 1d_and_bias, none"));
}

}  // namespace refit_test_recipe
