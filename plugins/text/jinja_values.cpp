// Python's value semantics for the chat-template engine (jinja_values.h). Case mapping and the
// printable test come from ICU (full mappings, as CPython's str.upper/lower use).
#include "jinja_values.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

namespace refit::text::jinja {

namespace {
// Values can nest without bound (`{% set ns.x = [ns.x] %}` in a loop): repr, json and comparisons
// recurse, so they stop at a depth (Python stops at its recursion limit too).
thread_local int nesting = 0;
struct NestGuard {
  NestGuard() {
    if (++nesting > 400) {
      --nesting;
      throw std::invalid_argument("a value nested more than 400 levels deep (Python stops at its recursion limit)");
    }
  }
  ~NestGuard() { --nesting; }
  NestGuard(const NestGuard&) = delete;
  NestGuard& operator=(const NestGuard&) = delete;
};
}  // namespace

// ---- Value construction --------------------------------------------------------------------

Value Value::undefined(std::string hint) {
  Value v;
  v.kind = Kind::Undefined;
  if (!hint.empty()) v.s = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.b = b;
  return v;
}
Value Value::integer(std::int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.i = i;
  return v;
}
Value Value::floating(double f) {
  Value v;
  v.kind = Kind::Float;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.s = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::make_list(List items, bool tuple) {
  Value v;
  v.kind = tuple ? Kind::Tuple : Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::make_dict(Dict d) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::make_iterator(List items) {
  Value v;
  v.kind = Kind::Iterator;
  v.list = std::make_shared<List>(std::move(items));
  v.iter = std::make_shared<IterState>();
  return v;
}
Value Value::make_view(List items, std::string name) {
  Value v;
  v.kind = Kind::View;
  v.list = std::make_shared<List>(std::move(items));
  v.s = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::function(std::string name) {
  Value v;
  v.kind = Kind::Function;
  v.s = std::make_shared<const std::string>(std::move(name));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > std::uint64_t(INT64_MAX)) throw refit::Error("an integer above 2^63-1 (the engine has 64-bit integers)");
      return integer(std::int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(string(k), from_json(e));
      return make_dict(std::move(d));
    }
    default: throw refit::Error("a JSON value of an unsupported type (binary)");
  }
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (detail::equals(k, key)) return &v;
  return nullptr;
}
Value* Dict::find(const Value& key) {
  for (auto& [k, v] : items)
    if (detail::equals(k, key)) return &v;
  return nullptr;
}
void Dict::set(Value key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
    return;
  }
  items.emplace_back(std::move(key), std::move(value));
}

// ---- str() and repr() ------------------------------------------------------------------------

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest digits that round-trip (what CPython's repr uses), then CPython's layout:
  // positional for decimal exponents -4..15, scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string out;
  std::size_t p = 0;
  if (sci[0] == '-') {
    out = "-";
    p = 1;
  }
  const std::size_t e_at = sci.find('e');
  std::string digits;
  for (std::size_t k = p; k < e_at; ++k)
    if (sci[k] != '.') digits += sci[k];
  const int exp10 = std::stoi(sci.substr(e_at + 1));
  const int n = int(digits.size());
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out += "0." + std::string(std::size_t(-exp10 - 1), '0') + digits;
    } else if (exp10 + 1 >= n) {
      out += digits + std::string(std::size_t(exp10 + 1 - n), '0') + ".0";
    } else {
      out += digits.substr(0, std::size_t(exp10 + 1)) + "." + digits.substr(std::size_t(exp10 + 1));
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
  }
  return out;
}

namespace {

bool is_printable(char32_t c) {  // CPython's str.isprintable for one character
  if (c == ' ') return true;
  switch (u_charType(UChar32(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : detail::decode_utf8(s)) {
    if (c == char32_t(quote) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
      out += buf;
    } else if (c < 0x7f || is_printable(c)) {
      detail::append_utf8(out, c);
    } else {
      std::snprintf(buf, sizeof buf, c <= 0xff ? "\\x%02x" : c <= 0xffff ? "\\u%04x" : "\\U%08x", unsigned(c));
      out += buf;
    }
  }
  out += quote;
  return out;
}

[[noreturn]] void unprintable(const Value& v) {
  throw std::invalid_argument(std::string("printing a ") + detail::type_name(v) +
                              " object (Python would print its address) is not supported");
}

}  // namespace

std::string to_repr(const Value& v) {
  NestGuard guard;
  switch (v.kind) {
    case Value::Kind::String: return string_repr(v.str());
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      const bool tuple = v.kind == Value::Kind::Tuple;
      std::string out = tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += to_repr((*v.list)[k]);
      }
      if (tuple && v.list->size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Value::Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += to_repr(k) + ": " + to_repr(e);
      }
      return out + "}";
    }
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::View: {
      if (v.str().rfind("range(", 0) == 0) return v.str();
      std::string out = v.str() + "([";
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += to_repr((*v.list)[k]);
      }
      return out + "])";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.str();
    case Value::Kind::List:
    case Value::Kind::Tuple:
    case Value::Kind::Dict:
    case Value::Kind::View: return to_repr(v);
    default: unprintable(v);
  }
}

namespace detail {

// ---- UTF-8 -----------------------------------------------------------------------------------

std::u32string decode_utf8(std::string_view s) {
  // Input is valid UTF-8 (the conversation reader and the template parser check it); anything
  // else decodes byte by byte so that nothing is read out of bounds.
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t k = 0; k < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || k + std::size_t(n) > s.size()) {
      out.push_back(c);
      ++k;
      continue;
    }
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int m = 1; m < n; ++m) cp = (cp << 6) | (static_cast<unsigned char>(s[k + std::size_t(m)]) & 0x3f);
    out.push_back(cp);
    k += std::size_t(n);
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xc0 | (c >> 6));
    out += char(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += char(0xe0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  } else {
    out += char(0xf0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3f));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

std::size_t code_point_count(std::string_view s) {
  std::size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
  return n;
}

bool is_py_space(char32_t c) {  // CPython's _PyUnicode_IsWhitespace table
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string cs = decode_utf8(s);
  const std::u32string set = chars ? decode_utf8(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_py_space(c); };
  std::size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strip_it(cs[b])) ++b;
  if (right)
    while (e > b && strip_it(cs[e - 1])) --e;
  return encode_utf8(std::u32string_view(cs).substr(b, e - b));
}

namespace {
std::string from_icu(const icu::UnicodeString& u) {
  std::string out;
  u.toUTF8String(out);
  return out;
}
icu::UnicodeString to_icu(std::string_view s) {
  return icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
}
bool is_cased(char32_t c) { return u_hasBinaryProperty(UChar32(c), UCHAR_CASED); }
std::string map_one(char32_t c, int how) {  // full case mapping of one character
  icu::UnicodeString u{static_cast<UChar32>(c)};
  if (how == 0) u.toLower(icu::Locale::getRoot());
  if (how == 1) u.toUpper(icu::Locale::getRoot());
  if (how == 2) u.toTitle(nullptr, icu::Locale::getRoot(), U_TITLECASE_NO_LOWERCASE | U_TITLECASE_NO_BREAK_ADJUSTMENT);
  return from_icu(u);
}
}  // namespace

bool has_cased(std::string_view s) {
  for (char32_t c : decode_utf8(s))
    if (is_cased(c)) return true;
  return false;
}
std::string py_upper(std::string_view s) {
  icu::UnicodeString u = to_icu(s);
  u.toUpper(icu::Locale::getRoot());
  return from_icu(u);
}
std::string py_lower(std::string_view s) {
  icu::UnicodeString u = to_icu(s);
  u.toLower(icu::Locale::getRoot());
  return from_icu(u);
}
std::string py_title(std::string_view s) {
  // CPython: a cased character after an uncased one is title-cased, other cased ones lowered.
  std::string out;
  bool previous_cased = false;
  for (char32_t c : decode_utf8(s)) {
    const bool cased = is_cased(c);
    if (cased) out += map_one(c, previous_cased ? 0 : 2);
    else
      append_utf8(out, c);
    previous_cased = cased;
  }
  return out;
}
std::string py_capitalize(std::string_view s) {
  const std::u32string cs = decode_utf8(s);
  if (cs.empty()) return {};
  return map_one(cs[0], 2) + py_lower(encode_utf8(std::u32string_view(cs).substr(1)));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw std::invalid_argument("empty separator");
    std::size_t start = 0;
    while (maxsplit < 0 || std::int64_t(out.size()) < maxsplit) {
      const std::size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::u32string cs = decode_utf8(s);
  std::size_t k = 0;
  while (true) {
    while (k < cs.size() && is_py_space(cs[k])) ++k;
    if (k == cs.size()) break;
    if (maxsplit >= 0 && std::int64_t(out.size()) == maxsplit) {
      std::size_t e = cs.size();
      while (e > k && is_py_space(cs[e - 1])) --e;
      out.push_back(encode_utf8(std::u32string_view(cs).substr(k, e - k)));
      break;
    }
    std::size_t e = k;
    while (e < cs.size() && !is_py_space(cs[e])) ++e;
    out.push_back(encode_utf8(std::u32string_view(cs).substr(k, e - k)));
    k = e;
  }
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, std::int64_t count) {
  std::string out;
  std::int64_t done = 0;
  if (old.empty()) {  // Python inserts `repl` before every character and at the end
    const std::u32string cs = decode_utf8(s);
    for (char32_t c : cs) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      append_utf8(out, c);
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  std::size_t start = 0;
  while (count < 0 || done < count) {
    const std::size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(repl);
    start = at + old.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

// ---- truth, equality, order ------------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s->empty();
    case Value::Kind::List:
    case Value::Kind::Tuple:
    case Value::Kind::View: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->items.empty();
    default: return true;  // a generator is true, empty or not
  }
}

bool is_number(const Value& v) {
  return v.kind == Value::Kind::Bool || v.kind == Value::Kind::Int || v.kind == Value::Kind::Float;
}
double as_double(const Value& v) {
  return v.kind == Value::Kind::Float ? v.f : v.kind == Value::Kind::Int ? double(v.i) : double(v.b);
}
static std::int64_t as_int(const Value& v) { return v.kind == Value::Kind::Int ? v.i : std::int64_t(v.b); }

bool equals(const Value& a, const Value& b) {
  NestGuard guard;
  if (is_number(a) && is_number(b)) {
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return *a.s == *b.s;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, e] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(e, *other)) return false;
      }
      return true;
    case Value::Kind::View: {
      // keys() and items() compare as sets, ranges as sequences, values() by identity.
      if (*a.s != *b.s)
        return a.s->rfind("range(", 0) == 0 && b.s->rfind("range(", 0) == 0 &&
               equals(Value::make_list(*a.list), Value::make_list(*b.list));
      if (*a.s == "dict_values") return a.list == b.list;
      if (a.s->rfind("range(", 0) == 0) return equals(Value::make_list(*a.list), Value::make_list(*b.list));
      if (a.list->size() != b.list->size()) return false;
      for (const auto& x : *a.list) {
        bool found = false;
        for (const auto& y : *b.list) found = found || equals(x, y);
        if (!found) return false;
      }
      return true;
    }
    case Value::Kind::Iterator: return a.iter == b.iter;
    case Value::Kind::Namespace: return a.dict == b.dict;
    case Value::Kind::Loop: return a.loop == b.loop;
    case Value::Kind::Function: return *a.s == *b.s;
    default: return false;
  }
}

std::optional<int> compare(const Value& a, const Value& b) {
  NestGuard guard;
  if (is_number(a) && is_number(b)) {
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float) {
      const double x = as_double(a), y = as_double(b);
      if (std::isnan(x) || std::isnan(y)) return std::nullopt;  // every comparison is False; not modelled
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const std::int64_t x = as_int(a), y = as_int(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Value::Kind::String && b.kind == Value::Kind::String) {  // UTF-8 byte order = code point order
    const int c = a.s->compare(*b.s);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if ((a.kind == Value::Kind::List && b.kind == Value::Kind::List) ||
      (a.kind == Value::Kind::Tuple && b.kind == Value::Kind::Tuple)) {
    const std::size_t n = std::min(a.list->size(), b.list->size());
    for (std::size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  return std::nullopt;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Tuple: return "tuple";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Loop: return "LoopContext";
    case Value::Kind::Function: return "function";
    case Value::Kind::Iterator: return "generator";
    case Value::Kind::View: return v.s->rfind("range(", 0) == 0 ? "range" : v.s->c_str();
  }
  return "?";
}

// ---- json.dumps ------------------------------------------------------------------------------

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          out += buf;
        } else if (ensure_ascii && c > 0x7e) {
          if (c >= 0x10000) {  // a surrogate pair, as Python writes it
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xd800 | (v >> 10)), unsigned(0xdc00 | (v & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          }
          out += buf;
        } else {
          append_utf8(out, c);
        }
    }
  }
  out += '"';
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return float_repr(f);
}

std::string json_key(const Value& k) {
  switch (k.kind) {
    case Value::Kind::String: return k.str();
    case Value::Kind::Int: return std::to_string(k.i);
    case Value::Kind::Bool: return k.b ? "true" : "false";
    case Value::Kind::None: return "null";
    case Value::Kind::Float: return json_float(k.f);
    default: throw std::invalid_argument(std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
  }
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level) {
  NestGuard guard;
  const std::string item_sep = o.separators ? o.separators->first : o.has_indent ? "," : ", ";
  const std::string key_sep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += o.indent;
  };
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float: out += json_float(v.f); return;
    case Value::Kind::String: json_string(out, v.str(), o.ensure_ascii); return;
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        if (o.has_indent) newline(level + 1);
        json_value(out, (*v.list)[k], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, e] : v.dict->items) items.emplace_back(json_key(k), &e);
      if (o.sort_keys) {
        for (const auto& [k, e] : v.dict->items)
          if (k.kind != Value::Kind::String) throw std::invalid_argument("sort_keys with keys that are not all str");
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        if (o.has_indent) newline(level + 1);
        json_string(out, items[k].first, o.ensure_ascii);
        out += key_sep;
        json_value(out, *items[k].second, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default: throw std::invalid_argument(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0);
  return out;
}

}  // namespace detail
}  // namespace refit::text::jinja
