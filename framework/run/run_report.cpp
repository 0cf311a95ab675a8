#include "run/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

std::string fmt(double v, int digits = 4) {
  if (!std::isfinite(v)) return "n/a";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string html(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string duration(double seconds) {
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh %02ldm %02lds", s / 3600, s / 60 % 60, s % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm %02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  return buf;
}

// ---- charts ---------------------------------------------------------------------------------

struct Series {
  std::string label, color;
  std::vector<std::pair<double, double>> points;  // (iteration, value), finite values only
  bool markers = false;                            // evaluations: points, joined
  double opacity = 1.0;
  bool dashed = false;
};

struct Chart {
  std::string id, title, y_label;
  std::vector<Series> series;
  std::vector<double> skipped;  // iterations of skipped updates, drawn as red lines
  bool log_y = false;           // a log10 axis (positive values only)
};

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

/// Tick positions at 1, 2 or 5 times a power of ten, about `target` of them over [lo, hi].
std::vector<double> ticks(double lo, double hi, int target, double* step_out) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  std::vector<double> out;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  *step_out = step;
  return out;
}

/// Widens [lo, hi] to whole ticks; a flat range gets a margin.
void nice_range(double& lo, double& hi) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
  double step;
  ticks(lo, hi, 5, &step);
  lo = std::floor(lo / step + 1e-9) * step;
  hi = std::ceil(hi / step - 1e-9) * step;
}

std::string render(const Chart& chart, double x_max) {
  const double W = 860, H = 300, left = 72, right = 16, top = 34, bottom = 44;
  const double pw = W - left - right, ph = H - top - bottom;
  Chart c = chart;
  if (c.log_y)
    for (auto& se : c.series) {
      std::vector<std::pair<double, double>> kept;
      for (const auto& p : se.points)
        if (p.second > 0) kept.emplace_back(p.first, std::log10(p.second));
      se.points = std::move(kept);
    }
  std::ostringstream s;
  s << "<figure id='" << c.id << "'><svg class='chart' xmlns='http://www.w3.org/2000/svg' width='" << W
    << "' height='" << H << "' viewBox='0 0 " << W << " " << H << "' role='img' aria-label='" << html(c.title)
    << "'>\n<text x='" << left << "' y='20' class='title'>" << html(c.title) << "</text>\n";
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& se : c.series)
    for (const auto& p : se.points) lo = std::min(lo, p.second), hi = std::max(hi, p.second);
  s << "<rect x='" << left << "' y='" << top << "' width='" << pw << "' height='" << ph << "' class='frame'/>\n";
  if (!std::isfinite(lo)) {
    s << "<text x='" << left + 12 << "' y='" << top + 24 << "' class='note'>no data</text>\n</svg></figure>\n";
    return s.str();
  }
  if (c.log_y) lo = std::floor(lo), hi = std::max(lo + 1, std::ceil(hi));  // whole decades
  else nice_range(lo, hi);
  double xlo = 0, xhi = std::max(1.0, x_max);
  nice_range(xlo, xhi);
  auto X = [&](double v) { return left + (v - xlo) / (xhi - xlo) * pw; };
  auto Y = [&](double v) { return top + ph - (v - lo) / (hi - lo) * ph; };
  double step;
  std::vector<double> y_ticks = ticks(lo, hi, 5, &step);
  if (c.log_y) {
    y_ticks.clear();
    const double every = std::ceil((hi - lo) / 8);
    for (double t = lo; t <= hi + 1e-9; t += every) y_ticks.push_back(t);
  }
  for (double t : y_ticks) {
    s << "<line x1='" << left << "' x2='" << left + pw << "' y1='" << Y(t) << "' y2='" << Y(t) << "' class='grid'/>"
      << "<line x1='" << left - 4 << "' x2='" << left << "' y1='" << Y(t) << "' y2='" << Y(t) << "' class='tick'/>"
      << "<text x='" << left - 7 << "' y='" << Y(t) + 4 << "' class='ylabel'>" << fmt(c.log_y ? std::pow(10.0, t) : t)
      << "</text>\n";
  }
  for (double t : ticks(xlo, xhi, 8, &step)) {
    s << "<line x1='" << X(t) << "' x2='" << X(t) << "' y1='" << top << "' y2='" << top + ph << "' class='grid'/>"
      << "<line x1='" << X(t) << "' x2='" << X(t) << "' y1='" << top + ph << "' y2='" << top + ph + 4
      << "' class='tick'/>"
      << "<text x='" << X(t) << "' y='" << top + ph + 17 << "' class='xlabel'>" << fmt(t, 6) << "</text>\n";
  }
  s << "<text x='" << left + pw / 2 << "' y='" << H - 6 << "' class='axis'>optimizer iteration</text>\n"
    << "<text transform='translate(14," << top + ph / 2 << ") rotate(-90)' class='axis'>" << html(c.y_label)
    << (c.log_y ? " (log scale)" : "") << "</text>\n";
  for (double m : c.skipped)
    s << "<line x1='" << X(m) << "' x2='" << X(m) << "' y1='" << top << "' y2='" << top + ph << "' class='skip'/>\n";
  for (const Series& se : c.series) {  // in order: the last drawn on top
    if (se.points.empty()) continue;
    s << "<polyline fill='none' stroke='" << se.color << "' stroke-width='1.6' stroke-opacity='" << se.opacity << "'"
      << (se.dashed ? " stroke-dasharray='5 4'" : "") << " points='";
    for (const auto& p : se.points) s << fmt(X(p.first), 6) << "," << fmt(Y(p.second), 6) << " ";
    s << "'/>\n";
    if (se.markers)
      for (const auto& p : se.points)
        s << "<circle cx='" << fmt(X(p.first), 6) << "' cy='" << fmt(Y(p.second), 6) << "' r='3' fill='" << se.color
          << "'/>";
  }
  double legend_x = left + pw - 8;  // right-aligned, right to left
  for (auto it = c.series.rbegin(); it != c.series.rend(); ++it) {
    if (it->points.empty()) continue;
    s << "<text x='" << legend_x << "' y='" << top - 8 << "' class='legend' fill='" << it->color << "'>"
      << html(it->label) << "</text>\n";
    legend_x -= 12.0 + 6.5 * static_cast<double>(it->label.size());
  }
  s << "</svg></figure>\n";
  return s.str();
}

/// At most `keep` points: every n-th one, and the last.
std::vector<std::pair<double, double>> thin(const std::vector<std::pair<double, double>>& pts, std::size_t keep = 1500) {
  if (pts.size() <= keep) return pts;
  const std::size_t n = (pts.size() + keep - 1) / keep;
  std::vector<std::pair<double, double>> out;
  for (std::size_t i = 0; i < pts.size(); i += n) out.push_back(pts[i]);
  if (out.back() != pts.back()) out.push_back(pts.back());
  return out;
}

/// A trailing moving average over `window` points.
std::vector<std::pair<double, double>> smooth(const std::vector<std::pair<double, double>>& pts, std::size_t window) {
  std::vector<std::pair<double, double>> out;
  double sum = 0;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    sum += pts[i].second;
    if (i >= window) sum -= pts[i - window].second;
    out.emplace_back(pts[i].first, sum / static_cast<double>(std::min(i + 1, window)));
  }
  return out;
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
    else if (kind == "eval") r.eval.push_back(std::move(j));
  }
  r.summary = read_json_file(dir / "summary.json");
  r.recipe = read_json_file(dir / "recipe.json");
  if (r.summary.is_object() && r.summary.contains("environment")) r.environment = r.summary["environment"];
  return r;
}

bool metric_key(const std::string& k) {
  return k != "kind" && k != "split" && k != "step" && k != "iteration" && k != "count";
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
  std::size_t groups = 0;
  for (const auto& t : r.train)
    if (t.contains("lr") && t["lr"].is_array()) groups = std::max(groups, t["lr"].size());
  const auto names = group_names(r, groups);
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
        const std::size_t g = static_cast<std::size_t>(
            std::find(names.begin(), names.end(), cols[i].substr(3)) - names.begin());
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

const char* kStyle = R"(body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:900px;color:#222}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px}table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:10px 0}svg.chart{background:#fff;font-size:11px}.frame{fill:none;stroke:#999}.grid{stroke:#e6e6e6}.tick{stroke:#666}
.title{font-size:14px;font-weight:bold}.ylabel{text-anchor:end;fill:#444}.xlabel{text-anchor:middle;fill:#444}
.axis{text-anchor:middle;fill:#444;font-size:12px}.legend{text-anchor:end;font-size:12px}.note{fill:#888;font-size:12px}
.skip{stroke:#d62728;stroke-width:1;stroke-dasharray:3 3;stroke-opacity:0.7}
pre{background:#f7f7f7;border:1px solid #ddd;padding:8px;font-size:12px;overflow:auto;max-height:480px})";

std::string table(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string s = "<table>\n";
  for (const auto& [k, v] : rows) s += "<tr><th>" + html(k) + "</th><td>" + html(v) + "</td></tr>\n";
  return s + "</table>\n";
}

std::string page(const Run& r, const fs::path& dir) {
  std::ostringstream h;
  const std::string name = r.recipe.is_object() && r.recipe.contains("name") && r.recipe["name"].is_string()
                               ? r.recipe["name"].get<std::string>()
                               : dir.filename().string();
  const json& env = r.environment;
  const json& sum = r.summary;
  char when[64] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  h << "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>refit run: " << html(name)
    << "</title>\n<style>" << kStyle << "</style></head>\n<body>\n<h1>refit run: " << html(name) << "</h1>\n"
    << "<div class='sub'>" << html(fs::absolute(dir).lexically_normal().string()) << " · report written " << when
    << "</div>\n";

  // Summary.
  double max_iteration = 0, samples = 0;
  std::vector<double> skipped;
  for (const auto& t : r.train) {
    double v;
    if (number(t, "iteration", &v)) max_iteration = std::max(max_iteration, v);
    if (number(t, "samples", &v)) samples = v;
    if (t.value("skipped", false)) skipped.push_back(t.value("iteration", 0.0));
  }
  for (const auto& e : r.eval) max_iteration = std::max(max_iteration, e.value("iteration", 0.0));
  h << "<h2>Summary</h2>\n";
  std::vector<std::pair<std::string, std::string>> rows;
  if (!sum.is_object()) rows.emplace_back("state", "no summary.json: the run did not finish (or is still running)");
  if (sum.is_object()) {
    rows.emplace_back("steps (micro-batches)", std::to_string(sum.value("steps", 0LL)));
    rows.emplace_back("optimizer updates", std::to_string(sum.value("iterations", 0LL)) + " (" +
                                               std::to_string(sum.value("skipped_iterations", 0LL)) + " skipped)");
    const double seconds = sum.value("seconds", 0.0);
    rows.emplace_back("training time", duration(seconds));
    if (seconds > 0 && samples > 0) rows.emplace_back("mean throughput", fmt(samples / seconds) + " samples/s");
    if (sum.contains("cuda_graph") && sum["cuda_graph"].is_string())
      rows.emplace_back("CUDA graph", sum["cuda_graph"].get<std::string>());
    for (const char* split : {"val", "test"})
      if (sum.contains(split) && sum[split].is_object()) {
        std::string v;
        for (const auto& [k, m] : sum[split].items())  // a non-finite metric is null in JSON
          v += (v.empty() ? "" : ", ") + k + " " + (m.is_number() ? fmt(m.get<double>()) : std::string("n/a"));
        rows.emplace_back(std::string("final ") + split, v);
      }
  } else {
    rows.emplace_back("optimizer updates logged", fmt(max_iteration, 9));
  }
  rows.emplace_back("samples seen", fmt(samples, 12));
  h << table(rows);

  // Environment.
  h << "<h2>Environment</h2>\n";
  if (env.is_object()) {
    rows.clear();
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
    if (sum.contains("host_allocator")) {
      const json& ha = sum["host_allocator"];
      const double a = ha.value("allocations", 0.0), hits = ha.value("cache_hits", 0.0);
      rows.emplace_back("host allocation cache",
                        fmt(a, 12) + " CPU allocations, " + fmt(a > 0 ? 100.0 * hits / a : 0.0, 4) + " % from the cache");
    }
    add("host", "host");
    h << table(rows);
  } else {
    h << "<p class='note'>summary.json has no environment.</p>\n";
  }

  // Evaluations.
  h << "<h2>Evaluations</h2>\n";
  std::vector<std::string> cols;
  for (const auto& e : r.eval)
    for (const auto& [k, v] : e.items())
      if (metric_key(k) && std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
  std::vector<json> evals = r.eval;
  bool test_logged = false;
  for (const auto& e : evals) test_logged |= e.value("split", "") == "test";
  if (!test_logged && sum.is_object() && sum.contains("test") && sum["test"].is_object()) {
    json t = sum["test"];
    t["split"] = "test";
    t["iteration"] = sum.value("iterations", 0LL);
    t["step"] = sum.value("steps", 0LL);
    for (const auto& [k, v] : sum["test"].items())
      if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
    evals.push_back(t);
  }
  if (evals.empty()) {
    h << "<p class='note'>No evaluations in this run.</p>\n";
  } else {
    h << "<table class='eval'>\n<tr><th>split</th><th>step</th><th>iteration</th><th>samples</th>";
    for (const auto& c : cols) h << "<th>" << html(c) << "</th>";
    h << "</tr>\n";
    for (const auto& e : evals) {
      h << "<tr><td>" << html(e.value("split", "")) << "</td><td class='n'>" << e.value("step", 0LL)
        << "</td><td class='n'>" << e.value("iteration", 0LL) << "</td><td class='n'>"
        << (e.contains("count") && e["count"].is_number() ? fmt(e["count"].get<double>(), 12) : std::string(""))
        << "</td>";
      for (const auto& c : cols) {
        double v;
        h << "<td class='n'>" << (number(e, c.c_str(), &v) ? fmt(v) : std::string("")) << "</td>";
      }
      h << "</tr>\n";
    }
    h << "</table>\n";
  }

  // Plots.
  h << "<h2>Plots</h2>\n<p class='sub'>x: optimizer iteration. Red dashed lines: skipped updates ("
    << skipped.size() << ").</p>\n";
  auto series_of = [&](const char* key) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& t : r.train) {
      double x, v;
      if (number(t, "iteration", &x) && number(t, key, &v)) pts.emplace_back(x, v);
    }
    return pts;
  };
  auto eval_series = [&](const std::string& split, const std::string& key) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& e : r.eval) {
      double x, v;
      if (e.value("split", "") == split && number(e, "iteration", &x) && number(e, key.c_str(), &v))
        pts.emplace_back(x, v);
    }
    return pts;
  };
  std::vector<std::string> splits;
  for (const auto& e : r.eval) {
    const std::string s = e.value("split", "");
    if (std::find(splits.begin(), splits.end(), s) == splits.end()) splits.push_back(s);
  }

  Chart loss{"loss", "Loss: training and validation", "loss", {}, skipped};
  auto train_loss = series_of("loss");
  loss.series.push_back({"train (per update)", "#1f77b4", thin(train_loss), false, 0.3});
  loss.series.push_back(
      {"train (moving average)", "#1f77b4", thin(smooth(train_loss, std::max<std::size_t>(1, train_loss.size() / 40))), false, 1.0});
  std::size_t color = 1;
  for (const auto& s : splits) {
    auto pts = eval_series(s, "loss");
    if (!pts.empty()) loss.series.push_back({s + " loss", kColors[color++ % 8], pts, true, 1.0});
  }
  h << render(loss, max_iteration);

  std::vector<std::string> metric_names;
  for (const auto& c : cols)
    if (c != "loss") metric_names.push_back(c);
  for (const auto& m : metric_names) {
    Chart c{"metric-" + m, "Evaluation: " + m, m, {}, skipped};
    std::size_t k = 0;
    for (const auto& s : splits) {
      auto pts = eval_series(s, m);
      if (!pts.empty()) c.series.push_back({s, kColors[k++ % 8], pts, true, 1.0});
    }
    if (!c.series.empty()) h << render(c, max_iteration);
  }

  std::size_t groups = 0;
  for (const auto& t : r.train)
    if (t.contains("lr") && t["lr"].is_array()) groups = std::max(groups, t["lr"].size());
  const auto names = group_names(r, groups);
  Chart lr{"lr", "Learning rate per parameter group", "learning rate", {}, skipped};
  for (std::size_t g = 0; g < groups; ++g) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& t : r.train) {
      double x;
      if (number(t, "iteration", &x) && t.contains("lr") && g < t["lr"].size() && t["lr"][g].is_number())
        pts.emplace_back(x, t["lr"][g].get<double>());
    }
    lr.series.push_back({names[g], kColors[g % 8], thin(pts), false, 1.0});
  }
  h << render(lr, max_iteration);

  Chart norm{"grad-norm", "Gradient norm before and after clipping", "L2 norm", {}, skipped};
  norm.series.push_back({"before clipping", "#ff7f0e", thin(series_of("grad_norm")), false, 1.0});
  norm.series.push_back({"after clipping", "#2ca02c", thin(series_of("grad_norm_clipped")), false, 1.0, true});
  h << render(norm, max_iteration);

  bool scaler = env.is_object() && env.value("grad_scaler", false);
  if (!env.is_object())
    for (const auto& t : r.train) scaler |= t.value("scale", 1.0) != 1.0;
  if (scaler) {
    Chart scale{"loss-scale", "Loss scale (gradient scaler)", "scale", {}, skipped, true};
    scale.series.push_back({"scale", "#9467bd", thin(series_of("scale")), false, 1.0});
    h << render(scale, max_iteration);
  }

  // Throughput of the training steps over intervals of about 1/50 of the logged updates (at
  // least 5 where there are 30 or more). An interval with an evaluation in it is left out, and
  // so is one across a resume (the time goes back: a new process).
  Chart speed{"throughput", "Throughput (training steps)", "samples/s", {}, skipped};
  std::vector<std::pair<double, double>> pts;
  const std::size_t n = r.train.size();
  const std::size_t stride = std::max<std::size_t>({1, n / 50, std::min<std::size_t>(5, n / 6)});
  for (std::size_t i = stride; i < n; i += stride) {
    const json &a = r.train[i - stride], &b = r.train[i];
    double ta, tb, sa, sb, xa, xb;
    if (!(number(a, "time", &ta) && number(b, "time", &tb) && number(a, "samples", &sa) &&
          number(b, "samples", &sb) && number(a, "iteration", &xa) && number(b, "iteration", &xb) && tb > ta &&
          sb > sa))
      continue;
    bool evaluated = false;
    for (const auto& e : r.eval) evaluated |= e.value("iteration", 0.0) >= xa && e.value("iteration", 0.0) < xb;
    if (!evaluated) pts.emplace_back(xb, (sb - sa) / (tb - ta));
  }
  speed.series.push_back({"samples/s", "#17becf", pts, pts.size() < 60, 1.0});
  h << render(speed, max_iteration);

  h << "<h2>Recipe</h2>\n";
  if (r.recipe.is_object()) h << "<pre>" << html(r.recipe.dump(2)) << "</pre>\n";
  else h << "<p class='note'>No recipe.json in the run folder.</p>\n";
  h << "</body></html>\n";
  return h.str();
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
