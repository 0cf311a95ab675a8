// A Jinja2 subset for chat templates: the language as jinja2 3.1 runs it inside transformers'
// `apply_chat_template` (an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the
// loopcontrols extension, transformers' `{% generation %}` tag, its `tojson` filter and its
// globals raise_exception, strftime_now, namespace, dict; jinja's range). Values follow Python's
// rules (str() and repr() of numbers, lists and dicts, integer and float arithmetic, string
// slicing by code point), so a template renders byte for byte as jinja2 renders it.
//
// What the engine does not implement is refused, never approximated: an unknown or unsupported
// statement, filter or test when the template is parsed; an unsupported method, global or
// operation when it is reached. Every error is a TemplateError naming line:column. See
// docs/text.md ("Chat templates").
//
// Thread safety: a parsed Template is immutable; render() may run from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "refit/error.h"

namespace refit::text::jinja {

/// A template that cannot be parsed or rendered: `line` and `column` (1-based, columns in code
/// points) locate it in the template text; what() reads "<label>:<line>:<column>: <message>".
class TemplateError : public refit::Error {
 public:
  TemplateError(const std::string& label, int line, int column, const std::string& message)
      : refit::Error(label + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message), line_(line),
        column_(column), message_(message) {}
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }

 private:
  int line_, column_;
  std::string message_;
};

/// The template called raise_exception(message): message() is the template's text.
class TemplateRaised : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

struct Value;
using List = std::vector<Value>;
/// A Python dict: insertion-ordered (key, value) pairs; keys compare as Python's ==.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(Value key, Value value);
};
struct LoopState;
/// A Python generator's progress (filters like select and map return generators: iterated once).
struct IterState {
  std::size_t pos = 0;
  bool poisoned = false;  // a loop broke out of it: what is left is not modelled
};

/// A Python value as a template sees it. Strings are UTF-8. `Undefined` is jinja's Undefined (a
/// missing variable, attribute or index): empty when printed, false, an error when used further.
/// `Iterator` is a generator (select, map, unique, items, reverse return one): always true, no
/// len(), consumed by iteration, not printable. `View` is dict.keys()/values()/items() or a range:
/// iterable again, with len(), printed as Python prints it (`s` holds the type name or repr).
struct Value {
  enum class Kind {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    List,
    Tuple,
    Dict,
    Namespace,
    Loop,
    Function,
    Iterator,
    View
  };
  Kind kind = Kind::Undefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;  // String; Function: its name; Undefined: the hint
  std::shared_ptr<List> list;            // List, Tuple
  std::shared_ptr<Dict> dict;            // Dict, Namespace (the one mutable object: `set ns.x`)
  std::shared_ptr<LoopState> loop;
  std::shared_ptr<IterState> iter;  // Iterator

  /// A generator over `items`; a view named `name` ("dict_keys", "dict_values", "dict_items") or,
  /// for ranges, printed as `name`.
  static Value make_iterator(List items);
  static Value make_view(List items, std::string name);

  Value() = default;
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(std::int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value make_list(List v, bool tuple = false);
  static Value make_dict(Dict v);
  static Value function(std::string name);
  /// JSON -> Python: objects become dicts (in the JSON's order), arrays lists, null None.
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_string() const { return kind == Kind::String; }
  const std::string& str() const { return *s; }
};

/// Python's str() of a value, as `{{ value }}` prints it. to_str, to_repr and the comparisons
/// throw std::invalid_argument on what they cannot do (a generator, values nested 400 deep).
std::string to_str(const Value& v);
/// Python's repr().
std::string to_repr(const Value& v);
/// Python's repr() of a float ("1.0", "1e+16", "0.30000000000000004").
std::string float_repr(double v);

struct Node;

/// Limits on one render: the engine stops with an error rather than run away on a hostile
/// template (output size, loop iterations; parsing limits nesting depth).
struct Limits {
  std::size_t max_output_bytes = std::size_t(64) << 20;
  std::size_t max_iterations = 10'000'000;  ///< loop iterations and range() items in one render
};

/// Where a `{% generation %}` block's output lies in the rendered text (transformers' tag).
struct GenerationSpan {
  std::size_t begin = 0, end = 0;
};

class Template {
 public:
  /// Parses `text`; `label` names it in errors. Throws TemplateError on anything unsupported.
  static Template parse(std::string_view text, std::string label);

  /// Renders with `variables` as the template's context. `generation`, when given, receives
  /// the byte ranges of the `{% generation %}` blocks' output.
  std::string render(const std::map<std::string, Value>& variables, const Limits& limits = {},
                     std::vector<GenerationSpan>* generation = nullptr) const;

  const std::string& label() const { return label_; }
  /// True when the template has a `{% generation %}` block.
  bool has_generation_blocks() const { return has_generation_; }

 private:
  std::string label_;
  std::string source_;  // newlines normalised, as jinja's lexer sees it (for line:column)
  std::shared_ptr<const Node> root_;
  bool has_generation_ = false;
};

}  // namespace refit::text::jinja
