#include "callbacks/plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "callbacks/svg_chart.h"
#include "io/safetensors.h"
#include "refit/error.h"

namespace refit {

namespace {

/// The four panels of training.svg, filled line by line from metrics.jsonl.
struct TrainingPanels {
  svg::Chart loss{"Loss", "loss", {{"train", "#1f77b4", {}}}, {}};  // then one series per evaluated split
  svg::Chart lr{"Learning rate", "learning rate", {}, {}};
  svg::Chart norm{"Gradient norm (unscaled)",
                  "L2 norm",
                  {{"before clipping", "#9467bd", {}}, {"after clipping", "#8c564b", {}, false, 1.0, true}},
                  {},
                  true};
  svg::Chart scale{"Loss scale", "scale", {{"scale", "#d62728", {}}}, {}, true};
  double x_max = 0;

  void add(const nlohmann::json& line);
};

bool finite(const nlohmann::json& v) { return v.is_number() && std::isfinite(v.get<double>()); }

void TrainingPanels::add(const nlohmann::json& j) {
  const double it = j.value("iteration", 0.0);
  x_max = std::max(x_max, it);
  auto point = [&](svg::Series& s, const nlohmann::json& v) {
    if (finite(v)) s.points.emplace_back(it, v.get<double>());
  };
  if (j.value("kind", "") == "eval") {
    const std::string label = j.value("split", "eval") + " loss";
    auto s = std::find_if(loss.series.begin(), loss.series.end(), [&](const svg::Series& s) { return s.label == label; });
    if (s == loss.series.end()) s = loss.series.insert(s, {label, svg::palette(loss.series.size() + 2), {}, true});
    point(*s, j["loss"]);
    return;
  }
  point(loss.series[0], j["loss"]);
  if (j["lr"].is_array())  // one series per parameter group
    for (std::size_t g = 0; g < j["lr"].size(); ++g) {
      while (lr.series.size() <= g)
        lr.series.push_back({"group " + std::to_string(lr.series.size()), svg::palette(lr.series.size() + 2), {}});
      point(lr.series[g], j["lr"][g]);
    }
  point(norm.series[0], j["grad_norm"]);
  point(norm.series[1], j["grad_norm_clipped"]);
  point(scale.series[0], j["scale"]);
  if (j.value("skipped", false))
    for (svg::Chart* c : {&loss, &norm, &scale}) c->skipped.push_back(it);
}

}  // namespace

void write_training_plot(const std::filesystem::path& metrics_jsonl, const std::filesystem::path& svg_path) {
  std::ifstream in(metrics_jsonl);
  if (!in) throw Error("cannot read " + metrics_jsonl.string());
  TrainingPanels panels;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) panels.add(j);
  }
  if (panels.lr.series.size() == 1) panels.lr.series[0].label = "lr";
  const std::size_t skipped = panels.norm.skipped.size();
  const std::string note = skipped ? "red dashed lines: skipped updates (" + std::to_string(skipped) + ")" : "";
  io::write_file_atomic(svg_path, svg::chart_document({panels.loss, panels.lr, panels.norm, panels.scale}, panels.x_max, 920,
                                                      230, note));
}

}  // namespace refit
