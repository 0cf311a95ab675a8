#include "callbacks/plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "refit/error.h"

namespace refit {

namespace {

struct PlotSeries {
  std::string label, color;
  std::vector<std::pair<double, double>> points;  // (iteration, value), finite values only
  bool dashed = false;
};

struct Panel {
  std::string title;
  std::vector<PlotSeries> series;
  bool log_y = false;
  std::vector<double> marks;  // x positions of skipped updates
};

std::string num(double v) {
  std::ostringstream os;
  os.precision(4);
  os << v;
  return os.str();
}

void draw(std::ostringstream& svg, const Panel& p, double top, double x_max) {
  const double left = 70, width = 820, height = 150;
  double lo = INFINITY, hi = -INFINITY;
  auto ty = [&](double v) { return p.log_y ? std::log10(std::max(v, 1e-30)) : v; };
  for (const auto& s : p.series)
    for (const auto& pt : s.points) lo = std::min(lo, ty(pt.second)), hi = std::max(hi, ty(pt.second));
  svg << "<text x='" << left << "' y='" << top - 8 << "' font-size='14' font-weight='bold'>" << p.title << "</text>\n";
  svg << "<rect x='" << left << "' y='" << top << "' width='" << width << "' height='" << height
      << "' fill='none' stroke='#999'/>\n";
  if (!std::isfinite(lo)) {
    svg << "<text x='" << left + 10 << "' y='" << top + 20 << "' font-size='12' fill='#666'>no data</text>\n";
    return;
  }
  if (hi - lo < 1e-12) hi = lo + 1, lo = lo - 1;
  auto X = [&](double x) { return left + width * (x_max > 0 ? x / x_max : 0); };
  auto Y = [&](double v) { return top + height - height * (ty(v) - lo) / (hi - lo); };
  auto label = [&](double t) { return p.log_y ? num(std::pow(10, t)) : num(t); };
  svg << "<text x='" << left - 6 << "' y='" << top + 10 << "' font-size='11' text-anchor='end'>" << label(hi) << "</text>\n";
  svg << "<text x='" << left - 6 << "' y='" << top + height << "' font-size='11' text-anchor='end'>" << label(lo)
      << "</text>\n";
  for (double m : p.marks)
    svg << "<line x1='" << X(m) << "' x2='" << X(m) << "' y1='" << top << "' y2='" << top + height
        << "' stroke='#e33' stroke-opacity='0.35'/>\n";
  double legend_x = left + width - 10;
  for (auto it = p.series.rbegin(); it != p.series.rend(); ++it) {
    const PlotSeries& s = *it;
    if (s.points.empty()) continue;
    svg << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.5'" << (s.dashed ? " stroke-dasharray='4 3'" : "")
        << " points='";
    for (const auto& pt : s.points) svg << X(pt.first) << "," << Y(pt.second) << " ";
    svg << "'/>\n";
    svg << "<text x='" << legend_x << "' y='" << top + 14 << "' font-size='11' text-anchor='end' fill='" << s.color
        << "'>" << s.label << "</text>\n";
    legend_x -= 12 + 7 * static_cast<double>(s.label.size());
  }
}

}  // namespace

void write_training_plot(const std::filesystem::path& metrics_jsonl, const std::filesystem::path& svg_path) {
  std::ifstream in(metrics_jsonl);
  if (!in) throw Error("cannot read " + metrics_jsonl.string());
  Panel loss{"loss", {{"train", "#1f77b4", {}}, {"val", "#ff7f0e", {}}}, false, {}};
  Panel lr{"learning rate", {{"lr", "#2ca02c", {}}}, false, {}};
  Panel norm{"gradient norm (unscaled)", {{"before clipping", "#9467bd", {}}, {"after", "#8c564b", {}, true}}, true, {}};
  Panel scale{"loss scale", {{"scale", "#d62728", {}}}, true, {}};
  double x_max = 0;
  std::string line;
  auto finite = [](const nlohmann::json& v) { return v.is_number() && std::isfinite(v.get<double>()); };
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    double it = j.value("iteration", 0.0);
    x_max = std::max(x_max, it);
    if (j.value("kind", "") == "eval") {
      if (finite(j["loss"])) loss.series[1].points.emplace_back(it, j["loss"].get<double>());
      continue;
    }
    if (finite(j["loss"])) loss.series[0].points.emplace_back(it, j["loss"].get<double>());
    if (j["lr"].is_array() && !j["lr"].empty() && finite(j["lr"][0])) lr.series[0].points.emplace_back(it, j["lr"][0].get<double>());
    if (finite(j["grad_norm"])) norm.series[0].points.emplace_back(it, j["grad_norm"].get<double>());
    if (finite(j["grad_norm_clipped"])) norm.series[1].points.emplace_back(it, j["grad_norm_clipped"].get<double>());
    if (finite(j["scale"])) scale.series[0].points.emplace_back(it, j["scale"].get<double>());
    if (j.value("skipped", false)) {
      norm.marks.push_back(it);
      scale.marks.push_back(it);
      loss.marks.push_back(it);
    }
  }
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='920' height='840' font-family='sans-serif'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n";
  double top = 30;
  for (const Panel* p : {&loss, &lr, &norm, &scale}) {
    draw(svg, *p, top, x_max);
    top += 200;
  }
  svg << "<text x='890' y='830' font-size='11' text-anchor='end'>optimizer iteration (0 – " << num(x_max)
      << "); red lines: skipped updates</text>\n</svg>\n";
  io::write_file_atomic(svg_path, svg.str());
}

}  // namespace refit
