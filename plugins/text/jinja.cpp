// The chat-template engine (jinja.h): jinja2 3.1's lexer rules (lexer.py: newline handling,
// `-`/`+` whitespace control, trim_blocks, lstrip_blocks, bracket balancing inside tags), its
// parser's grammar and precedence (parser.py), and an interpreter with jinja's scoping (a
// `set` inside a for loop stays in that iteration; namespace() carries values out).
#include "text/jinja.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "jinja_values.h"

namespace refit::text::jinja {

using detail::truthy;

// ---- AST -----------------------------------------------------------------------------------

enum class K {
  // statements
  Body,
  Data,
  Print,
  If,
  For,
  Set,
  SetNs,
  SetBlock,
  Break,
  Continue,
  Generation,
  // expressions
  Const,
  Name,
  ListLit,
  TupleLit,
  DictLit,
  GetAttr,
  GetItem,
  Slice,
  Call,
  Filter,
  Test,
  Neg,
  Pos,
  Not,
  And,
  Or,
  BinOp,
  Compare,
  Concat,
  Cond
};

using NodePtr = std::unique_ptr<Node>;

struct Node {
  K k;
  std::size_t pos = 0;  // byte offset in the normalised source
  std::string name;     // Data: text; Name, GetAttr, Filter, Test, SetNs: the name; BinOp: the operator
  Value value;          // Const
  bool flag = false;    // If: has else; For: has filter; Test: negated
  std::vector<NodePtr> kids;
  std::vector<std::string> kw;       // Call/Filter/Test: names of the trailing keyword arguments
  std::vector<std::string> targets;  // For, Set: the assigned names; SetNs: the attribute
  std::vector<std::string> ops;      // Compare
  Node(K kind, std::size_t at) : k(kind), pos(at) {}
};

namespace {

// ---- errors --------------------------------------------------------------------------------

struct Where {
  const std::string* label;
  const std::string* source;
  std::pair<int, int> line_column(std::size_t pos) const {
    int line = 1, column = 1;
    const std::size_t end = std::min(pos, source->size());
    for (std::size_t k = 0; k < end; ++k) {
      const unsigned char c = static_cast<unsigned char>((*source)[k]);
      if (c == '\n') {
        ++line;
        column = 1;
      } else if ((c & 0xc0) != 0x80) {
        ++column;
      }
    }
    return {line, column};
  }
  [[noreturn]] void fail(std::size_t pos, const std::string& message) const {
    const auto [line, column] = line_column(pos);
    throw TemplateError(*label, line, column, message);
  }
};

// ---- lexer ---------------------------------------------------------------------------------

enum class T { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  T t;
  std::size_t pos;
  std::string text;  // Data; Name; String (unescaped); Op; Int/Float: the literal
  Value value;       // Int, Float
};

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

/// Python's `\s` at `pos` (Unicode whitespace): its byte length, 0 if none.
std::size_t space_at(const std::string& s, std::size_t pos) {
  if (pos >= s.size()) return 0;
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return detail::is_py_space(c) ? 1 : 0;
  const std::size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (pos + n > s.size()) return 0;
  const std::u32string cp = detail::decode_utf8(std::string_view(s).substr(pos, n));
  return cp.size() == 1 && detail::is_py_space(cp[0]) ? n : 0;
}
std::size_t skip_spaces(const std::string& s, std::size_t pos) {
  while (std::size_t n = space_at(s, pos)) pos += n;
  return pos;
}
bool all_spaces(const std::string& s, std::size_t from, std::size_t to) {
  while (from < to) {
    const std::size_t n = space_at(s, from);
    if (!n) return false;
    from += n;
  }
  return true;
}
std::string rstrip_spaces(const std::string& text) { return detail::py_strip(text, std::nullopt, false, true); }

class Lexer {
 public:
  Lexer(const std::string& src, const Where& where) : s_(src), w_(where) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    bool line_starting = true;
    std::size_t pos = 0;
    while (pos < s_.size()) {
      // The earliest tag opener ({{, {%, {#) from pos: jinja's root rule `(.*?)(?:...)`.
      std::size_t at = pos;
      while (true) {
        at = s_.find('{', at);
        if (at == std::string::npos || at + 1 >= s_.size()) {
          at = std::string::npos;
          break;
        }
        const char n = s_[at + 1];
        if (n == '{' || n == '%' || n == '#') break;
        ++at;
      }
      if (at == std::string::npos) {
        out.push_back({T::Data, pos, s_.substr(pos), {}});
        break;
      }
      const char kind = s_[at + 1];
      std::size_t after = at + 2;
      char sign = 0;
      if (after < s_.size() && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
      if (kind == '%') {  // {% raw %}: jinja lexes it specially; the engine does not take it
        std::size_t p = skip_spaces(s_, after);
        if (s_.compare(p, 3, "raw") == 0 && !(p + 3 < s_.size() && is_name_char(s_[p + 3])))
          w_.fail(at, "unsupported: {% raw %} blocks");
      }
      std::string text = s_.substr(pos, at - pos);
      if (sign == '-') {
        text = rstrip_spaces(text);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: blocks and comments, not {{ }}
        const std::size_t nl = text.rfind('\n');
        const std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_spaces(text, l_pos, text.size())) text.resize(l_pos);
      }
      if (!text.empty()) out.push_back({T::Data, pos, std::move(text), {}});
      line_starting = false;
      if (kind == '#') {
        pos = comment(at, after, line_starting);
        continue;
      }
      out.push_back({kind == '{' ? T::VarBegin : T::BlockBegin, at, {}, {}});
      pos = tag(after, kind == '{', out, line_starting);
    }
    out.push_back({T::Eof, s_.size(), {}, {}});
    return out;
  }

 private:
  // `(.*?)((?:\+#}|\-#}\s*|#}\n?))`
  std::size_t comment(std::size_t open, std::size_t p, bool& line_starting) {
    const std::size_t end = s_.find("#}", p);
    if (end == std::string::npos) w_.fail(open, "missing end of comment tag");
    std::size_t after = end + 2;
    const char before = end > p ? s_[end - 1] : 0;
    if (before == '-') after = skip_spaces(s_, after);
    else if (before != '+' && after < s_.size() && s_[after] == '\n')
      ++after;
    line_starting = after > 0 && s_[after - 1] == '\n';
    return after;
  }

  std::size_t tag(std::size_t p, bool variable, std::vector<Token>& out, bool& line_starting) {
    std::vector<char> balance;
    while (true) {
      if (p >= s_.size())
        w_.fail(p, variable ? "unexpected end of template: '}}' expected" : "unexpected end of template: '%}' expected");
      if (balance.empty()) {  // the end rule first, only while brackets are balanced
        if (variable) {
          if (s_.compare(p, 3, "-}}") == 0) {
            out.push_back({T::VarEnd, p, {}, {}});
            const std::size_t q = skip_spaces(s_, p + 3);
            line_starting = q > 0 && s_[q - 1] == '\n';
            return q;
          }
          if (s_.compare(p, 2, "}}") == 0) {
            out.push_back({T::VarEnd, p, {}, {}});
            line_starting = false;
            return p + 2;
          }
        } else {
          std::size_t q = 0;
          if (s_.compare(p, 3, "+%}") == 0) q = p + 3;
          else if (s_.compare(p, 3, "-%}") == 0)
            q = skip_spaces(s_, p + 3);
          else if (s_.compare(p, 2, "%}") == 0)
            q = p + 2 + (p + 2 < s_.size() && s_[p + 2] == '\n' ? 1 : 0);
          if (q) {
            out.push_back({T::BlockEnd, p, {}, {}});
            line_starting = s_[q - 1] == '\n';
            return q;
          }
        }
      }
      if (std::size_t n = space_at(s_, p)) {
        p += n;
        continue;
      }
      const char c = s_[p];
      if (c >= '0' && c <= '9') {
        p = number(p, out);
        continue;
      }
      if (is_name_start(c)) {
        std::size_t e = p;
        while (e < s_.size() && is_name_char(s_[e])) ++e;
        if (e < s_.size() && static_cast<unsigned char>(s_[e]) >= 0x80)
          w_.fail(e, "unsupported: a name with non-ASCII characters");
        out.push_back({T::Name, p, s_.substr(p, e - p), {}});
        p = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        p = string(p, out);
        continue;
      }
      static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* t : two)
        if (s_.compare(p, 2, t) == 0) op = t;
      if (op.empty() && std::string("+-/*%~[](){}=<>.:|,;").find(c) != std::string::npos) op = std::string(1, c);
      if (op.empty()) {
        if (static_cast<unsigned char>(c) >= 0x80) w_.fail(p, "unsupported: a name with non-ASCII characters");
        w_.fail(p, std::string("unexpected char '") + c + "'");
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        if (balance.size() > 256) w_.fail(p, "brackets nested too deeply (the engine's limit is 256)");
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) w_.fail(p, "unexpected '" + op + "'");
        if (balance.back() != op[0]) w_.fail(p, "unexpected '" + op + "', expected '" + balance.back() + "'");
        balance.pop_back();
      }
      out.push_back({T::Op, p, op, {}});
      p += op.size();
    }
  }

  std::size_t number(std::size_t p, std::vector<Token>& out) {
    // jinja's float_re (digits, optional fraction, exponent; or digits and a fraction) first,
    // then integer_re (decimal, 0b, 0o, 0x; `_` separators).
    auto digits = [&](std::size_t q) {
      const std::size_t start = q;
      while (q < s_.size() &&
             (std::isdigit(static_cast<unsigned char>(s_[q])) ||
              (s_[q] == '_' && q > start && q + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q + 1])))))
        ++q;
      return q;
    };
    const bool after_dot = p > 0 && s_[p - 1] == '.';
    std::size_t e = digits(p);
    std::size_t f = e;
    bool is_float = false;
    if (!after_dot) {
      std::size_t q = e;
      bool frac = false;
      if (q + 1 < s_.size() && s_[q] == '.' && std::isdigit(static_cast<unsigned char>(s_[q + 1]))) {
        q = digits(q + 1);
        frac = true;
      }
      std::size_t r = q;
      bool expo = false;
      if (r < s_.size() && (s_[r] == 'e' || s_[r] == 'E')) {
        std::size_t t = r + 1;
        if (t < s_.size() && (s_[t] == '+' || s_[t] == '-')) ++t;
        if (t < s_.size() && std::isdigit(static_cast<unsigned char>(s_[t]))) {
          r = digits(t);
          expo = true;
        }
      }
      if (expo) {
        f = r;
        is_float = true;
      } else if (frac) {
        f = q;
        is_float = true;
      }
    }
    std::string lit;
    if (is_float) {
      for (std::size_t k = p; k < f; ++k)
        if (s_[k] != '_') lit += s_[k];
      out.push_back({T::Float, p, lit, Value::floating(std::strtod(lit.c_str(), nullptr))});
      return f;
    }
    int base = 10;
    std::size_t start = p;
    if (s_[p] == '0' && p + 1 < s_.size() && std::string("bBoOxX").find(s_[p + 1]) != std::string::npos) {
      base = (s_[p + 1] | 0x20) == 'b' ? 2 : (s_[p + 1] | 0x20) == 'o' ? 8 : 16;
      start = p + 2;
      e = start;
      while (e < s_.size() && (std::isxdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    } else if (s_[p] == '0') {  // 0(_?0)*
      e = p + 1;
      while (e < s_.size() && (s_[e] == '0' || (s_[e] == '_' && e + 1 < s_.size() && s_[e + 1] == '0'))) ++e;
    }
    for (std::size_t k = start; k < e; ++k)
      if (s_[k] != '_') lit += s_[k];
    if (lit.empty()) w_.fail(p, "malformed integer literal");
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(lit.c_str(), &end, base);
    if (errno == ERANGE) w_.fail(p, "unsupported: an integer literal beyond 64 bits");
    if (*end) w_.fail(p, "malformed integer literal");
    out.push_back({T::Int, p, lit, Value::integer(v)});
    return e;
  }

  std::size_t string(std::size_t p, std::vector<Token>& out) {
    // The literal's text, then Python's unicode-escape decoding (jinja: .encode("ascii",
    // "backslashreplace").decode("unicode-escape")): non-ASCII characters stay as they are.
    const char quote = s_[p];
    std::size_t q = p + 1;
    std::string value;
    while (true) {
      if (q >= s_.size()) w_.fail(p, "unexpected end of template inside a string literal");
      const char c = s_[q];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++q;
        continue;
      }
      if (q + 1 >= s_.size()) w_.fail(p, "unexpected end of template inside a string literal");
      const char e = s_[q + 1];
      q += 2;
      auto hex = [&](int n) {
        std::uint32_t v = 0;
        for (int k = 0; k < n; ++k, ++q) {
          if (q >= s_.size() || s_[q] == quote || !std::isxdigit(static_cast<unsigned char>(s_[q])))
            w_.fail(q, "truncated \\x, \\u or \\U escape in a string literal");
          const char h = s_[q];
          v = v * 16 + std::uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return v;
      };
      switch (e) {
        case '\n': break;  // a line continuation
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x': detail::append_utf8(value, hex(2)); break;
        case 'u':
        case 'U': {
          const std::uint32_t v = hex(e == 'u' ? 4 : 8);
          if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
            w_.fail(p, "unsupported: a string literal escape that is not a Unicode scalar value");
          detail::append_utf8(value, v);
          break;
        }
        case 'N': w_.fail(q - 2, "unsupported: \\N{...} escapes");
        default:
          if (e >= '0' && e <= '7') {
            std::uint32_t v = std::uint32_t(e - '0');
            for (int k = 0; k < 2 && q < s_.size() && s_[q] >= '0' && s_[q] <= '7'; ++k, ++q)
              v = v * 8 + std::uint32_t(s_[q] - '0');
            detail::append_utf8(value, v);
          } else {  // unknown escapes stay as written
            value += '\\';
            value += e;
          }
      }
    }
    out.push_back({T::String, p, std::move(value), {}});
    return q + 1;
  }

  const std::string& s_;
  const Where& w_;
};

// ---- parser --------------------------------------------------------------------------------

const std::set<std::string>& known_filters() {
  static const std::set<std::string> f = {"abs",    "capitalize", "count",      "d",      "default",    "first",   "float",
                                          "int",    "items",      "join",       "last",   "length",     "list",    "lower",
                                          "map",    "max",        "min",        "reject", "rejectattr", "replace", "reverse",
                                          "round",  "select",     "selectattr", "sort",   "string",     "sum",     "title",
                                          "tojson", "trim",       "unique",     "upper"};
  return f;
}
const std::set<std::string>& jinja_only_filters() {  // jinja has them; the engine does not
  static const std::set<std::string> f = {"attr",           "batch",       "center",   "dictsort",  "e",        "escape",
                                          "filesizeformat", "forceescape", "format",   "groupby",   "indent",   "pprint",
                                          "random",         "safe",        "slice",    "striptags", "truncate", "urlencode",
                                          "urlize",         "wordcount",   "wordwrap", "xmlattr"};
  return f;
}
const std::set<std::string>& known_tests() {
  static const std::set<std::string> t = {"boolean",  "defined", "divisibleby", "eq",     "equalto", "==",          "even",
                                          "false",    "float",   "ge",          ">=",     "gt",      "greaterthan", ">",
                                          "in",       "integer", "iterable",    "le",     "<=",      "lower",       "lt",
                                          "lessthan", "<",       "mapping",     "ne",     "!=",      "none",        "number",
                                          "odd",      "sameas",  "sequence",    "string", "true",    "undefined",   "upper"};
  return t;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Where& where) : t_(std::move(tokens)), w_(where) {}

  NodePtr parse_template() {
    auto body = body_until({});
    if (cur().t != T::Eof) w_.fail(cur().pos, "unexpected token");
    return body;
  }
  bool has_generation = false;

 private:
  // -- token stream
  const Token& cur() const { return t_[p_]; }
  const Token& peek(std::size_t n = 1) const { return t_[std::min(p_ + n, t_.size() - 1)]; }
  void next() {
    if (p_ + 1 < t_.size()) ++p_;
  }
  bool is_op(const char* op) const { return cur().t == T::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().t == T::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.t) {
      case T::Eof: return "end of template";
      case T::Data: return "template data";
      case T::VarBegin: return "'{{'";
      case T::VarEnd: return "'}}'";
      case T::BlockBegin: return "'{%'";
      case T::BlockEnd: return "'%}'";
      case T::Name: return "'" + t.text + "'";
      case T::String: return "a string";
      case T::Int:
      case T::Float: return "a number";
      case T::Op: return "'" + t.text + "'";
    }
    return "?";
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) w_.fail(cur().pos, std::string("expected '") + op + "', found " + describe(cur()));
  }
  void expect_block_end() {
    if (cur().t != T::BlockEnd) w_.fail(cur().pos, "expected '%}', found " + describe(cur()));
    next();
  }
  std::string expect_identifier(const char* what) {
    if (cur().t != T::Name) w_.fail(cur().pos, std::string("expected ") + what + ", found " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }
  struct Depth {  // bounds recursion: hostile templates must not overflow the stack
    Parser& p;
    explicit Depth(Parser& parser, std::size_t at) : p(parser) {
      if (++p.depth_ > 200) p.w_.fail(at, "template nested too deeply (the engine's limit is 200 levels)");
    }
    ~Depth() { --p.depth_; }
  };

  // -- statements
  /// Statements up to a `{% <one of end> ...`; leaves the stream at that tag's name.
  NodePtr body_until(const std::vector<std::string>& end) {
    auto body = std::make_unique<Node>(K::Body, cur().pos);
    while (true) {
      const Token& t = cur();
      if (t.t == T::Eof) {
        if (!end.empty()) w_.fail(t.pos, "unexpected end of template: expected {% " + end.front() + " %}");
        return body;
      }
      if (t.t == T::Data) {
        auto d = std::make_unique<Node>(K::Data, t.pos);
        d->name = t.text;
        body->kids.push_back(std::move(d));
        next();
      } else if (t.t == T::VarBegin) {
        const std::size_t at = t.pos;
        next();
        auto pr = std::make_unique<Node>(K::Print, at);
        pr->kids.push_back(tuple_expr(true, false, {}));
        if (cur().t != T::VarEnd) w_.fail(cur().pos, "expected '}}', found " + describe(cur()));
        next();
        body->kids.push_back(std::move(pr));
      } else if (t.t == T::BlockBegin) {
        next();
        if (cur().t == T::Name && std::find(end.begin(), end.end(), cur().text) != end.end()) return body;
        body->kids.push_back(statement());
      } else {
        w_.fail(t.pos, "unexpected " + describe(t));
      }
    }
  }

  NodePtr statement() {
    Depth depth(*this, cur().pos);
    const Token& t = cur();
    if (t.t != T::Name) w_.fail(t.pos, "expected a statement name, found " + describe(t));
    const std::string n = t.text;
    const std::size_t at = t.pos;
    if (n == "for") return for_stmt();
    if (n == "if") return if_stmt();
    if (n == "set") return set_stmt();
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) w_.fail(at, "'" + n + "' outside a for loop");
      next();
      expect_block_end();
      return std::make_unique<Node>(n == "break" ? K::Break : K::Continue, at);
    }
    if (n == "generation") {
      next();
      expect_block_end();
      auto g = std::make_unique<Node>(K::Generation, at);
      g->kids.push_back(body_until({"endgeneration"}));
      next();
      expect_block_end();
      has_generation = true;
      return g;
    }
    static const std::set<std::string> unsupported = {"macro", "call",    "filter", "include",  "import",
                                                      "from",  "extends", "block",  "with",     "autoescape",
                                                      "print", "do",      "trans",  "pluralize"};
    if (unsupported.count(n)) w_.fail(at, "unsupported statement '" + n + "'");
    w_.fail(at, "unknown statement '" + n + "'");
  }

  NodePtr for_stmt() {
    auto f = std::make_unique<Node>(K::For, cur().pos);
    next();
    f->targets = assign_names();
    if (!skip_name("in")) w_.fail(cur().pos, "expected 'in', found " + describe(cur()));
    f->kids.push_back(tuple_expr(false, false, {"recursive"}));
    NodePtr filter;
    if (skip_name("if")) filter = expression(true);
    if (is_name("recursive")) w_.fail(cur().pos, "unsupported: recursive for loops");
    expect_block_end();
    ++loop_depth_;
    f->kids.push_back(body_until({"endfor", "else"}));
    --loop_depth_;
    if (is_name("else")) {
      next();
      expect_block_end();
      f->kids.push_back(body_until({"endfor"}));
    } else {
      f->kids.push_back(std::make_unique<Node>(K::Body, cur().pos));
    }
    next();  // endfor
    expect_block_end();
    if (filter) {
      f->flag = true;
      f->kids.push_back(std::move(filter));
    }
    return f;
  }

  NodePtr if_stmt() {
    auto n = std::make_unique<Node>(K::If, cur().pos);
    next();
    while (true) {
      n->kids.push_back(tuple_expr(false, false, {}));
      expect_block_end();
      n->kids.push_back(body_until({"elif", "else", "endif"}));
      const std::string which = cur().text;
      next();
      if (which == "elif") continue;
      if (which == "else") {
        expect_block_end();
        n->kids.push_back(body_until({"endif"}));
        n->flag = true;
        next();
      }
      expect_block_end();
      return n;
    }
  }

  NodePtr set_stmt() {
    const std::size_t at = cur().pos;
    next();
    if (cur().t == T::Name && peek().t == T::Op && peek().text == ".") {  // set ns.attr = value
      auto n = std::make_unique<Node>(K::SetNs, at);
      n->name = cur().text;
      next();
      next();
      n->targets.push_back(expect_identifier("an attribute name"));
      expect_op("=");
      n->kids.push_back(tuple_expr(true, false, {}));
      expect_block_end();
      return n;
    }
    std::vector<std::string> names = assign_names();
    if (skip_op("=")) {
      auto n = std::make_unique<Node>(K::Set, at);
      n->targets = std::move(names);
      n->kids.push_back(tuple_expr(true, false, {}));
      expect_block_end();
      return n;
    }
    if (is_op("|")) w_.fail(cur().pos, "unsupported: filters on a {% set %} block");
    if (names.size() != 1) w_.fail(at, "a {% set %} block assigns one name");
    expect_block_end();
    auto n = std::make_unique<Node>(K::SetBlock, at);
    n->targets = std::move(names);
    n->kids.push_back(body_until({"endset"}));
    next();
    expect_block_end();
    return n;
  }

  /// `name` or `a, b` or `(a, b)`: jinja's assign target (names only; nested tuples refused).
  std::vector<std::string> assign_names() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    while (true) {
      const std::size_t at = cur().pos;
      std::string n = expect_identifier("a name to assign");
      static const std::set<std::string> reserved = {"true", "false", "none", "True", "False", "None"};
      if (reserved.count(n)) w_.fail(at, "cannot assign to '" + n + "'");
      names.push_back(std::move(n));
      if (!skip_op(",")) break;
      if (cur().t != T::Name || is_name("in")) break;
    }
    if (paren) expect_op(")");
    return names;
  }

  // -- expressions (parser.py's precedence, lowest first)
  bool tuple_end(const std::vector<std::string>& extra) const {
    const Token& t = cur();
    if (t.t == T::VarEnd || t.t == T::BlockEnd || t.t == T::Eof) return true;
    if (t.t == T::Op && t.text == ")") return true;
    if (t.t == T::Name) return std::find(extra.begin(), extra.end(), t.text) != extra.end();
    return false;
  }

  NodePtr tuple_expr(bool with_condexpr, bool explicit_parens, const std::vector<std::string>& extra) {
    const std::size_t at = cur().pos;
    std::vector<NodePtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      items.push_back(expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) w_.fail(cur().pos, "expected an expression, found " + describe(cur()));
    }
    auto n = std::make_unique<Node>(K::TupleLit, at);
    n->kids = std::move(items);
    return n;
  }

  NodePtr expression(bool with_condexpr = true) {
    Depth depth(*this, cur().pos);
    return with_condexpr ? cond_expr() : or_expr();
  }

  NodePtr cond_expr() {
    NodePtr e = or_expr();
    while (is_name("if")) {
      const std::size_t at = cur().pos;
      next();
      auto c = std::make_unique<Node>(K::Cond, at);
      c->kids.push_back(std::move(e));
      c->kids.push_back(or_expr());
      c->kids.push_back(skip_name("else") ? cond_expr() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  NodePtr binary(K k, NodePtr a, NodePtr b, std::size_t at, std::string op = {}) {
    auto n = std::make_unique<Node>(k, at);
    n->name = std::move(op);
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }

  NodePtr or_expr() {
    NodePtr e = and_expr();
    while (is_name("or")) {
      const std::size_t at = cur().pos;
      next();
      e = binary(K::Or, std::move(e), and_expr(), at);
    }
    return e;
  }
  NodePtr and_expr() {
    NodePtr e = not_expr();
    while (is_name("and")) {
      const std::size_t at = cur().pos;
      next();
      e = binary(K::And, std::move(e), not_expr(), at);
    }
    return e;
  }
  NodePtr not_expr() {
    if (is_name("not")) {
      Depth depth(*this, cur().pos);
      auto n = std::make_unique<Node>(K::Not, cur().pos);
      next();
      n->kids.push_back(not_expr());
      return n;
    }
    return compare_expr();
  }
  NodePtr compare_expr() {
    const std::size_t at = cur().pos;
    NodePtr first = math1();
    std::unique_ptr<Node> cmp;
    while (true) {
      std::string op;
      if (cur().t == T::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
                               cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().t == T::Name && peek().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = std::make_unique<Node>(K::Compare, at);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  NodePtr math1() {
    NodePtr e = concat();
    while (is_op("+") || is_op("-")) {
      const std::size_t at = cur().pos;
      const std::string op = cur().text;
      next();
      e = binary(K::BinOp, std::move(e), concat(), at, op);
    }
    return e;
  }
  NodePtr concat() {
    const std::size_t at = cur().pos;
    NodePtr e = math2();
    if (!is_op("~")) return e;
    auto c = std::make_unique<Node>(K::Concat, at);
    c->kids.push_back(std::move(e));
    while (skip_op("~")) c->kids.push_back(math2());
    return c;
  }
  NodePtr math2() {
    NodePtr e = pow_expr();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::size_t at = cur().pos;
      const std::string op = cur().text;
      next();
      e = binary(K::BinOp, std::move(e), pow_expr(), at, op);
    }
    return e;
  }
  NodePtr pow_expr() {
    NodePtr e = unary(true);
    while (is_op("**")) {
      const std::size_t at = cur().pos;
      next();
      e = binary(K::BinOp, std::move(e), unary(true), at, "**");
    }
    return e;
  }
  NodePtr unary(bool with_filter) {
    Depth depth(*this, cur().pos);
    NodePtr node;
    if (is_op("-") || is_op("+")) {
      auto n = std::make_unique<Node>(is_op("-") ? K::Neg : K::Pos, cur().pos);
      next();
      n->kids.push_back(unary(false));
      node = std::move(n);
    } else {
      node = primary();
    }
    node = postfix(std::move(node));
    if (with_filter) node = filter_expr(std::move(node));
    return node;
  }

  NodePtr primary() {
    const Token& t = cur();
    const std::size_t at = t.pos;
    if (t.t == T::Name) {
      auto n = std::make_unique<Node>(K::Const, at);
      if (t.text == "true" || t.text == "True") n->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False")
        n->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None")
        n->value = Value::none();
      else {
        n->k = K::Name;
        n->name = t.text;
      }
      next();
      return n;
    }
    if (t.t == T::String) {  // adjacent literals concatenate
      std::string s;
      while (cur().t == T::String) {
        s += cur().text;
        next();
      }
      auto n = std::make_unique<Node>(K::Const, at);
      n->value = Value::string(std::move(s));
      return n;
    }
    if (t.t == T::Int || t.t == T::Float) {
      auto n = std::make_unique<Node>(K::Const, at);
      n->value = t.value;
      next();
      return n;
    }
    if (is_op("(")) {
      next();
      NodePtr e = tuple_expr(true, true, {});
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto n = std::make_unique<Node>(K::ListLit, at);
      while (!is_op("]")) {
        if (!n->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        n->kids.push_back(expression());
      }
      expect_op("]");
      return n;
    }
    if (is_op("{")) {
      next();
      auto n = std::make_unique<Node>(K::DictLit, at);
      while (!is_op("}")) {
        if (!n->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        n->kids.push_back(expression());
        expect_op(":");
        n->kids.push_back(expression());
      }
      expect_op("}");
      return n;
    }
    w_.fail(at, "unexpected " + describe(t));
  }

  NodePtr postfix(NodePtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) node = subscript(std::move(node));
      else if (is_op("("))
        node = call(std::move(node));
      else
        return node;
    }
  }

  NodePtr subscript(NodePtr obj) {
    const std::size_t at = cur().pos;
    if (skip_op(".")) {
      if (cur().t == T::Name) {
        auto n = std::make_unique<Node>(K::GetAttr, at);
        n->name = cur().text;
        n->kids.push_back(std::move(obj));
        next();
        return n;
      }
      if (cur().t == T::Int) {
        auto n = std::make_unique<Node>(K::GetItem, at);
        n->kids.push_back(std::move(obj));
        auto c = std::make_unique<Node>(K::Const, cur().pos);
        c->value = cur().value;
        n->kids.push_back(std::move(c));
        next();
        return n;
      }
      w_.fail(cur().pos, "expected a name after '.', found " + describe(cur()));
    }
    expect_op("[");
    // One subscript or a slice; a[b, c] (a tuple index) is refused.
    std::vector<NodePtr> parts(3);
    bool slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++part > 2) w_.fail(cur().pos, "a slice has at most three parts");
        continue;
      }
      if (is_op(",")) w_.fail(cur().pos, "unsupported: a tuple subscript");
      if (parts[std::size_t(part)]) w_.fail(cur().pos, "expected ':' or ']', found " + describe(cur()));
      parts[std::size_t(part)] = expression();
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) w_.fail(at, "an empty subscript");
      auto n = std::make_unique<Node>(K::GetItem, at);
      n->kids.push_back(std::move(obj));
      n->kids.push_back(std::move(parts[0]));
      return n;
    }
    auto n = std::make_unique<Node>(K::Slice, at);
    n->kids.push_back(std::move(obj));
    for (auto& p : parts) n->kids.push_back(std::move(p));
    return n;
  }

  /// `(a, b, name=c)`: positional arguments, then keyword ones (*args and **kwargs refused).
  void parse_args(Node& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) w_.fail(cur().pos, "unsupported: *args and **kwargs in a call");
      if (cur().t == T::Name && peek().t == T::Op && peek().text == "=") {
        n.kw.push_back(cur().text);
        next();
        next();
        n.kids.push_back(expression());
      } else {
        if (!n.kw.empty()) w_.fail(cur().pos, "a positional argument after a keyword argument");
        n.kids.push_back(expression());
      }
    }
    expect_op(")");
  }

  NodePtr call(NodePtr callee) {
    auto n = std::make_unique<Node>(K::Call, cur().pos);
    n->kids.push_back(std::move(callee));
    parse_args(*n);
    return n;
  }

  NodePtr filter_expr(NodePtr node) {
    while (true) {
      if (is_op("|")) {
        next();
        const std::size_t at = cur().pos;
        std::string name = expect_identifier("a filter name");
        if (is_op(".")) w_.fail(cur().pos, "unsupported: dotted filter names");
        if (jinja_only_filters().count(name)) w_.fail(at, "unsupported filter '" + name + "'");
        if (!known_filters().count(name)) w_.fail(at, "no filter named '" + name + "'");
        auto f = std::make_unique<Node>(K::Filter, at);
        f->name = std::move(name);
        f->kids.push_back(std::move(node));
        if (is_op("(")) parse_args(*f);
        node = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = std::make_unique<Node>(K::Test, cur().pos);
        t->flag = skip_name("not");
        const std::size_t at = cur().pos;
        std::string name;
        if (cur().t == T::Name) name = cur().text;
        else if (cur().t == T::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
                                      cur().text == "<=" || cur().text == ">="))
          name = cur().text;
        else
          w_.fail(at, "expected a test name, found " + describe(cur()));
        next();
        if (is_op(".")) w_.fail(cur().pos, "unsupported: dotted test names");
        static const std::set<std::string> jinja_only = {"callable", "escaped", "filter", "test"};
        if (jinja_only.count(name)) w_.fail(at, "unsupported test '" + name + "'");
        if (!known_tests().count(name)) w_.fail(at, "no test named '" + name + "'");
        t->name = std::move(name);
        t->kids.push_back(std::move(node));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().t == T::Name || cur().t == T::String || cur().t == T::Int || cur().t == T::Float || is_op("(") ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) w_.fail(cur().pos, "You cannot chain multiple tests with is");
          t->kids.push_back(postfix(primary()));
        }
        node = std::move(t);
      } else if (is_op("(")) {
        node = call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  std::size_t p_ = 0;
  const Where& w_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

// ---- interpreter ---------------------------------------------------------------------------

struct LoopState {
  std::shared_ptr<List> items;
  std::size_t index0 = 0;
};

namespace {

enum class Flow { Normal, Break, Continue };

struct Frame {
  std::unordered_map<std::string, Value> vars;
  Frame* parent = nullptr;
  const Value* find(const std::string& n) const {
    for (const Frame* f = this; f; f = f->parent) {
      auto it = f->vars.find(n);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

const std::set<std::string>& dict_methods() {
  static const std::set<std::string> m = {"items",  "keys",       "values", "get",  "pop",     "popitem",
                                          "update", "setdefault", "clear",  "copy", "fromkeys"};
  return m;
}
const std::set<std::string>& str_methods() {
  static const std::set<std::string> m = {"strip",    "lstrip",     "rstrip",       "upper",        "lower",
                                          "title",    "capitalize", "startswith",   "endswith",     "split",
                                          "replace",  "join",       "format",       "find",         "rfind",
                                          "index",    "count",      "splitlines",   "isdigit",      "isalpha",
                                          "isspace",  "islower",    "isupper",      "center",       "ljust",
                                          "rjust",    "zfill",      "encode",       "partition",    "rsplit",
                                          "swapcase", "casefold",   "removeprefix", "removesuffix", "expandtabs",
                                          "isalnum",  "isnumeric",  "istitle"};
  return m;
}
const std::set<std::string>& list_methods() {
  static const std::set<std::string> m = {"append", "extend",  "insert", "pop",   "remove", "clear",
                                          "sort",   "reverse", "copy",   "index", "count"};
  return m;
}

/// Arguments of a filter, test, method or global: positional then keyword, bound to names.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Renderer {
 public:
  Renderer(const Where& w, const Limits& limits, std::vector<GenerationSpan>* generation)
      : w_(w), limits_(limits), generation_(generation) {}

  std::string out;
  std::size_t current_pos = 0;  // the statement being executed (for errors without a node)

  Flow exec(const Node& body, Frame& f) {
    for (const auto& s : body.kids) {
      const Flow flow = stmt(*s, f);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  [[noreturn]] void fail(const Node& n, const std::string& m) const { w_.fail(n.pos, m); }

  void emit(const std::string& s, const Node& n) {
    if (out.size() + s.size() > limits_.max_output_bytes)
      fail(n, "the output passes the limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
    out += s;
  }
  void count_iteration(const Node& n, std::size_t k = 1) {
    iterations_ += k;
    if (iterations_ > limits_.max_iterations)
      fail(n, "more than " + std::to_string(limits_.max_iterations) + " loop iterations in one render");
  }
  /// Building or copying a string of `bytes` costs one iteration per 64 bytes.
  void count_copy(const Node& n, std::size_t bytes) { count_iteration(n, bytes / 64); }
  void check_size(const Node& n, std::size_t bytes) const {
    if (bytes > limits_.max_output_bytes)
      fail(n, "a value passes the output limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
  }

  [[noreturn]] void undefined_error(const Node& n, const Value& v) const {
    fail(n, v.s ? *v.s : std::string("undefined value"));
  }

  Flow stmt(const Node& s, Frame& f) {
    current_pos = s.pos;
    switch (s.k) {
      case K::Data: emit(s.name, s); return Flow::Normal;
      case K::Print: {
        const Value v = eval(*s.kids[0], f);
        emit(str_of(v, *s.kids[0]), s);
        return Flow::Normal;
      }
      case K::If: {
        const std::size_t n_conds = (s.kids.size() - (s.flag ? 1 : 0)) / 2;
        for (std::size_t k = 0; k < n_conds; ++k)
          if (truthy(eval(*s.kids[2 * k], f))) return exec(*s.kids[2 * k + 1], f);
        if (s.flag) return exec(*s.kids.back(), f);
        return Flow::Normal;
      }
      case K::For: return for_loop(s, f);
      case K::Set: {
        Value v = eval(*s.kids[0], f);
        assign(s, s.targets, std::move(v), f);
        return Flow::Normal;
      }
      case K::SetNs: {
        const Value* ns = f.find(s.name);
        if (!ns || ns->kind != Value::Kind::Namespace)
          fail(s, "cannot assign attribute on non-namespace object '" + s.name + "'");
        if (!s.targets[0].empty() && s.targets[0][0] == '_')
          fail(s, "Chat templates cannot store underscore-prefixed attributes on a namespace");
        Value v = eval(*s.kids[0], f);
        ns->dict->set(Value::string(s.targets[0]), std::move(v));
        return Flow::Normal;
      }
      case K::SetBlock: {
        std::string saved;
        saved.swap(out);
        ++capturing_;
        const Flow flow = exec(*s.kids[0], f);
        --capturing_;
        std::string captured;
        captured.swap(out);
        out.swap(saved);
        f.vars[s.targets[0]] = Value::string(std::move(captured));
        return flow;
      }
      case K::Break: return Flow::Break;
      case K::Continue: return Flow::Continue;
      case K::Generation: {
        if (capturing_) fail(s, "unsupported: {% generation %} inside a {% set %} block");
        const std::size_t begin = out.size();
        const Flow flow = exec(*s.kids[0], f);
        if (generation_) generation_->push_back({begin, out.size()});
        return flow;
      }
      default: fail(s, "internal error: not a statement");
    }
  }

  std::string str_of(const Value& v, const Node& at) const {
    try {
      return to_str(v);
    } catch (const std::invalid_argument& e) {
      fail(at, e.what());
    }
  }

  std::vector<Value> unpack(const Node& at, const Value& v, std::size_t n) {
    List items = iterate(at, v);
    if (items.size() != n)
      fail(at, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(n) + " names");
    return items;
  }

  void assign(const Node& at, const std::vector<std::string>& names, Value v, Frame& f) {
    if (names.size() == 1) {
      f.vars[names[0]] = std::move(v);
      return;
    }
    auto items = unpack(at, v, names.size());
    for (std::size_t k = 0; k < names.size(); ++k) f.vars[names[k]] = std::move(items[k]);
  }

  /// What `for x in v` visits: list/tuple items, dict keys, string characters; Undefined is
  /// empty (jinja's Undefined iterates as nothing).
  List iterate(const Node& at, const Value& v) {
    // Copying a sequence is work: charge it to the iteration budget.
    if (v.list) count_iteration(at, v.list->size());
    if (v.dict) count_iteration(at, v.dict->items.size());
    if (v.kind == Value::Kind::String) count_copy(at, v.s->size());
    switch (v.kind) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::List:
      case Value::Kind::Tuple:
      case Value::Kind::View: return *v.list;
      case Value::Kind::Iterator: {  // a generator: what is left of it, once
        if (v.iter->poisoned) fail(at, "unsupported: reusing a generator a loop broke out of");
        List rest(v.list->begin() + std::ptrdiff_t(std::min(v.iter->pos, v.list->size())), v.list->end());
        v.iter->pos = v.list->size();
        return rest;
      }
      case Value::Kind::Dict: {
        List keys;
        for (const auto& kv : v.dict->items) keys.push_back(kv.first);
        return keys;
      }
      case Value::Kind::String: {
        List chars;
        for (char32_t c : detail::decode_utf8(v.str())) {
          std::string s;
          detail::append_utf8(s, c);
          chars.push_back(Value::string(std::move(s)));
        }
        return chars;
      }
      default: fail(at, std::string("'") + detail::type_name(v) + "' object is not iterable");
    }
  }

  Flow for_loop(const Node& s, Frame& f) {
    const Value seq = eval(*s.kids[0], f);
    List items = iterate(*s.kids[0], seq);
    if (s.flag) {  // `for x in xs if cond`: the loop (and loop.index) sees the kept items only
      List kept;
      for (auto& item : items) {
        count_iteration(s);
        Frame probe;
        probe.parent = &f;
        assign(s, s.targets, item, probe);
        if (truthy(eval(*s.kids[3], probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Frame inner;
      inner.parent = &f;
      exec(*s.kids[2], inner);
      return Flow::Normal;
    }
    auto state = std::make_shared<LoopState>();
    state->items = std::make_shared<List>(std::move(items));
    Value loop;
    loop.kind = Value::Kind::Loop;
    loop.loop = state;
    for (std::size_t k = 0; k < state->items->size(); ++k) {
      count_iteration(s);
      state->index0 = k;
      Frame inner;  // a fresh scope per iteration, as jinja's loop bodies have
      inner.parent = &f;
      inner.vars["loop"] = loop;
      assign(s, s.targets, (*state->items)[k], inner);
      const Flow flow = exec(*s.kids[1], inner);
      if (flow == Flow::Break) {
        if (seq.kind == Value::Kind::Iterator) seq.iter->poisoned = true;
        break;
      }
    }
    return Flow::Normal;
  }

  // -- expressions
  Value eval(const Node& n, Frame& f) {
    switch (n.k) {
      case K::Const: return n.value;
      case K::Name: {
        if (const Value* v = f.find(n.name)) return *v;
        return Value::undefined("'" + n.name + "' is undefined");
      }
      case K::ListLit:
      case K::TupleLit: {
        List items;
        for (const auto& k : n.kids) items.push_back(eval(*k, f));
        return Value::make_list(std::move(items), n.k == K::TupleLit);
      }
      case K::DictLit: {
        Dict d;
        for (std::size_t k = 0; k < n.kids.size(); k += 2) {
          Value key = eval(*n.kids[k], f);
          if (!hashable(key) || key.is_undefined())
            fail(*n.kids[k], std::string("unhashable type: '") + detail::type_name(key) + "'");
          d.set(std::move(key), eval(*n.kids[k + 1], f));
        }
        return Value::make_dict(std::move(d));
      }
      case K::GetAttr: return get_attr(n, eval(*n.kids[0], f), n.name);
      case K::GetItem: return get_item(n, eval(*n.kids[0], f), eval(*n.kids[1], f));
      case K::Slice: return slice(n, f);
      case K::Call: return call(n, f);
      case K::Filter: return filter(n, f);
      case K::Test: {
        const bool r = test(n, f);
        return Value::boolean(n.flag ? !r : r);
      }
      case K::Neg:
      case K::Pos: {
        const Value v = eval(*n.kids[0], f);
        if (v.is_undefined()) undefined_error(n, v);
        if (!detail::is_number(v))
          fail(n, std::string("bad operand type for unary ") + (n.k == K::Neg ? "-" : "+") + ": '" + detail::type_name(v) +
                      "'");
        if (n.k == K::Pos) return v.kind == Value::Kind::Bool ? Value::integer(v.b) : v;
        if (v.kind == Value::Kind::Float) return Value::floating(-v.f);
        const std::int64_t i = v.kind == Value::Kind::Int ? v.i : v.b;
        if (i == INT64_MIN) overflow(n);
        return Value::integer(-i);
      }
      case K::Not: return Value::boolean(!truthy(eval(*n.kids[0], f)));
      case K::And: {
        Value a = eval(*n.kids[0], f);
        return truthy(a) ? eval(*n.kids[1], f) : a;
      }
      case K::Or: {
        Value a = eval(*n.kids[0], f);
        return truthy(a) ? a : eval(*n.kids[1], f);
      }
      case K::BinOp: return binop(n, eval(*n.kids[0], f), eval(*n.kids[1], f));
      case K::Compare: {
        Value left = eval(*n.kids[0], f);
        for (std::size_t k = 0; k < n.ops.size(); ++k) {
          Value right = eval(*n.kids[k + 1], f);
          if (!compare_op(*n.kids[k + 1], n.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case K::Concat: {
        std::string s;
        for (const auto& k : n.kids) {
          s += str_of(eval(*k, f), *k);
          check_size(n, s.size());
        }
        count_copy(n, s.size());
        return Value::string(std::move(s));
      }
      case K::Cond: {
        if (truthy(eval(*n.kids[1], f))) return eval(*n.kids[0], f);
        if (n.kids[2]) return eval(*n.kids[2], f);
        return Value::undefined("the inline if expression evaluated to false and no else section was defined");
      }
      default: fail(n, "internal error: not an expression");
    }
  }

  [[noreturn]] void overflow(const Node& n) const {
    fail(n, "integer overflow (the engine's integers are 64-bit; Python's are unbounded)");
  }

  Value loop_attr(const Node& n, const LoopState& l, const std::string& name) const {
    const std::int64_t len = std::int64_t(l.items->size()), i = std::int64_t(l.index0);
    if (name == "index0") return Value::integer(i);
    if (name == "index") return Value::integer(i + 1);
    if (name == "revindex") return Value::integer(len - i);
    if (name == "revindex0") return Value::integer(len - i - 1);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i == len - 1);
    if (name == "length") return Value::integer(len);
    if (name == "depth") return Value::integer(1);
    if (name == "depth0") return Value::integer(0);
    if (name == "previtem") return i > 0 ? (*l.items)[std::size_t(i - 1)] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < len ? (*l.items)[std::size_t(i + 1)] : Value::undefined("there is no next item");
    if (name == "cycle" || name == "changed") fail(n, "loop." + name + " used as a value is not supported");
    return Value::undefined("'LoopContext' object has no attribute '" + name + "'");
  }

  Value get_attr(const Node& n, const Value& obj, const std::string& name) {
    switch (obj.kind) {
      case Value::Kind::Undefined: undefined_error(n, obj);
      case Value::Kind::Dict:
        // jinja's getattr tries Python attributes first: `d.items` is the method, not d['items'].
        if (dict_methods().count(name)) fail(n, "the dict method '" + name + "' used as a value is not supported");
        if (const Value* v = obj.dict->find(Value::string(name))) return *v;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      case Value::Kind::Namespace:
        if (const Value* v = obj.dict->find(Value::string(name))) return *v;
        return Value::undefined("'Namespace' object has no attribute '" + name + "'");
      case Value::Kind::Loop: return loop_attr(n, *obj.loop, name);
      case Value::Kind::String:
        if (str_methods().count(name)) fail(n, "the str method '" + name + "' used as a value is not supported");
        break;
      case Value::Kind::List:
      case Value::Kind::Tuple:
        if (list_methods().count(name)) fail(n, "the list method '" + name + "' used as a value is not supported");
        break;
      case Value::Kind::Iterator:
      case Value::Kind::View: fail(n, std::string("unsupported: an attribute of a ") + detail::type_name(obj));
      default: break;
    }
    if (!name.empty() && name[0] == '_') fail(n, "unsupported: underscore attributes ('" + name + "')");
    return Value::undefined(std::string("'") + detail::type_name(obj) + " object' has no attribute '" + name + "'");
  }

  /// Python's hash() succeeds: not a list, dict or dict view; a tuple of hashable items.
  static bool hashable(const Value& v) {
    switch (v.kind) {
      case Value::Kind::List:
      case Value::Kind::Dict: return false;
      case Value::Kind::View: return v.s->rfind("range(", 0) == 0;
      case Value::Kind::Tuple:
        for (const auto& e : *v.list)
          if (!hashable(e)) return false;
        return true;
      default: return true;
    }
  }

  static bool as_index(const Value& v, std::int64_t& i) {
    if (v.kind == Value::Kind::Int) i = v.i;
    else if (v.kind == Value::Kind::Bool)
      i = v.b;
    else
      return false;
    return true;
  }

  Value get_item(const Node& n, const Value& obj, const Value& key) {
    std::int64_t i = 0;
    switch (obj.kind) {
      case Value::Kind::Undefined: undefined_error(n, obj);
      case Value::Kind::Iterator:
      case Value::Kind::View:
        fail(n, std::string("unsupported: a subscript of a ") + detail::type_name(obj) + " (use |list first)");
      case Value::Kind::Dict:
        if (!hashable(key)) return Value::undefined("unhashable subscript");  // jinja: TypeError -> undefined
        if (const Value* v = obj.dict->find(key)) return *v;
        break;
      case Value::Kind::Namespace:
      case Value::Kind::Loop:
        if (key.is_string()) return get_attr(n, obj, key.str());
        break;
      case Value::Kind::List:
      case Value::Kind::Tuple:
        if (as_index(key, i)) {
          const std::int64_t len = std::int64_t(obj.list->size());
          if (i < 0) i += len;
          if (i >= 0 && i < len) return (*obj.list)[std::size_t(i)];
          return Value::undefined(std::string("'") + detail::type_name(obj) + " object' has no element " +
                                  std::to_string(i));
        }
        break;
      case Value::Kind::String:
        if (as_index(key, i)) {
          const std::u32string cs = detail::decode_utf8(obj.str());
          const std::int64_t len = std::int64_t(cs.size());
          if (i < 0) i += len;
          if (i >= 0 && i < len) {
            std::string s;
            detail::append_utf8(s, cs[std::size_t(i)]);
            return Value::string(std::move(s));
          }
          return Value::undefined("'str object' has no element " + std::to_string(i));
        }
        break;
      default: break;
    }
    // jinja's getitem falls back to getattr for string keys.
    if (key.is_string() && obj.kind != Value::Kind::Namespace && obj.kind != Value::Kind::Loop) {
      if (obj.kind == Value::Kind::Dict && dict_methods().count(key.str()))
        fail(n, "the dict method '" + key.str() + "' used as a value is not supported");
      return get_attr(n, obj, key.str());
    }
    return Value::undefined(std::string("'") + detail::type_name(obj) + " object' has no element " + to_repr(key));
  }

  Value slice(const Node& n, Frame& f) {
    const Value obj = eval(*n.kids[0], f);
    if (obj.is_undefined()) undefined_error(n, obj);
    if (obj.kind == Value::Kind::Iterator || obj.kind == Value::Kind::View)
      fail(n, std::string("unsupported: slicing a ") + detail::type_name(obj) + " (use |list first)");
    std::optional<std::int64_t> parts[3];
    for (int k = 0; k < 3; ++k) {
      if (!n.kids[std::size_t(k) + 1]) continue;
      const Value v = eval(*n.kids[std::size_t(k) + 1], f);
      if (v.kind == Value::Kind::None) continue;
      std::int64_t i;
      if (!as_index(v, i)) fail(*n.kids[std::size_t(k) + 1], "slice indices must be integers or None");
      parts[k] = i;
    }
    const std::int64_t step = parts[2].value_or(1);
    if (step == 0) fail(n, "slice step cannot be zero");
    if (step == INT64_MIN) overflow(n);
    auto pick = [&](std::int64_t len, auto&& take) {  // Python's slice.indices
      std::int64_t start, stop;
      auto clamp = [&](std::optional<std::int64_t> v, std::int64_t dflt, std::int64_t lo, std::int64_t hi) {
        if (!v) return dflt;
        std::int64_t x = *v;
        if (x < 0) {
          x += len;
          if (x < lo) x = lo;
        } else if (x > hi) {
          x = hi;
        }
        return x;
      };
      if (step > 0) {
        start = clamp(parts[0], 0, 0, len);
        stop = clamp(parts[1], len, 0, len);
        for (std::int64_t k = start; k < stop; k += step) take(std::size_t(k));
      } else {
        start = clamp(parts[0], len - 1, -1, len - 1);
        stop = clamp(parts[1], -1, -1, len - 1);
        for (std::int64_t k = start; k > stop; k += step) take(std::size_t(k));
      }
    };
    if (obj.kind == Value::Kind::List || obj.kind == Value::Kind::Tuple) {
      List out;
      pick(std::int64_t(obj.list->size()), [&](std::size_t k) { out.push_back((*obj.list)[k]); });
      return Value::make_list(std::move(out), obj.kind == Value::Kind::Tuple);
    }
    if (obj.kind == Value::Kind::String) {
      const std::u32string cs = detail::decode_utf8(obj.str());
      std::u32string out;
      pick(std::int64_t(cs.size()), [&](std::size_t k) { out.push_back(cs[k]); });
      return Value::string(detail::encode_utf8(out));
    }
    return Value::undefined(std::string("'") + detail::type_name(obj) + " object' cannot be sliced");
  }

  // -- arguments
  Args args(const Node& n, Frame& f, std::size_t first) {
    Args a;
    const std::size_t n_kw = n.kw.size();
    for (std::size_t k = first; k < n.kids.size() - n_kw; ++k) a.pos.push_back(eval(*n.kids[k], f));
    for (std::size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(n.kw[k], eval(*n.kids[n.kids.size() - n_kw + k], f));
    return a;
  }
  /// Binds `a` to parameter names; a missing one is nullopt. Extra or unknown arguments fail.
  std::vector<std::optional<Value>> bind(const Node& n, const std::string& what, const Args& a,
                                         const std::vector<std::string>& params) const {
    std::vector<std::optional<Value>> out(params.size());
    if (a.pos.size() > params.size())
      fail(n, what + " takes at most " + std::to_string(params.size()) + " arguments, got " + std::to_string(a.pos.size()));
    for (std::size_t k = 0; k < a.pos.size(); ++k) out[k] = a.pos[k];
    for (const auto& [name, v] : a.kw) {
      auto it = std::find(params.begin(), params.end(), name);
      if (it == params.end()) fail(n, what + " got an unexpected keyword argument '" + name + "'");
      auto& slot = out[std::size_t(it - params.begin())];
      if (slot) fail(n, what + " got multiple values for argument '" + name + "'");
      slot = v;
    }
    return out;
  }
  std::string want_str(const Node& n, const std::string& what, const Value& v) const {
    if (!v.is_string()) fail(n, what + " must be a str, not " + detail::type_name(v));
    return v.str();
  }
  std::int64_t want_int(const Node& n, const std::string& what, const Value& v) const {
    std::int64_t i;
    if (!as_index(v, i)) fail(n, what + " must be an int, not " + detail::type_name(v));
    return i;
  }

  // -- calls: globals and methods
  Value call(const Node& n, Frame& f) {
    const Node& callee = *n.kids[0];
    if (callee.k == K::GetAttr) {
      const Value obj = eval(*callee.kids[0], f);
      if (obj.is_undefined()) undefined_error(callee, obj);
      return method(n, obj, callee.name, args(n, f, 1));
    }
    const Value fn = eval(callee, f);
    if (fn.is_undefined()) undefined_error(callee, fn);
    if (fn.kind != Value::Kind::Function) fail(n, std::string("'") + detail::type_name(fn) + "' object is not callable");
    const std::string& name = fn.str();
    Args a = args(n, f, 1);
    if (name == "raise_exception") {
      auto p = bind(n, "raise_exception()", a, {"message"});
      const std::string message = p[0] ? str_of(*p[0], n) : std::string();
      const auto [line, column] = w_.line_column(n.pos);
      throw TemplateRaised(*w_.label, line, column, message);
    }
    if (name == "strftime_now") {
      auto p = bind(n, "strftime_now()", a, {"format"});
      if (!p[0]) fail(n, "strftime_now() missing its format");
      const std::string fmt = want_str(n, "strftime_now()'s format", *p[0]);
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[512];
      const std::size_t len = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &local);
      if (!fmt.empty() && len == 0) fail(n, "strftime_now(): the format gives no text or more than 511 bytes");
      return Value::string(std::string(buf, len));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      if (a.pos.size() > 1) fail(n, name + "() takes at most one positional argument");
      if (a.pos.size() == 1) {
        if (a.pos[0].kind != Value::Kind::Dict) fail(n, name + "(): the positional argument must be a dict");
        d = *a.pos[0].dict;
      }
      for (auto& [k, v] : a.kw) d.set(Value::string(k), v);
      Value v = Value::make_dict(std::move(d));
      if (name == "namespace") {
        for (const auto& [k, e] : v.dict->items)
          if (k.is_string() && !k.str().empty() && k.str()[0] == '_')
            fail(n, "Chat templates cannot store underscore-prefixed attributes on a namespace");
        v.kind = Value::Kind::Namespace;
      }
      return v;
    }
    if (name == "range") {
      if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) fail(n, "range() takes 1 to 3 integer arguments");
      std::int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) {
        stop = want_int(n, "range()'s argument", a.pos[0]);
      } else {
        start = want_int(n, "range()'s start", a.pos[0]);
        stop = want_int(n, "range()'s stop", a.pos[1]);
        if (a.pos.size() == 3) step = want_int(n, "range()'s step", a.pos[2]);
      }
      if (step == 0) fail(n, "range() arg 3 must not be zero");
      const long double count = step > 0
                                    ? std::ceil((static_cast<long double>(stop) - start) / step)
                                    : std::ceil((static_cast<long double>(start) - stop) / -static_cast<long double>(step));
      if (count > 100000)  // jinja's sandbox: MAX_RANGE
        fail(n, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      List out;
      if (count > 0) {
        count_iteration(n, std::size_t(count));
        for (std::int64_t k = 0, v = start; k < std::int64_t(count); ++k, v += step) out.push_back(Value::integer(v));
      }
      // A range object: printed as range(start, stop[, step]).
      std::string repr = "range(" + std::to_string(start) + ", " + std::to_string(stop) +
                         (step != 1 ? ", " + std::to_string(step) : "") + ")";
      return Value::make_view(std::move(out), std::move(repr));
    }
    fail(n, "unsupported function '" + name + "'");
  }

  Value method(const Node& n, const Value& obj, const std::string& name, const Args& a) {
    const std::string what = std::string(detail::type_name(obj)) + "." + name + "()";
    if (obj.kind == Value::Kind::String) {
      const std::string& s = obj.str();
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        auto p = bind(n, what, a, {"chars"});
        std::optional<std::string> chars;
        if (p[0] && p[0]->kind != Value::Kind::None) chars = want_str(n, what + "'s chars", *p[0]);
        return Value::string(detail::py_strip(s, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
        bind(n, what, a, {});
        return Value::string(name == "upper"   ? detail::py_upper(s)
                             : name == "lower" ? detail::py_lower(s)
                             : name == "title" ? detail::py_title(s)
                                               : detail::py_capitalize(s));
      }
      if (name == "startswith" || name == "endswith") {
        auto p = bind(n, what, a, {"prefix"});
        if (!p[0]) fail(n, what + " needs an argument");
        std::vector<std::string> options;
        if (p[0]->kind == Value::Kind::Tuple) {
          for (const auto& e : *p[0]->list) options.push_back(want_str(n, what + "'s argument", e));
        } else {
          options.push_back(want_str(n, what + "'s argument", *p[0]));
        }
        for (const auto& o : options) {
          if (o.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split") {
        auto p = bind(n, what, a, {"sep", "maxsplit"});
        std::optional<std::string> sep;
        if (p[0] && p[0]->kind != Value::Kind::None) sep = want_str(n, what + "'s sep", *p[0]);
        const std::int64_t maxsplit = p[1] ? want_int(n, what + "'s maxsplit", *p[1]) : -1;
        if (sep && sep->empty()) fail(n, "empty separator");
        List out;
        for (auto& piece : detail::py_split(s, sep, maxsplit)) out.push_back(Value::string(std::move(piece)));
        return Value::make_list(std::move(out));
      }
      if (name == "replace") {
        auto p = bind(n, what, a, {"old", "new", "count"});
        if (!p[0] || !p[1]) fail(n, what + " needs old and new");
        const std::string r = detail::py_replace(s, want_str(n, what, *p[0]), want_str(n, what, *p[1]),
                                                 p[2] ? want_int(n, what + "'s count", *p[2]) : -1);
        check_size(n, r.size());
        return Value::string(r);
      }
      if (name == "join") {
        auto p = bind(n, what, a, {"iterable"});
        if (!p[0]) fail(n, what + " needs an iterable");
        std::string out;
        bool first = true;
        for (const auto& e : iterate(n, *p[0])) {
          if (!first) out += s;
          first = false;
          out += want_str(n, "sequence item of " + what, e);
          check_size(n, out.size());
        }
        return Value::string(std::move(out));
      }
    } else if (obj.kind == Value::Kind::Dict) {
      if (name == "items" || name == "keys" || name == "values") {
        bind(n, what, a, {});
        List out;
        for (const auto& [k, v] : obj.dict->items) {
          if (name == "items") out.push_back(Value::make_list({k, v}, true));
          else
            out.push_back(name == "keys" ? k : v);
        }
        return Value::make_view(std::move(out), "dict_" + name);
      }
      if (name == "get") {
        auto p = bind(n, what, a, {"key", "default"});
        if (!p[0]) fail(n, what + " needs a key");
        if (!hashable(*p[0])) fail(n, std::string("unhashable type: '") + detail::type_name(*p[0]) + "'");
        if (const Value* v = obj.dict->find(*p[0])) return *v;
        return p[1] ? *p[1] : Value::none();
      }
    } else if (obj.kind == Value::Kind::Loop && name == "cycle") {
      if (a.pos.empty()) fail(n, "no items for cycling given");
      return a.pos[obj.loop->index0 % a.pos.size()];
    }
    fail(n, "unsupported method " + what);
  }

  // -- operators
  Value binop(const Node& n, const Value& a, const Value& b) {
    const std::string& op = n.name;
    if (a.is_undefined()) undefined_error(n, a);
    if (b.is_undefined()) undefined_error(n, b);
    using VK = Value::Kind;
    const bool num = detail::is_number(a) && detail::is_number(b);
    const bool flt = num && (a.kind == VK::Float || b.kind == VK::Float);
    auto ival = [](const Value& v) { return v.kind == VK::Int ? v.i : std::int64_t(v.b); };
    auto type_error = [&]() {
      fail(n,
           "unsupported operand type(s) for " + op + ": '" + detail::type_name(a) + "' and '" + detail::type_name(b) + "'");
    };
    if (op == "+") {
      if (flt) return Value::floating(detail::as_double(a) + detail::as_double(b));
      if (num) {
        std::int64_t r;
        if (__builtin_add_overflow(ival(a), ival(b), &r)) overflow(n);
        return Value::integer(r);
      }
      if (a.kind == VK::String && b.kind == VK::String) {
        check_size(n, a.s->size() + b.s->size());
        count_copy(n, a.s->size() + b.s->size());
        return Value::string(*a.s + *b.s);
      }
      if ((a.kind == VK::List && b.kind == VK::List) || (a.kind == VK::Tuple && b.kind == VK::Tuple)) {
        count_iteration(n, a.list->size() + b.list->size());
        List out = *a.list;
        out.insert(out.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(out), a.kind == VK::Tuple);
      }
      if (a.kind == VK::String || b.kind == VK::String)
        fail(n, "can only concatenate str (not \"" + std::string(detail::type_name(a.kind == VK::String ? b : a)) +
                    "\") to str");
      type_error();
    }
    if (op == "-") {
      if (flt) return Value::floating(detail::as_double(a) - detail::as_double(b));
      if (num) {
        std::int64_t r;
        if (__builtin_sub_overflow(ival(a), ival(b), &r)) overflow(n);
        return Value::integer(r);
      }
      type_error();
    }
    if (op == "*") {
      if (flt) return Value::floating(detail::as_double(a) * detail::as_double(b));
      if (num) {
        std::int64_t r;
        if (__builtin_mul_overflow(ival(a), ival(b), &r)) overflow(n);
        return Value::integer(r);
      }
      const Value* seq = (a.kind == VK::String || a.kind == VK::List || a.kind == VK::Tuple) ? &a : &b;
      const Value* times = seq == &a ? &b : &a;
      if ((seq->kind == VK::String || seq->kind == VK::List || seq->kind == VK::Tuple) &&
          (times->kind == VK::Int || times->kind == VK::Bool)) {
        const std::int64_t k = std::max<std::int64_t>(0, ival(*times));
        if (seq->kind == VK::String) {
          if (k > 0 && seq->s->size() > limits_.max_output_bytes / std::size_t(k))
            check_size(n, limits_.max_output_bytes + 1);
          count_copy(n, seq->s->size() * std::size_t(k));
          std::string out;
          for (std::int64_t r = 0; r < k; ++r) out += *seq->s;
          return Value::string(std::move(out));
        }
        if (k > 0 && seq->list->size() > limits_.max_iterations / std::size_t(k)) fail(n, "a list repetition too large");
        count_iteration(n, seq->list->size() * std::size_t(k));
        List out;
        for (std::int64_t r = 0; r < k; ++r) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::make_list(std::move(out), seq->kind == VK::Tuple);
      }
      type_error();
    }
    if (op == "/") {
      if (!num) type_error();
      const double y = detail::as_double(b);
      if (y == 0) fail(n, "division by zero");
      return Value::floating(detail::as_double(a) / y);
    }
    if (op == "//" || op == "%") {
      if (a.kind == VK::String && op == "%") fail(n, "unsupported: printf-style string formatting ('%')");
      if (!num) type_error();
      if (flt) {
        const double x = detail::as_double(a), y = detail::as_double(b);
        if (y == 0) fail(n, "float division by zero");
        // CPython's float divmod: the remainder takes the divisor's sign.
        double m = std::fmod(x, y);
        double div = (x - m) / y;
        if (m != 0) {
          if ((y < 0) != (m < 0)) {
            m += y;
            div -= 1.0;
          }
        } else {
          m = std::copysign(0.0, y);
        }
        if (op == "%") return Value::floating(m);
        double floordiv = 0;
        if (div != 0) {
          floordiv = std::floor(div);
          if (div - floordiv > 0.5) floordiv += 1.0;
        } else {
          floordiv = std::copysign(0.0, x / y);
        }
        return Value::floating(floordiv);
      }
      const std::int64_t x = ival(a), y = ival(b);
      if (y == 0) fail(n, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) overflow(n);
      std::int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    if (op == "**") {
      if (!num) type_error();
      if (!flt && ival(b) >= 0) {
        std::int64_t base = ival(a), e = ival(b), r = 1;
        while (e > 0) {
          if (e & 1)
            if (__builtin_mul_overflow(r, base, &r)) overflow(n);
          e >>= 1;
          if (e && __builtin_mul_overflow(base, base, &base)) overflow(n);
        }
        return Value::integer(r);
      }
      const double x = detail::as_double(a), y = detail::as_double(b);
      if (x == 0 && y < 0) fail(n, "0.0 cannot be raised to a negative power");
      if (x < 0 && std::floor(y) != y) fail(n, "unsupported: a negative number to a fractional power (complex)");
      return Value::floating(std::pow(x, y));
    }
    fail(n, "unsupported operator " + op);
  }

  bool contains(const Node& n, const Value& needle, const Value& hay) {
    switch (hay.kind) {
      case Value::Kind::String:
        if (!needle.is_string())
          fail(n, std::string("'in <string>' requires string as left operand, not ") + detail::type_name(needle));
        return hay.s->find(*needle.s) != std::string::npos;
      case Value::Kind::List:
      case Value::Kind::Tuple:
      case Value::Kind::View:
        for (const auto& e : *hay.list)
          if (detail::equals(e, needle)) return true;
        return false;
      case Value::Kind::Iterator:  // consumes the generator up to the match, as Python does
        if (hay.iter->poisoned) fail(n, "unsupported: reusing a generator a loop broke out of");
        while (hay.iter->pos < hay.list->size())
          if (detail::equals((*hay.list)[hay.iter->pos++], needle)) return true;
        return false;
      case Value::Kind::Dict:
        if (!hashable(needle)) fail(n, std::string("unhashable type: '") + detail::type_name(needle) + "'");
        return hay.dict->find(needle) != nullptr;
      case Value::Kind::Undefined: return false;
      default: fail(n, std::string("argument of type '") + detail::type_name(hay) + "' is not iterable");
    }
  }

  bool compare_op(const Node& n, const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return detail::equals(a, b);
    if (op == "!=") return !detail::equals(a, b);
    if (op == "in") return contains(n, a, b);
    if (op == "notin") return !contains(n, a, b);
    if (a.is_undefined()) undefined_error(n, a);
    if (b.is_undefined()) undefined_error(n, b);
    const auto c = detail::compare(a, b);
    if (!c)
      fail(n, "'" + op + "' not supported between instances of '" + detail::type_name(a) + "' and '" + detail::type_name(b) +
                  "'");
    if (op == "<") return *c < 0;
    if (op == ">") return *c > 0;
    if (op == "<=") return *c <= 0;
    return *c >= 0;
  }

  // -- tests
  bool run_test(const Node& n, const std::string& name, const Value& v, const std::vector<Value>& a) {
    using VK = Value::Kind;
    auto arg = [&]() -> const Value& {
      if (a.empty()) fail(n, "the test '" + name + "' needs an argument");
      return a[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind == VK::None;
    if (name == "boolean") return v.kind == VK::Bool;
    if (name == "false") return v.kind == VK::Bool && !v.b;
    if (name == "true") return v.kind == VK::Bool && v.b;
    if (name == "integer") return v.kind == VK::Int;
    if (name == "float") return v.kind == VK::Float;
    if (name == "number") return detail::is_number(v);
    if (name == "string") return v.kind == VK::String;
    if (name == "mapping") return v.kind == VK::Dict;
    if (name == "iterable")
      return v.kind == VK::String || v.kind == VK::List || v.kind == VK::Tuple || v.kind == VK::Dict ||
             v.kind == VK::Undefined || v.kind == VK::Iterator || v.kind == VK::View;
    if (name == "sequence")  // len() and [] (a dict qualifies; a generator and dict views do not; a range does)
      return v.kind == VK::String || v.kind == VK::List || v.kind == VK::Tuple || v.kind == VK::Dict ||
             (v.kind == VK::View && v.s->rfind("range(", 0) == 0);
    if (name == "lower" || name == "upper") {  // str.islower() / isupper(): a cased character, none of the other case
      const std::string s = str_of(v, n);
      return detail::has_cased(s) && (name == "lower" ? detail::py_lower(s) == s : detail::py_upper(s) == s);
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.is_undefined()) undefined_error(n, v);
      if (v.kind != VK::Int && v.kind != VK::Bool) fail(n, "the test '" + name + "' needs an integer");
      const std::int64_t x = v.kind == VK::Int ? v.i : v.b;
      if (name == "divisibleby") {
        const std::int64_t d = want_int(n, "divisibleby's argument", arg());
        if (d == 0) fail(n, "integer division or modulo by zero");
        return d == -1 || x % d == 0;
      }
      return (((x % 2) + 2) % 2 == 1) == (name == "odd");
    }
    if (name == "eq" || name == "equalto" || name == "==") return detail::equals(v, arg());
    if (name == "ne" || name == "!=") return !detail::equals(v, arg());
    if (name == "sameas") {
      const Value& o = arg();
      if (v.kind != o.kind) return false;
      if (v.kind == VK::None || v.kind == VK::Undefined) return v.kind == VK::None;
      if (v.kind == VK::Bool) return v.b == o.b;
      if (v.kind == VK::List || v.kind == VK::Tuple) return v.list == o.list;
      if (v.kind == VK::Dict || v.kind == VK::Namespace) return v.dict == o.dict;
      fail(n, "unsupported: 'sameas' on " + std::string(detail::type_name(v)) + " (Python object identity)");
    }
    if (name == "in") return contains(n, v, arg());
    static const std::map<std::string, std::string> ordering = {{"lt", "<"},          {"lessthan", "<"}, {"<", "<"},
                                                                {"le", "<="},         {"<=", "<="},      {"gt", ">"},
                                                                {"greaterthan", ">"}, {">", ">"},        {"ge", ">="},
                                                                {">=", ">="}};
    auto it = ordering.find(name);
    if (it != ordering.end()) return compare_op(n, it->second, v, arg());
    fail(n, "unsupported test '" + name + "'");
  }

  bool test(const Node& n, Frame& f) {
    const Value v = eval(*n.kids[0], f);
    Args a = args(n, f, 1);
    if (!a.kw.empty()) fail(n, "keyword arguments to a test are not supported");
    return run_test(n, n.name, v, a.pos);
  }

  // -- filters
  Value attribute_of(const Node& n, const Value& item, const std::string& path) {
    // jinja's make_attrgetter: dotted path, each part an integer index or a getitem.
    Value cur = item;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      Value key = Value::string(part);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
        key = Value::integer(std::stoll(part));
      cur = get_item(n, cur, key);
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  Value apply_filter(const Node& n, const std::string& name, const Value& v, const Args& a) {
    using VK = Value::Kind;
    const std::string what = "the filter '" + name + "'";
    auto need_defined = [&](const Value& x) {
      if (x.is_undefined()) undefined_error(n, x);
    };
    if (name == "trim") {
      auto p = bind(n, what, a, {"chars"});
      std::optional<std::string> chars;
      if (p[0] && p[0]->kind != VK::None) chars = want_str(n, what + "'s chars", *p[0]);
      return Value::string(detail::py_strip(str_of(v, n), chars, true, true));
    }
    if (name == "length" || name == "count") {
      bind(n, what, a, {});
      switch (v.kind) {
        case VK::Undefined: return Value::integer(0);
        case VK::String: return Value::integer(std::int64_t(detail::code_point_count(v.str())));
        case VK::List:
        case VK::Tuple:
        case VK::View: return Value::integer(std::int64_t(v.list->size()));
        case VK::Dict:
        case VK::Namespace: return Value::integer(std::int64_t(v.dict->items.size()));
        case VK::Loop: return Value::integer(std::int64_t(v.loop->items->size()));
        default: fail(n, std::string("object of type '") + detail::type_name(v) + "' has no len()");
      }
    }
    if (name == "tojson") {
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      auto p = bind(n, what, a, {"ensure_ascii", "indent", "separators", "sort_keys"});
      detail::JsonOptions o;
      if (p[0]) o.ensure_ascii = truthy(*p[0]);
      if (p[1] && p[1]->kind != VK::None) {
        o.has_indent = true;
        if (p[1]->kind == VK::String) o.indent = p[1]->str();
        else
          o.indent = std::string(std::size_t(std::max<std::int64_t>(0, want_int(n, "tojson's indent", *p[1]))), ' ');
      }
      if (p[2] && p[2]->kind != VK::None) {
        if ((p[2]->kind != VK::List && p[2]->kind != VK::Tuple) || p[2]->list->size() != 2)
          fail(n, "tojson's separators must be an (item_separator, key_separator) pair");
        o.separators = std::make_pair(want_str(n, "tojson's separators", (*p[2]->list)[0]),
                                      want_str(n, "tojson's separators", (*p[2]->list)[1]));
      }
      if (p[3]) o.sort_keys = truthy(*p[3]);
      try {
        std::string s = detail::to_json(v, o);
        check_size(n, s.size());
        return Value::string(std::move(s));
      } catch (const std::invalid_argument& e) {
        fail(n, std::string("tojson: ") + e.what());
      }
    }
    if (name == "upper" || name == "lower" || name == "capitalize") {
      bind(n, what, a, {});
      const std::string s = str_of(v, n);
      return Value::string(name == "upper"   ? detail::py_upper(s)
                           : name == "lower" ? detail::py_lower(s)
                                             : detail::py_capitalize(s));
    }
    if (name == "title") {
      // jinja's do_title, not str.title(): words split at runs of [-\s({\[<], each word's first
      // character upper-cased, the rest lower-cased.
      bind(n, what, a, {});
      const std::u32string cs = detail::decode_utf8(str_of(v, n));
      auto separator = [](char32_t c) {
        return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || detail::is_py_space(c);
      };
      std::string out;
      for (std::size_t k = 0; k < cs.size();) {
        std::size_t e = k;
        const bool sep = separator(cs[k]);
        while (e < cs.size() && separator(cs[e]) == sep) ++e;
        const std::string item = detail::encode_utf8(std::u32string_view(cs).substr(k, e - k));
        if (sep) {
          out += item;
        } else {
          std::string first;
          detail::append_utf8(first, cs[k]);
          out += detail::py_upper(first) +
                 detail::py_lower(detail::encode_utf8(std::u32string_view(cs).substr(k + 1, e - k - 1)));
        }
        k = e;
      }
      return Value::string(std::move(out));
    }
    if (name == "default" || name == "d") {
      auto p = bind(n, what, a, {"default_value", "boolean"});
      const bool boolean = p[1] && truthy(*p[1]);
      if (v.is_undefined() || (boolean && !truthy(v))) return p[0] ? *p[0] : Value::string("");
      return v;
    }
    if (name == "string") {
      bind(n, what, a, {});
      return Value::string(str_of(v, n));
    }
    if (name == "items") {
      bind(n, what, a, {});
      if (v.is_undefined()) return Value::make_iterator({});
      if (v.kind != VK::Dict) fail(n, "Can only get item pairs from a mapping.");
      List out;
      for (const auto& [k, e] : v.dict->items) out.push_back(Value::make_list({k, e}, true));
      return Value::make_iterator(std::move(out));  // jinja's do_items is a generator
    }
    if (name == "list") {
      bind(n, what, a, {});
      return Value::make_list(iterate(n, v));
    }
    if (name == "first" || name == "last") {
      bind(n, what, a, {});
      need_defined(v);
      if (v.kind == VK::Iterator) {
        if (name == "last") fail(n, "'generator' object is not reversible (last)");
        if (v.iter->poisoned) fail(n, "unsupported: reusing a generator a loop broke out of");
        if (v.iter->pos >= v.list->size()) return Value::undefined("No first item, sequence was empty.");
        return (*v.list)[v.iter->pos++];  // next(): consumes one item
      }
      List items = iterate(n, v);
      if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      bind(n, what, a, {});
      need_defined(v);
      if (v.kind == VK::String) {
        std::u32string cs = detail::decode_utf8(v.str());
        std::reverse(cs.begin(), cs.end());
        return Value::string(detail::encode_utf8(cs));
      }
      // reversed(value) where Python can (an iterator), else list(value) reversed (a list).
      const bool reversible = v.kind != VK::Iterator;
      List items = iterate(n, v);
      std::reverse(items.begin(), items.end());
      return reversible ? Value::make_iterator(std::move(items)) : Value::make_list(std::move(items));
    }
    if (name == "join") {
      auto p = bind(n, what, a, {"d", "attribute"});
      const std::string sep = p[0] ? str_of(*p[0], n) : std::string();
      std::string out;
      bool first = true;
      for (Value e : iterate(n, v)) {
        if (p[1] && p[1]->kind != VK::None) e = attribute_of(n, e, str_of(*p[1], n));
        if (!first) out += sep;
        first = false;
        out += str_of(e, n);
        check_size(n, out.size());
      }
      return Value::string(std::move(out));
    }
    if (name == "abs") {
      bind(n, what, a, {});
      if (v.kind == VK::Float) return Value::floating(std::fabs(v.f));
      if (v.kind == VK::Int || v.kind == VK::Bool) {
        const std::int64_t x = v.kind == VK::Int ? v.i : v.b;
        if (x == INT64_MIN) overflow(n);
        return Value::integer(x < 0 ? -x : x);
      }
      fail(n, std::string("bad operand type for abs(): '") + detail::type_name(v) + "'");
    }
    if (name == "int") {
      auto p = bind(n, what, a, {"default", "base"});
      const std::int64_t dflt = p[0] ? want_int(n, "int's default", *p[0]) : 0;
      const std::int64_t base = p[1] ? want_int(n, "int's base", *p[1]) : 10;
      need_defined(v);  // int(Undefined) raises
      if (v.kind == VK::Int) return v;
      if (v.kind == VK::Bool) return Value::integer(v.b);
      if (v.kind == VK::Float) {
        if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return Value::integer(dflt);
        return Value::integer(std::int64_t(v.f));
      }
      if (v.kind == VK::String) {
        const std::string t = detail::py_strip(v.str(), std::nullopt, true, true);
        if (t.empty() || base != 10) {
          if (base != 10) fail(n, "unsupported: int() with a base other than 10");
          return Value::integer(dflt);
        }
        errno = 0;
        char* end = nullptr;
        const long long x = std::strtoll(t.c_str(), &end, 10);
        if (*end == 0 && errno == 0) return Value::integer(x);
        const double d = std::strtod(t.c_str(), &end);  // jinja falls back to int(float(s))
        if (*end == 0 && std::isfinite(d) && std::fabs(d) < 9.2e18 && t.find_first_of("xX") == std::string::npos)
          return Value::integer(std::int64_t(d));
      }
      return Value::integer(dflt);
    }
    if (name == "float") {
      auto p = bind(n, what, a, {"default"});
      const Value dflt = p[0] ? *p[0] : Value::floating(0.0);
      need_defined(v);
      if (detail::is_number(v)) return Value::floating(detail::as_double(v));
      if (v.kind == VK::String) {
        const std::string t = detail::py_strip(v.str(), std::nullopt, true, true);
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && *end == 0 && t.find_first_of("xXpP") == std::string::npos) return Value::floating(d);
      }
      return dflt;
    }
    if (name == "round") {
      auto p = bind(n, what, a, {"precision", "method"});
      const std::int64_t precision = p[0] ? want_int(n, "round's precision", *p[0]) : 0;
      const std::string method = p[1] ? want_str(n, "round's method", *p[1]) : "common";
      if (precision != 0) fail(n, "unsupported: round with a precision other than 0");
      if (!detail::is_number(v)) fail(n, "round needs a number");
      if (v.kind != VK::Float && method == "common")
        return Value::integer(v.kind == VK::Int ? v.i : v.b);  // round(int, 0) is an int
      const double x = detail::as_double(v);
      if (method == "common") return Value::floating(std::nearbyint(x));  // Python's round: half to even
      if (method == "floor") return Value::floating(std::floor(x));
      if (method == "ceil") return Value::floating(std::ceil(x));
      fail(n, "method must be common, ceil or floor");
    }
    if (name == "replace") {
      auto p = bind(n, what, a, {"old", "new", "count"});
      if (!p[0] || !p[1]) fail(n, what + " needs old and new");
      const std::string r = detail::py_replace(str_of(v, n), str_of(*p[0], n), str_of(*p[1], n),
                                               p[2] && p[2]->kind != VK::None ? want_int(n, "replace's count", *p[2]) : -1);
      check_size(n, r.size());
      return Value::string(r);
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool attr = name == "selectattr" || name == "rejectattr";
      const bool keep_true = name == "select" || name == "selectattr";
      if (!a.kw.empty()) fail(n, what + ": keyword arguments are not supported");
      std::size_t k = 0;
      std::string path;
      if (attr) {
        if (a.pos.empty()) fail(n, what + " needs an attribute name");
        path = str_of(a.pos[k++], n);
      }
      std::string test_name;
      if (k < a.pos.size()) test_name = want_str(n, what + "'s test name", a.pos[k++]);
      if (!test_name.empty() && !known_tests().count(test_name)) fail(n, "no test named '" + test_name + "'");
      const std::vector<Value> test_args(a.pos.begin() + std::ptrdiff_t(k), a.pos.end());
      List out;
      for (const auto& e : iterate(n, v)) {
        const Value subject = attr ? attribute_of(n, e, path) : e;
        const bool r = test_name.empty() ? truthy(subject) : run_test(n, test_name, subject, test_args);
        if (r == keep_true) out.push_back(e);
      }
      return Value::make_iterator(std::move(out));  // jinja's select_or_reject is a generator
    }
    if (name == "map") {
      std::optional<std::string> attribute;
      Value dflt = Value::undefined();
      bool has_default = false;
      for (const auto& [k, e] : a.kw) {
        if (k == "attribute") attribute = str_of(e, n);
        else if (k == "default") {
          dflt = e;
          has_default = true;
        } else
          fail(n, what + " got an unexpected keyword argument '" + k + "'");
      }
      List out;
      if (attribute) {
        if (!a.pos.empty()) fail(n, what + ": attribute= with positional arguments");
        for (const auto& e : iterate(n, v)) {
          Value r = attribute_of(n, e, *attribute);
          out.push_back(r.is_undefined() && has_default ? dflt : r);
        }
        return Value::make_iterator(std::move(out));
      }
      if (a.pos.empty()) fail(n, what + " needs a filter name or attribute=");
      const std::string filter_name = want_str(n, what + "'s filter name", a.pos[0]);
      if (!known_filters().count(filter_name) || filter_name == "map")
        fail(n, "unsupported filter '" + filter_name + "' in map");
      Args rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      for (const auto& e : iterate(n, v)) out.push_back(apply_filter(n, filter_name, e, rest));
      return Value::make_iterator(std::move(out));  // jinja's map is a generator
    }
    if (name == "sort" || name == "unique" || name == "max" || name == "min") {
      std::vector<std::string> params = name == "sort" ? std::vector<std::string>{"reverse", "case_sensitive", "attribute"}
                                                       : std::vector<std::string>{"case_sensitive", "attribute"};
      auto p = bind(n, what, a, params);
      const std::size_t o = name == "sort" ? 1 : 0;
      const bool reverse = name == "sort" && p[0] && truthy(*p[0]);
      const bool case_sensitive = p[o] && truthy(*p[o]);
      const std::optional<std::string> attribute =
          p[o + 1] && p[o + 1]->kind != VK::None ? std::optional<std::string>(str_of(*p[o + 1], n)) : std::nullopt;
      List items = iterate(n, v);
      auto key = [&](const Value& e) {
        Value k = attribute ? attribute_of(n, e, *attribute) : e;
        if (!case_sensitive && k.is_string()) k = Value::string(detail::py_lower(k.str()));
        return k;
      };
      auto less = [&](const Value& x, const Value& y) {
        const auto c = detail::compare(key(x), key(y));
        if (!c) fail(n, "'<' not supported between the items being sorted");
        return *c < 0;
      };
      if (name == "sort") {
        std::stable_sort(items.begin(), items.end(),
                         [&](const Value& x, const Value& y) { return reverse ? less(y, x) : less(x, y); });
        return Value::make_list(std::move(items));
      }
      if (name == "unique") {
        List out, keys;
        for (const auto& e : items) {
          const Value k = key(e);
          bool seen = false;
          for (const auto& s : keys) seen = seen || detail::equals(s, k);
          if (!seen) {
            keys.push_back(k);
            out.push_back(e);
          }
        }
        return Value::make_iterator(std::move(out));  // jinja's unique is a generator
      }
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      std::size_t best = 0;
      for (std::size_t k = 1; k < items.size(); ++k)
        if (name == "max" ? less(items[best], items[k]) : less(items[k], items[best])) best = k;
      return items[best];
    }
    if (name == "sum") {
      auto p = bind(n, what, a, {"attribute", "start"});
      Value total = p[1] ? *p[1] : Value::integer(0);
      for (Value e : iterate(n, v)) {
        if (p[0] && p[0]->kind != VK::None) e = attribute_of(n, e, str_of(*p[0], n));
        Node plus(K::BinOp, n.pos);
        plus.name = "+";
        total = binop(plus, total, e);
      }
      return total;
    }
    fail(n, "unsupported filter '" + name + "'");
  }

  Value filter(const Node& n, Frame& f) {
    const Value v = eval(*n.kids[0], f);
    return apply_filter(n, n.name, v, args(n, f, 1));
  }

  const Where& w_;
  const Limits& limits_;
  std::vector<GenerationSpan>* generation_;
  std::size_t iterations_ = 0;
  int capturing_ = 0;
};

}  // namespace

// ---- Template ------------------------------------------------------------------------------

Template Template::parse(std::string_view text, std::string label) {
  Template t;
  t.label_ = std::move(label);
  // jinja: \r\n, \r and \n are line breaks, written as \n; one trailing newline is dropped.
  std::string s;
  s.reserve(text.size());
  for (std::size_t k = 0; k < text.size(); ++k) {
    if (text[k] == '\r') {
      s += '\n';
      if (k + 1 < text.size() && text[k + 1] == '\n') ++k;
    } else {
      s += text[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  t.source_ = std::move(s);
  const Where where{&t.label_, &t.source_};
  // The text must be UTF-8 (Python str): check once, so the rest may assume it.
  for (std::size_t k = 0; k < t.source_.size();) {
    const unsigned char c = static_cast<unsigned char>(t.source_[k]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && k + n <= t.source_.size();
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (std::size_t m = 1; ok && m < n; ++m) {
      const unsigned char d = static_cast<unsigned char>(t.source_[k + m]);
      ok = (d & 0xc0) == 0x80;
      cp = (cp << 6) | (d & 0x3f);
    }
    if (ok)
      ok = !(n == 2 && cp < 0x80) && !(n == 3 && cp < 0x800) && !(n == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
           !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) where.fail(k, "the template is not valid UTF-8");
    k += n;
  }
  Lexer lexer(t.source_, where);
  Parser parser(lexer.run(), where);
  t.root_ = parser.parse_template();
  t.has_generation_ = parser.has_generation;
  return t;
}

std::string Template::render(const std::map<std::string, Value>& variables, const Limits& limits,
                             std::vector<GenerationSpan>* generation) const {
  const Where where{&label_, &source_};
  Frame globals;
  // transformers' globals, and jinja's (lipsum, cycler, joiner are refused when called).
  for (const char* fn : {"raise_exception", "strftime_now", "namespace", "dict", "range", "lipsum", "cycler", "joiner"})
    globals.vars[fn] = Value::function(fn);
  Frame top;
  top.parent = &globals;
  for (const auto& [k, v] : variables) top.vars[k] = v;
  Renderer r(where, limits, generation);
  try {
    r.exec(*root_, top);
  } catch (const std::invalid_argument& e) {  // from the value layer (nesting depth)
    where.fail(r.current_pos, e.what());
  }
  return std::move(r.out);
}

}  // namespace refit::text::jinja
