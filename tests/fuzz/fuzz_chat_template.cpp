// libFuzzer target: the chat-template engine (plugins/text/jinja.h, chat_template.h). The input is
// a template's text; it is parsed, rendered on a fixed conversation (system, user, assistant,
// user) with and without the generation prompt, and asked for its assistant spans. Anything it
// refuses must be a refit::Error; the limits (output size, loop iterations, nesting depth) keep a
// hostile template from running away.
#include <cstdint>
#include <string>

#include "refit/error.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const refit::text::Conversation conversation = {{"system", "You are a helpful assistant."},
                                                         {"user", "Héllo 👋 {{ not a tag }}"},
                                                         {"assistant", "  Hi!\n"},
                                                         {"user", ""}};
  refit::text::ChatContext context;
  context.bos_token = "<s>";
  context.eos_token = "</s>";
  context.extra = {{"date_string", "26 Jul 2024"}, {"tools", nullptr}};
  context.limits.max_output_bytes = 1 << 16;
  context.limits.max_iterations = 20000;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto t = refit::text::ChatTemplate::from_string(text, "fuzz.jinja");
    (void)t.render(conversation, true, context);
    (void)t.render_with_spans(conversation, context);
  } catch (const refit::Error&) {
  }
  return 0;
}
