#pragma once
// Regular expressions from recipes ("target_regex", "parameters[].match"), in RE2 syntax
// (https://github.com/google/re2/wiki/Syntax): matching takes time linear in the text and memory
// bounded by the pattern, with no recursion on the pattern's nesting, so no recipe can hang refit
// on catastrophic backtracking or overflow its stack. RE2 has no backreferences and no
// lookaround; a pattern that uses them is an error at its key.
#include <memory>
#include <string>

#include <re2/re2.h>

namespace refit {

/// `pattern` compiled, or null with the reason in `*error`.
inline std::shared_ptr<const re2::RE2> compile_regex(const std::string& pattern, std::string* error) {
  re2::RE2::Options options;
  options.set_log_errors(false);  // the caller reports the error at the recipe's key
  options.set_max_mem(8 << 20);   // a bound on the compiled program's memory
  auto re = std::make_shared<const re2::RE2>(pattern, options);
  if (re->ok()) return re;
  if (error) *error = re->error();
  return nullptr;
}

/// Whether `re` matches the whole of `text`.
inline bool regex_full_match(const std::string& text, const re2::RE2& re) { return re2::RE2::FullMatch(text, re); }

}  // namespace refit
