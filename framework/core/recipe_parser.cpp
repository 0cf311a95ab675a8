#include "core/recipe_parser.h"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace refit {

namespace {

const std::vector<std::string> kDtypes = {"float32", "bfloat16", "float16"};

ComponentSpec read_component(const ConfigReader& r) {
  ComponentSpec c;
  c.type = r.required<std::string>("type");
  c.type_pointer = r.pointer_to("type");
  if (r.has("type") && r.raw()["type"].is_string() && c.type.empty()) r.error("type", "expected a factory name, got \"\"");
  c.config = r.child("config", /*required_key=*/false, /*detached=*/true);
  return c;
}

std::optional<Duration> read_duration(const ConfigReader& r, const std::string& key) {
  auto text = r.maybe<std::string>(key);
  if (!text) return std::nullopt;
  auto d = parse_duration(*text);
  if (!d) r.error(key, duration_expectation(*text));
  return d;
}

std::optional<bool> read_exempt(const ConfigReader& r) {
  if (!r.has("weight_decay_exempt")) return std::nullopt;
  return r.choice("weight_decay_exempt", {"1d_and_bias", "none"}) == "1d_and_bias";
}

OptimizerOverrides read_overrides(const ConfigReader& r, std::optional<bool>* exempt = nullptr) {
  OptimizerOverrides o;
  if (exempt) *exempt = read_exempt(r);
  o.lr = r.maybe<double>("lr");
  o.weight_decay = r.maybe<double>("weight_decay");
  o.eps = r.maybe<double>("eps");
  if (auto b = r.maybe<std::vector<double>>("betas")) {
    if (b->size() != 2) r.error("betas", "expected two numbers [beta1, beta2]");
    else
      o.betas = std::make_pair((*b)[0], (*b)[1]);
  }
  return o;
}

c10::ScalarType read_dtype(const ConfigReader& r, const std::string& key, const std::string& fallback) {
  std::string name = r.choice(key, {"float32", "bfloat16", "float16", "fp32", "bf16", "fp16"}, fallback);
  bool ok = false;
  return parse_dtype_name(name, &ok);
}

ModelEntry read_model(const ConfigReader& r) {
  ModelEntry m;
  m.pointer = r.pointer();
  m.spec.name = r.required<std::string>("name");
  if (r.has("ema")) {
    // Everything else comes from the source model; only the EMA copies' dtype is declared here.
    ConfigReader e = r.child("ema");
    EmaSpec ema;
    ema.of = e.required<std::string>("of");
    ema.momentum = e.number_in<double>("momentum", ema.momentum, 0.0, 1.0);
    ema.final_momentum = e.number_in<double>("final_momentum", ema.final_momentum, 0.0, 1.0);
    ema.schedule = e.choice("schedule", {"cosine", "constant"}, ema.schedule);
    m.ema = ema;
    m.spec.trainable = false;
    m.spec.dtype = read_dtype(r, "dtype", "float32");
    if (r.has("dtype") && m.spec.dtype != c10::kFloat)
      r.error("dtype", "an EMA model keeps float32 copies: an EMA step moves a weight by (1 - momentum) of its "
                       "distance, below bfloat16/float16 resolution (declare \"float32\")");
    m.spec.device = r.optional<std::string>("device", "auto");
    for (const char* key : {"type", "config", "weights", "adapters", "trainable", "parameters", "optimizer"})
      if (r.has(key))
        r.error(key, std::string("an EMA model mirrors its source (\"ema\": {\"of\": ...}); \"") + key +
                         "\" belongs on the source model");
    return m;
  }
  m.component = read_component(r);
  m.weights = r.optional_path("weights");
  if (r.has("inputs")) {
    ConfigReader in = r.child("inputs");
    if (!in.is_object()) {
      r.error("inputs",
              "expected an object mapping the model's input fields to data fields ({\"pixel_values\": \"image\"})");
    } else {
      for (const auto& [field, source] : in.raw().items()) {
        in.accept(field);
        if (!source.is_string() || source.get<std::string>().empty())
          in.error(field, "expected the name of a data field (a non-empty string)");
        else
          m.inputs[field] = source.get<std::string>();
      }
    }
  }
  if (r.has("gradient_checkpointing")) {
    const Json& g = r.raw()["gradient_checkpointing"];
    if (g.is_boolean()) {
      if (g.get<bool>()) m.gradient_checkpointing = ".*";
    } else if (g.is_string() && !g.get<std::string>().empty()) {
      m.gradient_checkpointing = g.get<std::string>();
    } else {
      r.error("gradient_checkpointing",
              "expected true, false or a regex of the model's blocks (\"encoder\\.layer\\.[0-5]\")");
    }
  }
  m.spec.trainable = r.required<bool>("trainable");
  // "nf4" / "int8": the adaptable Linear weights stored quantized; "gguf": kept in the Q4_0 / Q4_1 /
  // Q8_0 blocks of the GGUF weights file. Everything else (and the products) in bfloat16 unless
  // /storage says otherwise.
  const Json& declared = r.raw().contains("dtype") ? r.raw()["dtype"] : Json();
  if (declared.is_string() && (declared == "nf4" || declared == "int8" || declared == "gguf")) {
    m.spec.storage.format = declared.get<std::string>();
    if (declared != "nf4") m.spec.storage.double_quantization = false;
    ConfigReader st = r.child("storage");
    m.spec.dtype = read_dtype(st, "compute_dtype", "bfloat16");
    if (declared == "nf4") {
      m.spec.storage.blocksize = st.number_in<std::int64_t>("blocksize", 64, 16, 4096);
      if (m.spec.storage.blocksize & (m.spec.storage.blocksize - 1))
        st.error("blocksize", "expected a power of two, got " + std::to_string(m.spec.storage.blocksize));
      m.spec.storage.double_quantization = st.optional<bool>("double_quantization", true);
    }
    r.accept("dtype");
    if (m.spec.trainable)
      r.error("dtype", "\"" + m.spec.storage.format +
                           "\" stores the weights quantized, which cannot train: declare \"trainable\": false and "
                           "train adapters on it (QLoRA), or choose a float dtype");
  } else {
    if (r.has("storage")) r.error("storage", "applies to a quantized dtype (\"dtype\": \"nf4\", \"int8\" or \"gguf\")");
    bool ok = false;
    m.spec.dtype =
        parse_dtype_name(r.choice("dtype", {"float32", "bfloat16", "float16", "fp32", "bf16", "fp16", "nf4", "int8", "gguf"},
                                  "float32"),
                         &ok);
  }
  m.spec.device = r.optional<std::string>("device", "auto");
  m.spec.optimizer = read_overrides(r.child("optimizer"), &m.exempt_1d_and_bias);
  for (const auto& a : r.array("adapters")) {
    m.adapters.push_back(read_component(a));
    m.adapter_loads.push_back(a.optional_path("load"));
  }
  for (const auto& pr : r.array("parameters")) {
    ParameterRule rule;
    rule.pattern = pr.required<std::string>("match");
    rule.trainable = pr.required<bool>("trainable");
    rule.dtype = read_dtype(pr, "dtype", "float32");
    rule.group = pr.optional<std::string>("group", "");
    std::optional<bool> exempt;
    ConfigReader opt = pr.child("optimizer");
    rule.optimizer = read_overrides(opt, &exempt);
    if (exempt && rule.group.empty())
      opt.error("weight_decay_exempt", "applies to a rule's own optimizer group: give the rule a \"group\"");
    m.spec.rules.push_back(rule);
    m.rule_exempt_1d_and_bias.push_back(exempt);
  }
  return m;
}

bool is_utf8(const std::string& s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::type_error&) {
    return false;
  }
}

/// `s` with every byte that is not part of UTF-8 text replaced by U+FFFD, for messages.
std::string utf8_safe(const std::string& s) {
  const std::string quoted = Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
  return Json::parse(quoted).get<std::string>();
}

}  // namespace

void apply_overrides(Json& document, const std::vector<std::string>& overrides) {
  std::vector<ConfigIssue> issues;
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      issues.push_back({"--set " + o, "expected KEY=VALUE with KEY like training.seed"});
      continue;
    }
    // A recipe document is JSON text again later (the run folder's copy, messages quoting a
    // value): nlohmann cannot write a string that is not UTF-8, so such an override is refused
    // here rather than failing there with a JSON library error.
    if (!is_utf8(o)) {
      issues.push_back({"--set " + utf8_safe(o), "not UTF-8 text"});
      continue;
    }
    std::string key = o.substr(0, eq), text = o.substr(eq + 1);
    Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = text;  // bare words are strings: --set training.precision=fp32
    Json* node = &document;
    std::stringstream ss(key);
    std::string token, pointer;
    std::vector<std::string> tokens;
    while (std::getline(ss, token, '.')) tokens.push_back(token);
    bool failed = false;
    for (std::size_t i = 0; i < tokens.size() && !failed; ++i) {
      const std::string& t = tokens[i];
      bool last = i + 1 == tokens.size();
      if (node->is_array()) {
        std::size_t idx = 0;
        // from_chars: an index too large for size_t is out of the array too (std::stoul threw).
        bool numeric = !t.empty() && t.find_first_not_of("0123456789") == std::string::npos &&
                       std::from_chars(t.data(), t.data() + t.size(), idx).ec == std::errc();
        if (!numeric || idx >= node->size()) {
          issues.push_back({"--set " + key, json_pointer_append(pointer, t) + " is not an element of the array at " +
                                                (pointer.empty() ? "/" : pointer)});
          failed = true;
          break;
        }
        node = &(*node)[idx];
      } else if (node->is_object() || node->is_null()) {
        if (!last && !node->contains(t)) (*node)[t] = Json::object();
        node = &(*node)[t];
      } else {
        issues.push_back({"--set " + key,
                          (pointer.empty() ? "/" : pointer) + " is a " + detail::json_type_name(*node) + ", not an object"});
        failed = true;
        break;
      }
      pointer = json_pointer_append(pointer, t);
    }
    if (!failed) *node = value;
  }
  if (!issues.empty()) throw ConfigError(issues);
}

namespace {

void read_plugins(const ConfigReader& root, Recipe& recipe) {
  ConfigReader plugins = root.child("plugins");
  recipe.plugins = plugins.optional<std::vector<std::string>>("load", {});
  for (const auto& p : plugins.optional<std::vector<std::string>>("paths", {}))
    recipe.plugin_paths.push_back(plugins.resolve(p));
}

void read_models(const ConfigReader& root, Recipe& recipe) {
  auto models = root.array("models", /*required=*/true);
  if (root.has("models") && models.empty() && root.raw()["models"].is_array())
    root.error("models", "expected at least one model");
  std::set<std::string> names;
  for (const auto& m : models) {
    recipe.models.push_back(read_model(m));
    const std::string& n = recipe.models.back().spec.name;
    if (!n.empty() && !names.insert(n).second) m.error("name", "duplicate model name \"" + n + "\"");
  }
}

void read_data(const ConfigReader& root, Recipe& recipe) {
  ConfigReader data = root.child("data", /*required=*/true);
  recipe.train_data = read_component(data.child("train", /*required=*/true));
  if (data.has("val")) recipe.val_data = read_component(data.child("val"));
  if (data.has("test")) recipe.test_data = read_component(data.child("test"));
  if (!data.has("sets")) return;
  ConfigReader sets = data.child("sets");
  if (sets.is_object())
    for (const auto& [name, value] : sets.raw().items()) {
      (void)value;
      recipe.data_sets.emplace_back(name, read_component(sets.child(name)));
    }
}

OptimizerSpec read_optimizer(const ConfigReader& opt) {
  OptimizerSpec o;
  o.type = opt.choice("type", {"adamw", "adam", "sgd"}, o.type);
  o.lr = opt.number_in<double>("lr", o.lr, 0.0, 1e3);
  o.weight_decay = opt.number_in<double>("weight_decay", o.type == "adamw" ? o.weight_decay : 0.0, 0.0, 1e3);
  if (auto b = opt.maybe<std::vector<double>>("betas")) {
    if (b->size() != 2) opt.error("betas", "expected two numbers [beta1, beta2]");
    else
      o.betas = {(*b)[0], (*b)[1]};
  }
  o.eps = opt.number_in<double>("eps", o.eps, 0.0, 1.0);
  o.momentum = opt.number_in<double>("momentum", o.momentum, 0.0, 1.0);
  o.nesterov = opt.optional<bool>("nesterov", o.nesterov);
  o.fused = opt.optional<bool>("fused", o.fused);
  o.exempt_1d_and_bias = read_exempt(opt).value_or(true);
  return o;
}

SchedulerSpec read_scheduler(const ConfigReader& sched) {
  SchedulerSpec s;
  s.type = sched.choice("type", {"constant", "linear", "cosine", "step"}, s.type);
  s.warmup = sched.number_in<std::int64_t>("warmup_iterations", 0, 0, INT64_MAX);
  s.min_lr_ratio = sched.number_in<double>("min_lr_ratio", 0.0, 0.0, 1.0);
  s.step_size = sched.number_in<std::int64_t>("step_size", 1, 1, INT64_MAX);
  s.gamma = sched.number_in<double>("gamma", 0.1, 0.0, 1.0);
  return s;
}

DistributedSpec read_distributed(const ConfigReader& dist) {
  DistributedSpec d;
  d.backend = dist.choice("backend", {"auto", "gloo", "nccl"}, "auto");
  d.timeout_s = dist.number_in<double>("timeout_s", d.timeout_s, 1.0, 86400.0);
  d.bucket_mib = dist.number_in<std::int64_t>("bucket_mib", d.bucket_mib, 1, 4096);
  return d;
}

GradScalerOptions read_grad_scaler(const ConfigReader& gs) {
  GradScalerOptions g;
  g.init_scale = gs.number_in<double>("init_scale", g.init_scale, 1e-30, 1e30);
  g.growth_factor = gs.number_in<double>("growth_factor", g.growth_factor, 1.0, 1e3);
  g.backoff_factor = gs.number_in<double>("backoff_factor", g.backoff_factor, 1e-6, 1.0);
  g.growth_interval = gs.number_in<std::int64_t>("growth_interval", g.growth_interval, 1, INT64_MAX);
  return g;
}

EarlyStoppingSpec read_early_stopping(const ConfigReader& es) {
  EarlyStoppingSpec e;
  e.metric = es.optional<std::string>("metric", e.metric);
  e.maximize = es.choice("mode", {"min", "max"}, "min") == "max";
  e.patience = es.number_in<std::int64_t>("patience", e.patience, 1, INT64_MAX);
  e.min_delta = es.number_in<double>("min_delta", e.min_delta, 0.0, 1e30);
  e.restore_best = es.optional<bool>("restore_best", e.restore_best);
  return e;
}

std::optional<Precision> read_precision(const ConfigReader& tr) {
  const std::string precision = tr.choice("precision", {"auto", "fp32", "bf16-mixed", "fp16-mixed", "bf16-true"}, "auto");
  if (precision == "fp32") return Precision::fp32;
  if (precision == "bf16-mixed") return Precision::bf16_mixed;
  if (precision == "fp16-mixed") return Precision::fp16_mixed;
  if (precision == "bf16-true") return Precision::bf16_true;
  return std::nullopt;  // "auto": decided by the device (run/assembly.h)
}

TrainingSpec read_training(const ConfigReader& tr) {
  TrainingSpec t;
  if (auto d = read_duration(tr, "duration")) t.duration = *d;
  else if (!tr.has("duration") && tr.is_object())
    tr.error("duration", "missing required key");
  t.batch_size = tr.number_in<std::int64_t>("batch_size", t.batch_size, 1, 1 << 24);
  t.gradient_accumulation = tr.number_in<std::int64_t>("gradient_accumulation", 1, 1, 1 << 16);
  t.seed = tr.optional<std::uint64_t>("seed", 0);
  t.precision = read_precision(tr);
  t.device = tr.optional<std::string>("device", "auto");
  t.eval_every = read_duration(tr, "eval_every");
  t.checkpoint_every = read_duration(tr, "checkpoint_every");
  t.log_every = tr.number_in<std::int64_t>("log_every", t.log_every, 1, INT64_MAX);
  t.clip_grad_norm = tr.maybe<double>("clip_grad_norm");
  t.clip_grad_value = tr.maybe<double>("clip_grad_value");
  if (t.clip_grad_value && !(*t.clip_grad_value > 0))
    tr.error("clip_grad_value", "expected a positive number (gradients are clamped to [-v, v])");
  t.non_finite =
      tr.choice("non_finite", {"skip", "raise"}, "skip") == "raise" ? NonFinitePolicy::raise : NonFinitePolicy::skip;
  t.schedule_counts = tr.choice("schedule_counts", {"applied_updates", "iterations"}, "applied_updates") == "iterations"
                          ? ScheduleCounts::iterations
                          : ScheduleCounts::applied_updates;
  t.drop_last = tr.optional<bool>("drop_last", true);
  t.shuffle = tr.optional<bool>("shuffle", true);
  t.num_workers = tr.number_in<int>("num_workers", t.num_workers, 0, 64);
  t.prefetch = tr.number_in<int>("prefetch", t.prefetch, 1, 1024);
  if (auto resume = tr.maybe<std::string>("resume"))
    t.resume = (*resume == "latest" || resume->empty()) ? *resume : tr.resolve(*resume).string();
  t.resume_allow_changes = tr.optional<std::vector<std::string>>("resume_allow_changes", {});
  t.eval_at_start = tr.optional<bool>("eval_at_start", false);
  t.cuda_graph = tr.optional<bool>("cuda_graph", false);
  t.cuda_graph_warmup = tr.number_in<std::int64_t>("cuda_graph_warmup", t.cuda_graph_warmup, 1, 1000);
  t.distributed = read_distributed(tr.child("distributed"));
  t.grad_scaler = read_grad_scaler(tr.child("grad_scaler"));
  t.early_stopping = read_early_stopping(tr.child("early_stopping"));
  t.early_stopping.enabled = tr.has("early_stopping");
  return t;
}

void read_output(const ConfigReader& root, Recipe& recipe) {
  ConfigReader out = root.child("output");
  recipe.output_dir = out.has("dir") ? out.path("dir") : root.resolve("runs/" + recipe.name);
  recipe.tensorboard = out.optional<bool>("tensorboard", true);
  recipe.memory_log = out.optional<bool>("memory_log", false);
  ConfigReader ck = out.child("checkpoints");
  CheckpointSpec& c = recipe.checkpoints;
  c.enabled = ck.optional<bool>("enabled", true);
  c.keep_last = ck.number_in<std::int64_t>("keep_last", 0, 0, INT64_MAX);
  c.keep_best = ck.number_in<std::int64_t>("keep_best", 0, 0, INT64_MAX);
  c.metric = ck.optional<std::string>("metric", "loss");
  c.maximize = ck.choice("mode", {"min", "max"}, "min") == "max";
}

}  // namespace

Recipe parse_recipe(Json document, const fs::path& base_dir) {
  Recipe recipe;
  recipe.base_dir = base_dir;
  ConfigReader root = ConfigReader::root(std::move(document), base_dir);
  recipe.issues = root.issues_ptr();
  recipe.name = root.optional<std::string>("name", "run");
  root.optional<std::string>("description", "");
  // In document order, so that problems are reported in the order a reader meets them.
  read_plugins(root, recipe);
  read_models(root, recipe);
  read_data(root, recipe);
  recipe.objective = read_component(root.child("objective", /*required=*/true));
  recipe.optimizer = read_optimizer(root.child("optimizer"));
  recipe.scheduler = read_scheduler(root.child("scheduler"));
  recipe.training = read_training(root.child("training", /*required=*/true));
  for (const auto& c : root.array("callbacks")) recipe.callbacks.push_back(read_component(c));
  for (const auto& c : root.array("evaluators")) recipe.evaluators.push_back(read_component(c));
  read_output(root, recipe);
  root.finish();
  return recipe;
}

void check_json_depth(const Json& document, const std::string& where) {
  constexpr std::size_t kMaxDepth = 64;
  std::vector<std::pair<const Json*, std::size_t>> stack{{&document, 1}};
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (depth > kMaxDepth)
      throw ConfigError({{"", where + ": the recipe is nested more than " + std::to_string(kMaxDepth) +
                                  " levels deep; no recipe key is"}});
    if (node->is_structured())
      for (const auto& child : *node) stack.emplace_back(&child, depth + 1);
  }
}

static void expand_variables(Json& node, const std::string& pointer, std::vector<ConfigIssue>& issues, int depth = 0) {
  if (depth > 256) return;  // deeper documents are refused by the reader anyway
  if (node.is_object()) {
    for (auto& [key, value] : node.items()) expand_variables(value, json_pointer_append(pointer, key), issues, depth + 1);
  } else if (node.is_array()) {
    for (std::size_t i = 0; i < node.size(); ++i)
      expand_variables(node[i], pointer + "/" + std::to_string(i), issues, depth + 1);
  } else if (node.is_string()) {
    const std::string s = node.get<std::string>();
    if (s.find("${") == std::string::npos) return;
    std::string out;
    for (std::size_t i = 0; i < s.size();) {
      if (s.compare(i, 2, "${") != 0) {
        out += s[i++];
        continue;
      }
      const std::size_t close = s.find('}', i + 2);
      if (close == std::string::npos) {
        issues.push_back({pointer, "unterminated \"${\" in \"" + s + "\""});
        return;
      }
      const std::string name = s.substr(i + 2, close - i - 2);
      const char* value = name.empty() ? nullptr : std::getenv(name.c_str());
      if (!value || !*value) {
        issues.push_back(
            {pointer, "the environment variable " + name + " is not set" +
                          " (export it, or give the value with --set; scripts/env.sh, which scripts/refit sources, "
                          "sets the ones the shipped recipes use)"});
        return;
      }
      out += value;
      i = close + 1;
    }
    if (!is_utf8(out)) {
      issues.push_back({pointer, "\"" + utf8_safe(s) + "\" expands to text that is not UTF-8"});
      return;
    }
    node = out;
  }
}

Recipe load_recipe(const fs::path& file, const std::vector<std::string>& overrides) {
  std::ifstream in(file);
  if (!in) throw Error("cannot open recipe " + file.string() + ": " + (fs::exists(file) ? "not readable" : "no such file"));
  std::stringstream buf;
  buf << in.rdbuf();
  return load_recipe_text(buf.str(), file, overrides);
}

Recipe load_recipe_text(const std::string& text, const fs::path& file, const std::vector<std::string>& overrides) {
  Json document;
  // nlohmann takes a NUL byte for the end of the input, so "{...}\0garbage" would pass; JSON
  // text holds no raw NUL.
  // "<file>:<line>:<column>" of a byte offset.
  auto located = [&](std::size_t at) {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < at && i < text.size(); ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else
        ++col;
    }
    return file.string() + ":" + std::to_string(line) + ":" + std::to_string(col);
  };
  if (const std::size_t at = text.find('\0'); at != std::string::npos)
    throw Error(located(at) + ": a NUL byte (JSON text holds none: a damaged or binary file?)");
  try {
    document = Json::parse(text);
  } catch (const Json::parse_error& e) {
    // nlohmann reports a byte offset; turn it into line:column.
    std::string what = e.what();
    auto pos = what.find("parse error");
    throw ConfigError({{"", located(e.byte) + ": invalid JSON: " + (pos == std::string::npos ? what : what.substr(pos))}});
  } catch (const Json::out_of_range& e) {
    // A number beyond a double's range ("1e400": out_of_range 406, found by fuzzing) escaped as
    // nlohmann's exception. It has no offset; its message quotes the number, found in the text.
    std::string what = e.what();
    const auto open = what.find('\''), close = what.rfind('\'');
    const std::size_t at =
        open != std::string::npos && close > open ? text.find(what.substr(open + 1, close - open - 1)) : std::string::npos;
    const auto tag = what.find("] ");
    throw ConfigError({{"", (at == std::string::npos ? file.string() : located(at)) +
                                ": invalid JSON: " + (tag == std::string::npos ? what : what.substr(tag + 2))}});
  }
  if (!document.is_object())
    throw ConfigError({{"", file.string() + ": a recipe is a JSON object, got " + detail::json_type_name(document)}});
  check_json_depth(document, file.string());
  apply_overrides(document, overrides);
  check_json_depth(document, file.string());
  // "${NAME}" in any string is the environment variable NAME (recipes name installed files
  // without machine paths: "${REFIT_MINILM_DIR}/model.safetensors").
  std::vector<ConfigIssue> unset;
  expand_variables(document, "", unset);
  if (!unset.empty()) throw ConfigError(unset);
  fs::path base = fs::absolute(file).parent_path();
  Recipe r = parse_recipe(std::move(document), base);
  r.file = fs::absolute(file);
  return r;
}

}  // namespace refit
