#pragma once
// Line charts over optimizer iterations as SVG: the one renderer behind the training plot
// (training.svg) and the run report's charts (report.html). Light on purpose: no LibTorch, so the
// report's translation unit stays cheap to compile.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace refit::svg {

using Points = std::vector<std::pair<double, double>>;  // (iteration, value)

struct Series {
  std::string label, color;
  Points points;         // finite values only
  bool markers = false;  // a dot on every point (evaluations: few points, joined)
  double opacity = 1.0;
  bool dashed = false;
};

struct Chart {
  std::string title, y_label;
  std::vector<Series> series;   // drawn in order, the last on top
  std::vector<double> skipped;  // iterations of skipped updates, drawn as red dashed lines
  bool log_y = false;           // a log10 axis: points at or below 0 are left out
};

/// Where a chart goes: its size, and its corner when it is nested in another SVG.
struct Box {
  double x = 0, y = 0, width = 860, height = 300;
};

/// The style of the classes a chart's elements use. A page or document holding charts carries it
/// once (report.html in its <style>, chart_document in the SVG's).
extern const char* const kChartCss;

/// A colour for the i-th series of a chart that has no colour of its own (wraps after 8).
const char* palette(std::size_t i);

/// One chart as an `<svg class='chart'>` element, the x axis from 0 to `x_max`. A series of more
/// points than the plot is wide is thinned to every n-th point (and the last) first.
std::string render_chart(const Chart& chart, double x_max, const Box& box = {});

/// A standalone SVG document: the charts stacked top to bottom, each `width` x `chart_height`,
/// then `note` (when not empty) as a line at the bottom.
std::string chart_document(const std::vector<Chart>& charts, double x_max, double width, double chart_height,
                           const std::string& note);

/// A trailing moving average over `window` points.
Points moving_average(const Points& points, std::size_t window);

/// `v` with `digits` significant digits (printf's %g), "n/a" when not finite.
std::string short_number(double v, int digits = 4);

/// `text` with &, <, >, " and ' escaped for XML and HTML text and attributes.
std::string escape(const std::string& text);

}  // namespace refit::svg
