// Python's semantics for the template engine's values (jinja.h): truth, ==, ordering, str(),
// repr(), json.dumps as transformers' tojson calls it, and the str methods and filters that
// work on code points (length, slicing, strip, case mapping). Internal to refit_text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja.h"

namespace refit::text::jinja::detail {

// ---- UTF-8 <-> code points -------------------------------------------------------------------
std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);
std::size_t code_point_count(std::string_view s);

/// Python's str.isspace() for one code point (the whitespace `\s`, strip() and split() use).
bool is_py_space(char32_t c);
/// str.strip / lstrip / rstrip: `chars` unset strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
std::string py_upper(std::string_view s);
/// Whether any character is cased (str.islower() and isupper() need one).
bool has_cased(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);
/// str.split(sep, maxsplit); sep unset splits on runs of whitespace.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, std::int64_t count);

// ---- values ----------------------------------------------------------------------------------
bool truthy(const Value& v);
/// Python's ==, with jinja's Undefined == Undefined.
bool equals(const Value& a, const Value& b);
/// Python's <: -1, 0, 1; nullopt when Python raises TypeError (unorderable types).
std::optional<int> compare(const Value& a, const Value& b);
/// The Python type name ("str", "dict", "NoneType", ...), for messages.
const char* type_name(const Value& v);
bool is_number(const Value& v);  // bool, int or float (Python's numbers.Number)
double as_double(const Value& v);

/// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter
/// calls it. `indent` < 0: none; `indent_text` set: a string indent. Throws std::invalid_argument
/// with Python's TypeError text on values json cannot write.
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // the text of one level
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace refit::text::jinja::detail
