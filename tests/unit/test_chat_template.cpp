// Chat templates (plugins/text/chat_template.h, jinja.h) against transformers' apply_chat_template
// (tests/golden/make_chat_templates.py): six real templates (SmolLM2's from its GGUF, Qwen2.5,
// Llama 3, Llama 3.2, Mistral v0.2, Mistral-Nemo) on 60 conversations render byte for byte, raise
// where jinja raises, and give the assistant spans the golden found by prefix rendering; with
// SmolLM2's tokenizer the ids and the loss masks are transformers'. Snippets pin the language
// (whitespace control, Python's str/repr and arithmetic, scoping); unsupported constructs and
// syntax errors are refused with line:column; limits stop hostile templates; the chat JSONL
// reader names file:line and pointer. No LibTorch.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "text/byte_bpe.h"
#include "text/chat_template.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_chat_template {

using refit::text::AssistantSpan;
using refit::text::ChatContext;
using refit::text::ChatTemplate;
using refit::text::Conversation;
using refit::text::LossMask;
using refit::text::RenderedChat;
namespace jinja = refit::text::jinja;
using json = nlohmann::ordered_json;

namespace {

std::string fixture_dir() {
  const char* src = std::getenv("REFIT_SOURCE_DIR");
  return std::string(src && *src ? src : ".") + "/tests/golden/chat_templates";
}

std::vector<json> read_jsonl(const std::string& name) {
  std::ifstream in(fixture_dir() + "/" + name);
  REQUIRE(in.good());
  std::vector<json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

struct Golden {
  std::map<std::string, json> templates;
  std::map<std::string, ChatTemplate> compiled;
  std::vector<Conversation> conversations;
  std::vector<json> cases;  // without the meta line

  ChatContext context(const std::string& name) const {
    const json& t = templates.at(name);
    ChatContext c;
    c.bos_token = t["bos_token"].get<std::string>();
    c.eos_token = t["eos_token"].get<std::string>();
    c.extra = t["extra"];
    return c;
  }
};

const Golden& golden() {
  static const Golden g = [] {
    Golden g;
    std::ifstream in(fixture_dir() + "/templates.json");
    REQUIRE(in.good());
    const json t = json::parse(in);
    for (const auto& [name, v] : t.items()) {
      g.templates[name] = v;
      g.compiled.emplace(name, ChatTemplate::from_string(v["text"].get<std::string>(), name));
    }
    std::size_t line = 0;
    for (const auto& rec : read_jsonl("conversations.jsonl"))
      g.conversations.push_back(refit::text::parse_chat_record(nlohmann::json::parse(rec.dump()),
                                                               "conversations.jsonl:" + std::to_string(++line)));
    auto cases = read_jsonl("cases.jsonl");
    REQUIRE(cases.at(0).contains("meta"));
    g.cases.assign(cases.begin() + 1, cases.end());
    return g;
  }();
  return g;
}

/// Where two strings first differ, for a readable failure.
std::string first_difference(const std::string& a, const std::string& b) {
  std::size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return "at byte " + std::to_string(k) + ": got \"" + a.substr(k, 40) + "\", expected \"" + b.substr(k, 40) + "\"";
}

std::string smollm2_gguf() {
  const char* p = std::getenv("REFIT_SMOLLM2_GGUF");
  return p && *p ? p : "";
}

}  // namespace

TEST_CASE("chat templates: six real templates render every golden conversation as apply_chat_template does") {
  const Golden& g = golden();
  REQUIRE(g.templates.size() == 6);
  REQUIRE(g.conversations.size() >= 50);
  std::map<std::string, int> rendered, raised;
  int failures = 0;
  for (const auto& c : g.cases) {
    const std::string name = c["template"].get<std::string>();
    const std::size_t conv = c["conversation"].get<std::size_t>();
    const bool gen = c["add_generation_prompt"].get<bool>();
    const ChatTemplate& t = g.compiled.at(name);
    INFO(name << " conversation " << conv << " add_generation_prompt " << gen);
    if (c.contains("raises")) {
      // raise_exception: the template's own message, and where in the template it was raised.
      try {
        t.render(g.conversations[conv], gen, g.context(name));
        FAIL("rendered where jinja raised: " << c["raises"].get<std::string>());
      } catch (const jinja::TemplateRaised& e) {
        CHECK(e.message() == c["raises"].get<std::string>());
        CHECK(e.line() >= 1);
      }
      ++raised[name];
      continue;
    }
    const std::string got = t.render(g.conversations[conv], gen, g.context(name));
    const std::string want = c["text"].get<std::string>();
    if (got != want && failures++ < 5) FAIL_CHECK(first_difference(got, want));
    ++rendered[name];
  }
  CHECK(failures == 0);
  // Every template rendered most conversations; Mistral v0.2 raises on those with a system
  // message or two turns of one role (it allows user/assistant alternation only).
  for (const char* name : {"smollm2", "qwen2.5", "llama3", "llama3.2", "mistral-nemo"}) CHECK(rendered[name] >= 60);
  CHECK(rendered["mistral"] >= 40);
  CHECK(raised["mistral"] >= 20);
  CHECK(raised["mistral-nemo"] >= 2);
}

TEST_CASE("chat templates: assistant spans (content + end-of-turn marker) equal the golden's prefix-rendering spans") {
  // The golden finds each turn by rendering prefixes of the conversation; the engine by
  // substituting a sentinel for one content at a time: two methods, the same bytes.
  const Golden& g = golden();
  int compared = 0;
  for (const auto& c : g.cases) {
    if (!c.contains("spans")) continue;
    const std::string name = c["template"].get<std::string>();
    const std::size_t conv = c["conversation"].get<std::size_t>();
    INFO(name << " conversation " << conv);
    const RenderedChat r = g.compiled.at(name).render_with_spans(g.conversations[conv], g.context(name),
                                                                 g.templates.at(name)["end_of_turn"].get<std::string>());
    REQUIRE(r.text == c["text"].get<std::string>());
    std::vector<std::vector<std::size_t>> got;
    for (const auto& s : r.assistant) got.push_back({s.message, s.begin, s.end});
    CHECK(got == c["spans"].get<std::vector<std::vector<std::size_t>>>());
    // Each span is the message's content as the template wrote it (Llama trims), then the marker.
    const std::string eot = g.templates.at(name)["end_of_turn"].get<std::string>();
    for (const auto& s : r.assistant) {
      REQUIRE(s.end - s.begin >= eot.size());
      CHECK(r.text.compare(s.end - eot.size(), eot.size(), eot) == 0);
      const std::string content = r.text.substr(s.begin, s.end - s.begin - eot.size());
      CHECK(g.conversations[conv][s.message].content.find(content) != std::string::npos);
    }
    ++compared;
  }
  CHECK(compared >= 250);
  // Mistral-Nemo moves the system message into the last user turn: no prefix method there, but
  // the sentinel method still finds the turns.
  const Conversation conv = {{"system", "S"}, {"user", "q1"}, {"assistant", "a1"}, {"user", "q2"}};
  const RenderedChat r = g.compiled.at("mistral-nemo").render_with_spans(conv, g.context("mistral-nemo"), "</s>");
  CHECK(r.text == "<s>[INST]q1[/INST]a1</s>[INST]S\n\nq2[/INST]");
  REQUIRE(r.assistant.size() == 1);
  CHECK(r.text.substr(r.assistant[0].begin, r.assistant[0].end - r.assistant[0].begin) == "a1</s>");
}

TEST_CASE("chat templates: with SmolLM2's tokenizer, ids and loss masks equal transformers'") {
  const std::string path = smollm2_gguf();
  if (path.empty()) FAIL("REFIT_SMOLLM2_GGUF is not set (scripts/env.sh exports it; tests/CMakeLists.txt passes it)");
  const auto file = refit::io::GgufFile::open(path);
  const auto tok = refit::text::ByteBpeTokenizer::from_gguf(file);
  const Golden& g = golden();
  int ids_compared = 0, masks_compared = 0, id_failures = 0;
  for (const auto& c : g.cases) {
    if (!c.contains("ids")) continue;
    const std::string name = c["template"].get<std::string>();
    const std::size_t conv = c["conversation"].get<std::size_t>();
    INFO(name << " conversation " << conv);
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<std::int64_t>>();
    const auto ids = tok.encode(g.compiled.at(name).render(g.conversations[conv], c["add_generation_prompt"].get<bool>(),
                                                           g.context(name)),
                                false);
    if (ids != want && id_failures++ < 3) FAIL_CHECK("ids differ from apply_chat_template(tokenize=True)");
    ++ids_compared;
    if (!c.contains("spans")) continue;
    const RenderedChat r = g.compiled.at(name).render_with_spans(g.conversations[conv], g.context(name),
                                                                 g.templates.at(name)["end_of_turn"].get<std::string>());
    const auto offsets = refit::text::token_byte_offsets(tok, want, text);
    for (const auto& [mode, key] :
         {std::pair{LossMask::train_on_assistant, "assistant_mask"}, std::pair{LossMask::train_on_last, "last_mask"}}) {
      const auto m = refit::text::loss_mask(r, offsets, mode);
      std::string s;
      for (auto v : m) s += v ? '1' : '0';
      CHECK(s == c[key].get<std::string>());
    }
    const auto all = refit::text::loss_mask(r, offsets, LossMask::train_on_all);
    CHECK(std::count(all.begin(), all.end(), 1) == std::ptrdiff_t(all.size()));
    ++masks_compared;
  }
  CHECK(id_failures == 0);
  CHECK(ids_compared >= 450);
  CHECK(masks_compared >= 250);
}

TEST_CASE("chat templates: the language, construct by construct, renders as jinja renders it") {
  auto snippets = read_jsonl("snippets.jsonl");
  REQUIRE(snippets.at(0).contains("meta"));
  std::map<std::string, jinja::Value> vars;
  for (const auto& [k, v] : snippets[0]["meta"]["variables"].items()) vars[k] = jinja::Value::from_json(v);
  for (std::size_t k = 1; k < snippets.size(); ++k) {
    const std::string text = snippets[k]["template"].get<std::string>();
    INFO("snippet " << k << ": " << text);
    const auto t = jinja::Template::parse(text, "snippet");
    CHECK(t.render(vars) == snippets[k]["text"].get<std::string>());
  }
  CHECK(snippets.size() >= 40);
}

TEST_CASE("chat templates: random templates render as jinja renders them or are refused, never otherwise") {
  // A differential test: templates drawn from the grammar, with jinja's output or error. The
  // engine may refuse what jinja renders (e.g. lazy generators it evaluates eagerly), never
  // render a different text, and never render what jinja rejects.
  auto snippets = read_jsonl("snippets.jsonl");
  std::map<std::string, jinja::Value> vars;
  for (const auto& [k, v] : snippets.at(0)["meta"]["variables"].items()) vars[k] = jinja::Value::from_json(v);
  int same = 0, refused = 0, both_fail = 0;
  for (const auto& r : read_jsonl("random.jsonl")) {
    const std::string text = r["template"].get<std::string>();
    INFO(text);
    std::optional<std::string> got;
    try {
      got = jinja::Template::parse(text, "random").render(vars);
    } catch (const jinja::TemplateError&) {
    }
    if (r.contains("error")) {
      CHECK(!got);
      both_fail += !got;
    } else if (got) {
      CHECK(*got == r["text"].get<std::string>());
      same += *got == r["text"].get<std::string>();
    } else {
      ++refused;
    }
  }
  CHECK(same >= 500);
  CHECK(both_fail >= 300);
  CHECK(refused * 10 < same);  // refusals stay rare
}

TEST_CASE("chat templates: unsupported constructs and syntax errors are refused with line:column") {
  for (const auto& e : read_jsonl("errors.jsonl")) {
    const std::string text = e["template"].get<std::string>();
    INFO(text);
    std::map<std::string, jinja::Value> vars;
    vars["messages"] = jinja::Value::from_json(json::parse(R"([{"role": "user", "content": "hi"}])"));
    vars["x"] = jinja::Value::integer(1);
    try {
      jinja::Template::parse(text, "t.jinja").render(vars);
      FAIL("accepted");
    } catch (const jinja::TemplateRaised&) {
      FAIL("raised instead of refusing");
    } catch (const jinja::TemplateError& err) {
      CHECK(err.line() == e["line"].get<int>());
      CHECK(err.column() == e["column"].get<int>());
      CHECK_THAT(err.message(), Catch::Contains(e["message"].get<std::string>()));
      CHECK_THAT(std::string(err.what()), Catch::StartsWith("t.jinja:" + std::to_string(err.line()) + ":"));
    }
  }
}

TEST_CASE("chat templates: hostile templates stop at the limits, never crash") {
  std::map<std::string, jinja::Value> vars;
  jinja::Limits small;
  small.max_output_bytes = 1000;
  small.max_iterations = 5000;
  // Output size.
  CHECK_THROWS_WITH(jinja::Template::parse("{% for i in range(100) %}{{ 'x' * 100 }}{% endfor %}", "t").render(vars, small),
                    Catch::Contains("output") && Catch::Contains("1000"));
  CHECK_THROWS_WITH(jinja::Template::parse("{{ 'x' * 100000000000 }}", "t").render(vars, small),
                    Catch::Contains("output limit"));
  // Iterations (nested loops without output) and jinja's sandbox range limit.
  CHECK_THROWS_WITH(jinja::Template::parse("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                                           "t")
                        .render(vars, small),
                    Catch::Contains("loop iterations"));
  CHECK_THROWS_WITH(jinja::Template::parse("{% for i in range(100001) %}{% endfor %}", "t").render(vars),
                    Catch::Contains("MAX_RANGE"));
  // Nesting depth: parentheses, statements, filters.
  const std::string deep = std::string(300, '(') + "1" + std::string(300, ')');
  CHECK_THROWS_AS(jinja::Template::parse("{{ " + deep + " }}", "t"), jinja::TemplateError);
  std::string nested;
  for (int k = 0; k < 300; ++k) nested += "{% if true %}";
  CHECK_THROWS_WITH(jinja::Template::parse(nested, "t"), Catch::Contains("nested too deeply"));
  std::string nots = "{{ " + std::string();
  for (int k = 0; k < 5000; ++k) nots += "not ";
  CHECK_THROWS_WITH(jinja::Template::parse(nots + "1 }}", "t"), Catch::Contains("nested too deeply"));
  // Values nested without bound (each iteration wraps the last), and lists doubled in a loop.
  CHECK_THROWS_WITH(jinja::Template::parse("{% set ns = namespace(x=[]) %}{% for i in range(3000) %}{% set ns.x = [ns.x] %}"
                                           "{% endfor %}{{ ns.x }}",
                                           "t")
                        .render(vars),
                    Catch::Contains("nested more than 400 levels"));
  CHECK_THROWS_WITH(
      jinja::Template::parse("{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}"
                             "{% endfor %}",
                             "t")
          .render(vars),
      Catch::Contains("loop iterations"));
  // Not UTF-8.
  CHECK_THROWS_WITH(jinja::Template::parse("ok \xff\xfe", "t"), Catch::Contains("t:1:4: the template is not valid UTF-8"));
}

TEST_CASE("chat templates: spans are refused when the template moves, repeats or drops the end marker") {
  const Conversation conv = {{"user", "hi"}, {"assistant", "hello"}};
  ChatContext ctx;
  ctx.eos_token = "<|end|>";
  // Content written twice: cannot tell which copy the model produces.
  auto twice =
      ChatTemplate::from_string("{% for m in messages %}{{ m.content }}{{ m.content }}<|end|>{% endfor %}", "twice");
  CHECK_THROWS_WITH(twice.render_with_spans(conv, ctx),
                    Catch::Contains("twice: assistant message 1") && Catch::Contains("once, unchanged in place"));
  // Content inspected (its length decides the layout).
  auto inspects = ChatTemplate::from_string(
      "{% for m in messages %}{% if m.content|length > 3 %}long:{% endif %}{{ m.content }}<|end|>{% endfor %}", "inspects");
  CHECK_THROWS_WITH(inspects.render_with_spans(conv, ctx), Catch::Contains("layout depends on the message's content"));
  // Content transformed (upper-cased): what stands in its place is not the content.
  auto shouts = ChatTemplate::from_string("{% for m in messages %}{{ m.content | upper }}<|end|>{% endfor %}", "shouts");
  CHECK_THROWS_WITH(shouts.render_with_spans(conv, ctx), Catch::Contains("layout depends on the message's content"));
  // No end-of-turn marker after the content.
  auto open = ChatTemplate::from_string("{% for m in messages %}{{ m.content }}\n{% endfor %}", "open");
  CHECK_THROWS_WITH(open.render_with_spans(conv, ctx), Catch::Contains("end-of-turn marker \"<|end|>\""));
  // A template with transformers' {% generation %} marks the turns itself.
  auto tagged = ChatTemplate::from_string(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|end|>"
      "{% endgeneration %}{% else %}{{ m.content }}<|end|>{% endif %}{% endfor %}",
      "tagged");
  const RenderedChat r = tagged.render_with_spans(conv, ctx);
  CHECK(r.text == "<user>hi<|end|><assistant>hello<|end|>");
  REQUIRE(r.assistant.size() == 1);
  CHECK(r.assistant[0].message == 1);
  CHECK(r.text.substr(r.assistant[0].begin, r.assistant[0].end - r.assistant[0].begin) == "hello<|end|>");
  // Loss masks from byte offsets: a token overlapping a span counts (transformers' rule).
  const std::vector<std::pair<std::size_t, std::size_t>> offsets = {{0, 8}, {8, 15}, {15, 26}, {26, 30}, {30, 38}};
  CHECK(refit::text::loss_mask(r, offsets, LossMask::train_on_assistant) == std::vector<std::uint8_t>{0, 0, 0, 1, 1});
  CHECK(refit::text::loss_mask(r, offsets, LossMask::train_on_all) == std::vector<std::uint8_t>{1, 1, 1, 1, 1});
  CHECK(refit::text::parse_loss_mask("train_on_last") == LossMask::train_on_last);
  CHECK_THROWS_WITH(refit::text::parse_loss_mask("train_on_users"), Catch::Contains("train_on_assistant"));
}

TEST_CASE("chat templates: chat JSONL errors name the line and the JSON pointer") {
  const std::string path = "chat-template-test.jsonl";
  auto write = [&](const std::string& body) { std::ofstream(path, std::ios::binary) << body; };
  write(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"ho\"}]}\n\n"
      "{\"id\": 7, \"messages\": [{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", \"content\": \"é\"}]}\n");
  const auto convs = refit::text::read_chat_jsonl(path);
  REQUIRE(convs.size() == 2);
  CHECK(convs[0][1].role == "assistant");
  CHECK(convs[1][1].content == "é");
  const std::string ok = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n";
  write(ok + "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"bot\", \"content\": \"b\"}]}\n");
  CHECK_THROWS_WITH(refit::text::read_chat_jsonl(path),
                    path + ":2: /messages/1/role: unknown role \"bot\" (system, user or assistant)");
  write(ok + ok + "{\"messages\": [{\"role\": \"user\"}]}\n");
  CHECK_THROWS_WITH(refit::text::read_chat_jsonl(path), path + ":3: /messages/0: missing \"content\"");
  write("{\"messages\": [{\"role\": \"user\", \"content\": [\"parts\"]}]}\n");
  CHECK_THROWS_WITH(refit::text::read_chat_jsonl(path), path + ":1: /messages/0/content: must be a string, found an array");
  write("{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"name\": \"n\"}]}\n");
  CHECK_THROWS_WITH(refit::text::read_chat_jsonl(path), Catch::Contains(":1: /messages/0/name: unknown key"));
  write("{\"conversation\": []}\n");
  CHECK_THROWS_WITH(refit::text::read_chat_jsonl(path), Catch::Contains(":1: /messages: missing"));
  write("{\"messages\": [}\n");
  CHECK_THROWS_WITH(refit::text::read_chat_jsonl(path), Catch::StartsWith(path + ":1: not JSON"));
  CHECK_THROWS_WITH(refit::text::read_chat_jsonl("no-such-file.jsonl"), Catch::Contains("cannot open no-such-file.jsonl"));
  std::remove(path.c_str());
}

}  // namespace refit_test_chat_template
