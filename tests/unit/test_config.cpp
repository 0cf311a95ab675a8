// ConfigReader: typed access with JSON pointers, all errors collected, unknown keys with a
// did-you-mean.
#include "refit/config.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_config {

using namespace refit;

TEST_CASE("typed reads report the pointer, the expectation and what was found") {
  auto r = ConfigReader::root(Json::parse(R"({"a": {"n": "three", "x": 1.5, "flag": 1}})"));
  auto a = r.child("a");
  CHECK(a.required<std::int64_t>("n") == 0);
  CHECK(a.required<double>("x") == 1.5);
  CHECK(a.required<bool>("flag") == false);
  CHECK(a.required<std::string>("missing").empty());
  const auto& issues = r.issues().list();
  REQUIRE(issues.size() == 3);
  CHECK(test::message_at(issues, "/a/n") == "expected an integer, got string \"three\"");
  CHECK(test::message_at(issues, "/a/flag") == "expected a boolean, got integer 1");
  CHECK(test::message_at(issues, "/a/missing") == "missing required key");
}

TEST_CASE("unknown keys are rejected with a did-you-mean, in nested objects too") {
  auto r = ConfigReader::root(Json::parse(R"({"trainig": {}, "model": {"lerning_rate": 1}})"));
  r.optional<Json>("training", Json::object());
  auto m = r.child("model");
  m.optional<double>("learning_rate", 0.1);
  r.finish();
  const auto& issues = r.issues().list();
  REQUIRE(issues.size() == 2);
  CHECK(test::message_at(issues, "/trainig").find("did you mean \"training\"") != std::string::npos);
  CHECK(test::message_at(issues, "/model/lerning_rate").find("did you mean \"learning_rate\"") != std::string::npos);
}

TEST_CASE("choices suggest the closest allowed value") {
  auto r = ConfigReader::root(Json::parse(R"({"precision": "bf16-mix"})"));
  CHECK(r.choice("precision", {"fp32", "bf16-mixed", "fp16-mixed"}, "fp32") == "fp32");
  REQUIRE(r.issues().size() == 1);
  CHECK(r.issues().list()[0].message ==
        "expected one of fp32, bf16-mixed, fp16-mixed, got \"bf16-mix\" (did you mean \"bf16-mixed\"?)");
}

TEST_CASE("pointers escape ~ and / (RFC 6901) and index arrays") {
  auto r = ConfigReader::root(Json::parse(R"({"a/b": {"c~d": [{"x": true}]}})"));
  auto items = r.child("a/b").array("c~d");
  REQUIRE(items.size() == 1);
  items[0].required<std::int64_t>("x");
  CHECK(r.issues().list().at(0).pointer == "/a~1b/c~0d/0/x");
}

TEST_CASE("relative paths resolve against the base folder") {
  auto r = ConfigReader::root(Json::parse(R"({"p": "data/x.bin", "q": "/abs/y"})"), "/recipes/run");
  CHECK(r.path("p") == std::filesystem::path("/recipes/run/data/x.bin"));
  CHECK(r.path("q") == std::filesystem::path("/abs/y"));
}

TEST_CASE("edit distance and closest match") {
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(closest_match("epoc", {"step", "epoch", "iteration"}) == std::optional<std::string>("epoch"));
  CHECK_FALSE(closest_match("zzzzzz", {"step", "epoch"}).has_value());
}

TEST_CASE("accept() marks a conditionally read key as known") {
  auto r = ConfigReader::root(Json::parse(R"({"mode": "a", "only_for_b": 1})"));
  r.required<std::string>("mode");
  r.finish();
  CHECK(r.issues().size() == 1);  // only_for_b: unknown key
  auto q = ConfigReader::root(Json::parse(R"({"mode": "a", "only_for_b": 1})"));
  q.required<std::string>("mode");
  q.accept("only_for_b");
  q.finish();
  CHECK(q.issues().empty());
}

}  // namespace refit_test_config
