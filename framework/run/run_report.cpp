#include "run/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "callbacks/svg_chart.h"
#include "refit/error.h"

namespace refit {

namespace io {
// Declared in io/safetensors.h, which brings LibTorch's headers: this file needs none of them.
void write_file_atomic(const std::filesystem::path& path, const std::string& bytes);
}  // namespace io

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// ---- values ---------------------------------------------------------------------------------

bool number(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return std::isfinite(*out);
}

// The renderer's number format and escaping, so that tables and charts print values alike.
using svg::escape;
using svg::short_number;

std::string duration(double seconds) {
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh %02ldm %02lds", s / 3600, s / 60 % 60, s % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm %02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  return buf;
}

// ---- reading the run ------------------------------------------------------------------------

struct Run {
  std::vector<json> train, eval;
  json summary, recipe, environment;
};

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return json();
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(p.string() + ": not JSON (" + e.what() + ")");
  }
}

Run read_run(const fs::path& dir) {
  Run r;
  std::ifstream in(dir / "metrics.jsonl");
  if (!in) throw Error(dir.string() + ": no metrics.jsonl (not the output folder of a refit run?)");
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      throw Error((dir / "metrics.jsonl").string() + ":" + std::to_string(n) + ": not a JSON object");
    }
    const std::string kind = j.value("kind", "");
    if (kind == "train") r.train.push_back(std::move(j));
    else if (kind == "eval")
      r.eval.push_back(std::move(j));
  }
  r.summary = read_json_file(dir / "summary.json");
  r.recipe = read_json_file(dir / "recipe.json");
  if (r.summary.is_object() && r.summary.contains("environment")) r.environment = r.summary["environment"];
  return r;
}

bool metric_key(const std::string& k) {
  return k != "kind" && k != "split" && k != "step" && k != "iteration" && k != "count";
}

/// The number of parameter groups: the longest "lr" array of the train lines.
std::size_t lr_groups(const Run& r) {
  std::size_t groups = 0;
  for (const auto& t : r.train)
    if (t.contains("lr") && t["lr"].is_array()) groups = std::max(groups, t["lr"].size());
  return groups;
}

std::vector<std::string> group_names(const Run& r, std::size_t groups) {
  std::vector<std::string> names;
  if (r.environment.is_object() && r.environment.contains("param_groups"))
    for (const auto& g : r.environment["param_groups"]) names.push_back(g.is_string() ? g.get<std::string>() : g.dump());
  for (std::size_t i = names.size(); i < groups; ++i) names.push_back("group " + std::to_string(i));
  return names;
}

// ---- the CSV --------------------------------------------------------------------------------

std::string csv_cell(const json& v) {
  if (v.is_null()) return "";
  if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_number()) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v.get<double>());
    return buf;
  }
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string metrics_csv(const Run& r) {
  const auto names = group_names(r, lr_groups(r));
  std::vector<std::string> cols = {"kind", "split", "step", "iteration", "epoch", "samples", "time", "loss"};
  for (const auto& n : names) cols.push_back("lr_" + n);
  for (const char* c : {"grad_norm", "grad_norm_clipped", "scale", "scale_after", "skipped", "skipped_total", "count"})
    cols.push_back(c);
  std::set<std::string> seen(cols.begin(), cols.end());
  for (const auto& e : r.eval)
    for (const auto& [k, v] : e.items())
      if (seen.insert(k).second) cols.push_back(k);
  std::ostringstream out;
  for (std::size_t i = 0; i < cols.size(); ++i) out << (i ? "," : "") << csv_cell(cols[i]);
  out << "\n";
  auto row = [&](const json& j) {
    for (std::size_t i = 0; i < cols.size(); ++i) {
      json v;
      if (cols[i].rfind("lr_", 0) == 0 && j.contains("lr") && j["lr"].is_array()) {
        const std::size_t g =
            static_cast<std::size_t>(std::find(names.begin(), names.end(), cols[i].substr(3)) - names.begin());
        if (g < j["lr"].size()) v = j["lr"][g];
      } else if (j.contains(cols[i])) {
        v = j[cols[i]];
      }
      out << (i ? "," : "") << csv_cell(v);
    }
    out << "\n";
  };
  // In the log's order: train lines and evaluations interleaved by iteration.
  std::size_t a = 0, b = 0;
  while (a < r.train.size() || b < r.eval.size()) {
    if (b == r.eval.size() ||
        (a < r.train.size() && r.train[a].value("iteration", 0LL) <= r.eval[b].value("iteration", 0LL)))
      row(r.train[a++]);
    else
      row(r.eval[b++]);
  }
  return out.str();
}

// ---- the page -------------------------------------------------------------------------------

// The page's style; the charts' (svg::kChartCss) follows it.
const char* kStyle =
    R"(body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:900px;color:#222}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px}.note{font-size:12px}table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:10px 0}pre{background:#f7f7f7;border:1px solid #ddd;padding:8px;font-size:12px;overflow:auto;max-height:480px})";

std::string table(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string s = "<table>\n";
  for (const auto& [k, v] : rows) s += "<tr><th>" + escape(k) + "</th><td>" + escape(v) + "</td></tr>\n";
  return s + "</table>\n";
}

/// What the train lines say about the run as a whole.
struct Progress {
  double max_iteration = 0;     // the x axis of every chart ends here (evaluations included)
  double samples = 0;           // samples seen by the last logged update
  std::vector<double> skipped;  // iterations of skipped updates
};

Progress progress_of(const Run& r) {
  Progress p;
  for (const auto& t : r.train) {
    double v;
    if (number(t, "iteration", &v)) p.max_iteration = std::max(p.max_iteration, v);
    if (number(t, "samples", &v)) p.samples = v;
    if (t.value("skipped", false)) p.skipped.push_back(t.value("iteration", 0.0));
  }
  for (const auto& e : r.eval) p.max_iteration = std::max(p.max_iteration, e.value("iteration", 0.0));
  return p;
}

std::string page_header(const Run& r, const fs::path& dir) {
  const std::string name = r.recipe.is_object() && r.recipe.contains("name") && r.recipe["name"].is_string()
                               ? r.recipe["name"].get<std::string>()
                               : dir.filename().string();
  char when[64] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>refit run: " << escape(name)
    << "</title>\n<style>" << kStyle << "\n"
    << svg::kChartCss << "</style></head>\n<body>\n<h1>refit run: " << escape(name) << "</h1>\n<div class='sub'>"
    << escape(fs::absolute(dir).lexically_normal().string()) << " · report written " << when << "</div>\n";
  return h.str();
}

/// "loss 0.31, accuracy 0.9": a split's final metrics from summary.json (a non-finite one is null).
std::string final_metrics(const json& metrics) {
  std::string v;
  for (const auto& [k, m] : metrics.items())
    v += (v.empty() ? "" : ", ") + k + " " + (m.is_number() ? short_number(m.get<double>()) : std::string("n/a"));
  return v;
}

std::string summary_section(const Run& r, const Progress& progress) {
  const json& sum = r.summary;
  std::vector<std::pair<std::string, std::string>> rows;
  if (sum.is_object()) {
    rows.emplace_back("steps (micro-batches)", std::to_string(sum.value("steps", 0LL)));
    rows.emplace_back("optimizer updates", std::to_string(sum.value("iterations", 0LL)) + " (" +
                                               std::to_string(sum.value("skipped_iterations", 0LL)) + " skipped)");
    const double seconds = sum.value("seconds", 0.0);
    rows.emplace_back("training time", duration(seconds));
    if (seconds > 0 && progress.samples > 0)
      rows.emplace_back("mean throughput", short_number(progress.samples / seconds) + " samples/s");
    if (sum.contains("compute") && sum["compute"].is_object() && sum["compute"].contains("flops_per_update")) {
      const auto& c = sum["compute"];
      std::string text = short_number(c.value("flops_per_update", 0.0) / 1e9) + " GFLOP per update";
      if (c.value("flops_per_second", 0.0) > 0)
        text += ", " + short_number(c.value("flops_per_second", 0.0) / 1e9) + " GFLOP/s";
      if (c.contains("mfu") && c["mfu"].is_number())
        text +=
            ", MFU " + short_number(100.0 * c["mfu"].get<double>()) + " % (" + c.value("peak_basis", std::string()) + ")";
      rows.emplace_back("compute (products)", text);
    }
    if (sum.contains("cuda_graph") && sum["cuda_graph"].is_string())
      rows.emplace_back("CUDA graph", sum["cuda_graph"].get<std::string>());
    for (const char* split : {"val", "test"})
      if (sum.contains(split) && sum[split].is_object())
        rows.emplace_back(std::string("final ") + split, final_metrics(sum[split]));
    if (sum.contains("stopped_early") && sum["stopped_early"].is_string())
      rows.emplace_back("stopped early", sum["stopped_early"].get<std::string>());
    if (sum.contains("memory") && sum["memory"].is_object()) {
      // Estimated before training (refit inspect's figures) and measured by the run, per component.
      const json& estimated = sum["memory"].value("estimated", json::object());
      const json& measured = sum["memory"].value("measured", json::object());
      for (const char* part :
           {"frozen_weights", "trainable_weights", "gradients", "optimizer_state", "activations", "allocator_cache"}) {
        auto mib = [&](const json& j) {
          return j.contains(part) && j[part].is_number() ? short_number(j[part].get<double>() / (1 << 20)) + " MiB"
                                                         : std::string("-");
        };
        std::string label = std::string("memory: ") + part;
        std::replace(label.begin(), label.end(), '_', ' ');
        rows.emplace_back(label, mib(estimated) + " estimated, " + mib(measured) + " measured");
      }
      if (sum["memory"].contains("peak_rss_bytes") && sum["memory"]["peak_rss_bytes"].is_number())
        rows.emplace_back("process peak RSS",
                          short_number(sum["memory"]["peak_rss_bytes"].get<double>() / (1 << 20)) + " MiB");
    }
  } else {
    rows.emplace_back("state", "no summary.json: the run did not finish (or is still running)");
    rows.emplace_back("optimizer updates logged", short_number(progress.max_iteration, 9));
  }
  rows.emplace_back("samples seen", short_number(progress.samples, 12));
  return "<h2>Summary</h2>\n" + table(rows);
}

std::string environment_section(const Run& r) {
  const json& env = r.environment;
  if (!env.is_object()) return "<h2>Environment</h2>\n<p class='note'>summary.json has no environment.</p>\n";
  std::vector<std::pair<std::string, std::string>> rows;
  auto add = [&](const char* label, const char* key) {
    if (env.contains(key)) rows.emplace_back(label, env[key].is_string() ? env[key].get<std::string>() : env[key].dump());
  };
  add("refit", "refit");
  add("plugin API", "plugin_api");
  add("LibTorch", "libtorch");
  add("CUDA runtime", "cuda_runtime");
  add("device", "device");
  add("device model", "device_model");
  add("CPU threads", "cpu_threads");
  add("CPU bf16 products", "cpu_bf16_products");
  add("precision", "precision");
  add("grad scaler", "grad_scaler");
  add("malloc", "malloc");
  if (r.summary.contains("host_allocator")) {  // counted by the run, not part of the environment
    const json& ha = r.summary["host_allocator"];
    const double a = ha.value("allocations", 0.0), hits = ha.value("cache_hits", 0.0);
    rows.emplace_back("host allocation cache", short_number(a, 12) + " CPU allocations, " +
                                                   short_number(a > 0 ? 100.0 * hits / a : 0.0, 4) + " % from the cache");
  }
  add("host", "host");
  return "<h2>Environment</h2>\n" + table(rows);
}

/// The metrics the evaluations logged, in order of first appearance.
std::vector<std::string> eval_metric_names(const Run& r) {
  std::vector<std::string> names;
  for (const auto& e : r.eval)
    for (const auto& [k, v] : e.items())
      if (metric_key(k) && std::find(names.begin(), names.end(), k) == names.end()) names.push_back(k);
  return names;
}

/// One row per evaluation; a test evaluation that summary.json holds but the log does not (a run
/// evaluated on test only at its end) is the last row.
std::string evaluations_section(const Run& r, std::vector<std::string> cols) {
  std::vector<json> evals = r.eval;
  const json& sum = r.summary;
  const bool test_logged =
      std::any_of(evals.begin(), evals.end(), [](const json& e) { return e.value("split", "") == "test"; });
  if (!test_logged && sum.is_object() && sum.contains("test") && sum["test"].is_object()) {
    json t = sum["test"];
    t["split"] = "test";
    t["iteration"] = sum.value("iterations", 0LL);
    t["step"] = sum.value("steps", 0LL);
    for (const auto& [k, v] : sum["test"].items())
      if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
    evals.push_back(t);
  }
  if (evals.empty()) return "<h2>Evaluations</h2>\n<p class='note'>No evaluations in this run.</p>\n";
  std::ostringstream h;
  h << "<h2>Evaluations</h2>\n<table class='eval'>\n<tr><th>split</th><th>step</th><th>iteration</th><th>samples</th>";
  for (const auto& c : cols) h << "<th>" << escape(c) << "</th>";
  h << "</tr>\n";
  for (const auto& e : evals) {
    h << "<tr><td>" << escape(e.value("split", "")) << "</td><td class='n'>" << e.value("step", 0LL) << "</td><td class='n'>"
      << e.value("iteration", 0LL) << "</td><td class='n'>"
      << (e.contains("count") && e["count"].is_number() ? short_number(e["count"].get<double>(), 12) : std::string(""))
      << "</td>";
    for (const auto& c : cols) {
      double v;
      h << "<td class='n'>" << (number(e, c.c_str(), &v) ? short_number(v) : std::string("")) << "</td>";
    }
    h << "</tr>\n";
  }
  h << "</table>\n";
  return h.str();
}

// ---- the charts -----------------------------------------------------------------------------

/// (iteration, value) of every train line with a finite `key`.
svg::Points train_series(const Run& r, const char* key) {
  svg::Points pts;
  for (const auto& t : r.train) {
    double x, v;
    if (number(t, "iteration", &x) && number(t, key, &v)) pts.emplace_back(x, v);
  }
  return pts;
}

/// (iteration, value) of every evaluation of `split` with a finite `key`.
svg::Points eval_series(const Run& r, const std::string& split, const std::string& key) {
  svg::Points pts;
  for (const auto& e : r.eval) {
    double x, v;
    if (e.value("split", "") == split && number(e, "iteration", &x) && number(e, key.c_str(), &v)) pts.emplace_back(x, v);
  }
  return pts;
}

std::vector<std::string> eval_splits(const Run& r) {
  std::vector<std::string> splits;
  for (const auto& e : r.eval) {
    const std::string s = e.value("split", "");
    if (std::find(splits.begin(), splits.end(), s) == splits.end()) splits.push_back(s);
  }
  return splits;
}

std::string figure(const std::string& id, const svg::Chart& chart, double x_max) {
  return "<figure id='" + escape(id) + "'>" + svg::render_chart(chart, x_max) + "</figure>\n";
}

/// The training loss per update (faint) and as a moving average over 1/40 of the updates, and
/// every split's evaluated loss.
svg::Chart loss_chart(const Run& r, const Progress& progress) {
  svg::Chart c{"Loss: training and validation", "loss", {}, progress.skipped};
  const svg::Points train = train_series(r, "loss");
  c.series.push_back({"train (per update)", "#1f77b4", train, false, 0.3});
  c.series.push_back(
      {"train (moving average)", "#1f77b4", svg::moving_average(train, std::max<std::size_t>(1, train.size() / 40))});
  std::size_t color = 1;
  for (const auto& s : eval_splits(r)) {
    auto pts = eval_series(r, s, "loss");
    if (!pts.empty()) c.series.push_back({s + " loss", svg::palette(color++), pts, true});
  }
  return c;
}

/// One chart per evaluation metric but the loss (in the loss chart), one series per split.
std::string metric_figures(const Run& r, const Progress& progress, const std::vector<std::string>& metrics) {
  std::string out;
  for (const auto& m : metrics) {
    if (m == "loss") continue;
    svg::Chart c{"Evaluation: " + m, m, {}, progress.skipped};
    for (const auto& s : eval_splits(r)) {
      auto pts = eval_series(r, s, m);
      if (!pts.empty()) c.series.push_back({s, svg::palette(c.series.size()), pts, true});
    }
    if (!c.series.empty()) out += figure("metric-" + m, c, progress.max_iteration);
  }
  return out;
}

svg::Chart lr_chart(const Run& r, const Progress& progress) {
  svg::Chart c{"Learning rate per parameter group", "learning rate", {}, progress.skipped};
  const std::size_t groups = lr_groups(r);
  const auto names = group_names(r, groups);
  for (std::size_t g = 0; g < groups; ++g) {
    svg::Points pts;
    for (const auto& t : r.train) {
      double x;
      if (number(t, "iteration", &x) && t.contains("lr") && g < t["lr"].size() && t["lr"][g].is_number())
        pts.emplace_back(x, t["lr"][g].get<double>());
    }
    c.series.push_back({names[g], svg::palette(g), pts});
  }
  return c;
}

/// Throughput of the training steps over intervals of about 1/50 of the logged updates (at least
/// 5 where there are 30 or more). An interval with an evaluation in it is left out, and so is one
/// across a resume (the time goes back: a new process).
svg::Chart throughput_chart(const Run& r, const Progress& progress) {
  svg::Points pts;
  const std::size_t n = r.train.size();
  const std::size_t stride = std::max<std::size_t>({1, n / 50, std::min<std::size_t>(5, n / 6)});
  for (std::size_t i = stride; i < n; i += stride) {
    const json &a = r.train[i - stride], &b = r.train[i];
    double ta, tb, sa, sb, xa, xb;
    if (!(number(a, "time", &ta) && number(b, "time", &tb) && number(a, "samples", &sa) && number(b, "samples", &sb) &&
          number(a, "iteration", &xa) && number(b, "iteration", &xb) && tb > ta && sb > sa))
      continue;
    bool evaluated = false;
    for (const auto& e : r.eval) evaluated |= e.value("iteration", 0.0) >= xa && e.value("iteration", 0.0) < xb;
    if (!evaluated) pts.emplace_back(xb, (sb - sa) / (tb - ta));
  }
  return {"Throughput (training steps)", "samples/s", {{"samples/s", "#17becf", pts, pts.size() < 60}}, progress.skipped};
}

std::string plots_section(const Run& r, const Progress& progress, const std::vector<std::string>& metrics) {
  const double x_max = progress.max_iteration;
  std::string h = "<h2>Plots</h2>\n<p class='sub'>x: optimizer iteration. Red dashed lines: skipped updates (" +
                  std::to_string(progress.skipped.size()) + ").</p>\n";
  h += figure("loss", loss_chart(r, progress), x_max);
  h += metric_figures(r, progress, metrics);
  h += figure("lr", lr_chart(r, progress), x_max);
  svg::Chart norm{"Gradient norm before and after clipping", "L2 norm", {}, progress.skipped};
  norm.series.push_back({"before clipping", "#ff7f0e", train_series(r, "grad_norm")});
  norm.series.push_back({"after clipping", "#2ca02c", train_series(r, "grad_norm_clipped"), false, 1.0, true});
  h += figure("grad-norm", norm, x_max);
  // The scale chart only where a scaler ran; a run folder without an environment shows it when
  // the logged scale ever left 1.
  bool scaler = r.environment.is_object() && r.environment.value("grad_scaler", false);
  if (!r.environment.is_object())
    for (const auto& t : r.train) scaler |= t.value("scale", 1.0) != 1.0;
  if (scaler)
    h += figure(
        "loss-scale",
        {"Loss scale (gradient scaler)", "scale", {{"scale", "#9467bd", train_series(r, "scale")}}, progress.skipped, true},
        x_max);
  h += figure("throughput", throughput_chart(r, progress), x_max);
  return h;
}

std::string recipe_section(const Run& r) {
  if (!r.recipe.is_object()) return "<h2>Recipe</h2>\n<p class='note'>No recipe.json in the run folder.</p>\n";
  return "<h2>Recipe</h2>\n<pre>" + escape(r.recipe.dump(2)) + "</pre>\n";
}

std::string page(const Run& r, const fs::path& dir) {
  const Progress progress = progress_of(r);
  const std::vector<std::string> metrics = eval_metric_names(r);
  return page_header(r, dir) + summary_section(r, progress) + environment_section(r) + evaluations_section(r, metrics) +
         plots_section(r, progress, metrics) + recipe_section(r) + "</body></html>\n";
}

}  // namespace

void write_run_recipe(const fs::path& run_dir, const json& document) {
  fs::create_directories(run_dir);
  io::write_file_atomic(run_dir / "recipe.json", document.dump(2) + "\n");
}

void write_run_report(const fs::path& run_dir) {
  const Run r = read_run(run_dir);
  io::write_file_atomic(run_dir / "metrics.csv", metrics_csv(r));
  io::write_file_atomic(run_dir / "report.html", page(r, run_dir));
}

}  // namespace refit
