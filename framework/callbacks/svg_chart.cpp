#include "callbacks/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace refit::svg {

const char* const kChartCss =
    R"(svg.chart{background:#fff;font-size:11px}.chart .frame{fill:none;stroke:#999}.chart .grid{stroke:#e6e6e6}
.chart .tick{stroke:#666}.chart .title{font-size:14px;font-weight:bold}.chart .ylabel{text-anchor:end;fill:#444}
.chart .xlabel{text-anchor:middle;fill:#444}.chart .axis{text-anchor:middle;fill:#444;font-size:12px}
.chart .legend{text-anchor:end;font-size:12px}.chart .note{fill:#888;font-size:12px}
.chart .skip{stroke:#d62728;stroke-width:1;stroke-dasharray:3 3;stroke-opacity:0.7})";

const char* palette(std::size_t i) {
  static const char* const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                       "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  return colors[i % 8];
}

std::string short_number(double v, int digits) {
  if (!std::isfinite(v)) return "n/a";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
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

Points moving_average(const Points& points, std::size_t window) {
  Points out;
  double sum = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    sum += points[i].second;
    if (i >= window) sum -= points[i - window].second;
    out.emplace_back(points[i].first, sum / static_cast<double>(std::min(i + 1, window)));
  }
  return out;
}

namespace {

// Margins around the plot area, in pixels: room for the title and legend above, tick labels and
// the axis names left and below.
constexpr double kLeft = 72, kRight = 16, kTop = 34, kBottom = 44;

/// Tick positions at 1, 2 or 5 times a power of ten, about `target` of them over [lo, hi].
std::vector<double> ticks(double lo, double hi, int target, double* step_out) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  std::vector<double> out;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9 && out.size() < 100; ++k)
    out.push_back(std::fabs(k) < 1e-9 ? 0.0 : k * step);
  *step_out = step;
  return out;
}

/// Widens [lo, hi] to whole ticks. A flat range gets a margin, and so does one narrower than a
/// few rounding errors of its values (a constant computed two ways): its ticks would be steps
/// too small to move a double.
void nice_range(double& lo, double& hi) {
  if (!(hi - lo > 1e-9 * std::max(std::fabs(lo), std::fabs(hi)))) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
  double step;
  ticks(lo, hi, 5, &step);
  lo = std::floor(lo / step + 1e-9) * step;
  hi = std::ceil(hi / step - 1e-9) * step;
}

/// At most `keep` points: every n-th one, and the last. A polyline of more points than pixels
/// only makes the file larger.
Points thin(const Points& points, std::size_t keep) {
  if (points.size() <= keep) return points;
  const std::size_t n = (points.size() + keep - 1) / keep;
  Points out;
  for (std::size_t i = 0; i < points.size(); i += n) out.push_back(points[i]);
  if (out.back() != points.back()) out.push_back(points.back());
  return out;
}

/// The plot area and the mapping of data to it. Values are on the axis's scale: log10 of the
/// data on a log axis.
struct Frame {
  double left, top, width, height;  // the plot area inside the chart's box
  double x_lo, x_hi, y_lo, y_hi;    // the axes' ranges
  double x(double v) const { return left + (v - x_lo) / (x_hi - x_lo) * width; }
  double y(double v) const { return top + height - (v - y_lo) / (y_hi - y_lo) * height; }
};

/// The series with their values on the y axis's scale, thinned to `keep` points.
std::vector<Series> on_axis_scale(const Chart& chart, std::size_t keep) {
  std::vector<Series> out = chart.series;
  for (Series& s : out) {
    if (chart.log_y) {
      Points kept;
      for (const auto& p : s.points)
        if (p.second > 0) kept.emplace_back(p.first, std::log10(p.second));
      s.points = std::move(kept);
    }
    s.points = thin(s.points, keep);
  }
  return out;
}

/// The y range over every point, widened to whole ticks (whole decades on a log axis); false when
/// there is no point.
bool y_range(const Chart& chart, const std::vector<Series>& series, double* lo, double* hi) {
  *lo = INFINITY, *hi = -INFINITY;
  for (const Series& s : series)
    for (const auto& p : s.points) *lo = std::min(*lo, p.second), *hi = std::max(*hi, p.second);
  if (!std::isfinite(*lo)) return false;
  if (chart.log_y) *lo = std::floor(*lo), *hi = std::max(*lo + 1, std::ceil(*hi));
  else
    nice_range(*lo, *hi);
  return true;
}

void draw_axes(std::ostringstream& s, const Chart& chart, const Frame& f, double box_height) {
  double step;
  std::vector<double> y_ticks;
  if (chart.log_y) {  // at most about 8 decades labelled
    const double every = std::ceil((f.y_hi - f.y_lo) / 8);
    for (double t = f.y_lo; t <= f.y_hi + 1e-9; t += every) y_ticks.push_back(t);
  } else {
    y_ticks = ticks(f.y_lo, f.y_hi, 5, &step);
  }
  const double right = f.left + f.width, bottom = f.top + f.height;
  for (double t : y_ticks) {
    const double y = f.y(t);
    s << "<line x1='" << f.left << "' x2='" << right << "' y1='" << y << "' y2='" << y << "' class='grid'/>"
      << "<line x1='" << f.left - 4 << "' x2='" << f.left << "' y1='" << y << "' y2='" << y << "' class='tick'/>"
      << "<text x='" << f.left - 7 << "' y='" << y + 4 << "' class='ylabel'>"
      << short_number(chart.log_y ? std::pow(10.0, t) : t) << "</text>\n";
  }
  for (double t : ticks(f.x_lo, f.x_hi, 8, &step)) {
    const double x = f.x(t);
    s << "<line x1='" << x << "' x2='" << x << "' y1='" << f.top << "' y2='" << bottom << "' class='grid'/>"
      << "<line x1='" << x << "' x2='" << x << "' y1='" << bottom << "' y2='" << bottom + 4 << "' class='tick'/>"
      << "<text x='" << x << "' y='" << bottom + 17 << "' class='xlabel'>" << short_number(t, 6) << "</text>\n";
  }
  s << "<text x='" << f.left + f.width / 2 << "' y='" << box_height - 6 << "' class='axis'>optimizer iteration</text>\n"
    << "<text transform='translate(14," << f.top + f.height / 2 << ") rotate(-90)' class='axis'>" << escape(chart.y_label)
    << (chart.log_y ? " (log scale)" : "") << "</text>\n";
}

void draw_series(std::ostringstream& s, const std::vector<Series>& series, const Frame& f) {
  for (const Series& se : series) {
    if (se.points.empty()) continue;
    s << "<polyline fill='none' stroke='" << se.color << "' stroke-width='1.6' stroke-opacity='" << se.opacity << "'"
      << (se.dashed ? " stroke-dasharray='5 4'" : "") << " points='";
    for (const auto& p : se.points) s << short_number(f.x(p.first), 6) << "," << short_number(f.y(p.second), 6) << " ";
    s << "'/>\n";
    if (se.markers)
      for (const auto& p : se.points)
        s << "<circle cx='" << short_number(f.x(p.first), 6) << "' cy='" << short_number(f.y(p.second), 6)
          << "' r='3' fill='" << se.color << "'/>";
  }
}

/// The labels of the series that have points, right-aligned above the plot, right to left.
void draw_legend(std::ostringstream& s, const std::vector<Series>& series, const Frame& f) {
  double x = f.left + f.width - 8;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    if (it->points.empty()) continue;
    s << "<text x='" << x << "' y='" << f.top - 8 << "' class='legend' fill='" << it->color << "'>" << escape(it->label)
      << "</text>\n";
    x -= 12.0 + 6.5 * static_cast<double>(it->label.size());
  }
}

}  // namespace

std::string render_chart(const Chart& chart, double x_max, const Box& box) {
  Frame f{kLeft, kTop, box.width - kLeft - kRight, box.height - kTop - kBottom, 0, std::max(1.0, x_max), 0, 0};
  std::ostringstream s;
  s << "<svg class='chart' xmlns='http://www.w3.org/2000/svg'";
  if (box.x != 0 || box.y != 0) s << " x='" << box.x << "' y='" << box.y << "'";
  s << " width='" << box.width << "' height='" << box.height << "' viewBox='0 0 " << box.width << " " << box.height
    << "' role='img' aria-label='" << escape(chart.title) << "'>\n<text x='" << f.left << "' y='20' class='title'>"
    << escape(chart.title) << "</text>\n<rect x='" << f.left << "' y='" << f.top << "' width='" << f.width << "' height='"
    << f.height << "' class='frame'/>\n";
  const std::vector<Series> series = on_axis_scale(chart, static_cast<std::size_t>(std::max(100.0, 2 * f.width)));
  if (!y_range(chart, series, &f.y_lo, &f.y_hi)) {
    s << "<text x='" << f.left + 12 << "' y='" << f.top + 24 << "' class='note'>no data</text>\n</svg>\n";
    return s.str();
  }
  nice_range(f.x_lo, f.x_hi);
  draw_axes(s, chart, f, box.height);
  for (double m : chart.skipped)
    s << "<line x1='" << f.x(m) << "' x2='" << f.x(m) << "' y1='" << f.top << "' y2='" << f.top + f.height
      << "' class='skip'/>\n";
  draw_series(s, series, f);
  draw_legend(s, series, f);
  s << "</svg>\n";
  return s.str();
}

std::string chart_document(const std::vector<Chart>& charts, double x_max, double width, double chart_height,
                           const std::string& note) {
  const double height = chart_height * static_cast<double>(charts.size()) + (note.empty() ? 0 : 24);
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height << "' viewBox='0 0 " << width
    << " " << height << "' font-family='sans-serif'>\n<style>" << kChartCss << "</style>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n";
  double y = 0;
  for (const Chart& c : charts) {
    s << render_chart(c, x_max, {0, y, width, chart_height});
    y += chart_height;
  }
  if (!note.empty())
    s << "<text x='" << width - 16 << "' y='" << height - 8 << "' font-size='11' text-anchor='end' fill='#444'>"
      << escape(note) << "</text>\n";
  s << "</svg>\n";
  return s.str();
}

}  // namespace refit::svg
