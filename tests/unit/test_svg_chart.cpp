// The one chart renderer (callbacks/svg_chart) and its two users: training.svg (write_training_plot)
// and report.html (write_run_report). Checks what a reader of the picture relies on: every series
// drawn with its legend, skipped updates marked, log axes without non-positive values, text
// escaped, long series thinned to about the plot's width, and both files holding their charts.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "callbacks/plot.h"
#include "callbacks/svg_chart.h"
#include "io/remove_tree.h"
#include "run/run_report.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_svg_chart {

using namespace refit;
namespace fs = std::filesystem;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The number of "x,y" pairs in the first polyline after `from`.
std::size_t polyline_points(const std::string& svg, std::size_t from = 0) {
  const std::size_t at = svg.find("points='", svg.find("<polyline", from)) + 8;
  const std::string pts = svg.substr(at, svg.find('\'', at) - at);
  return count(pts, ",");
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "refit-tests" / name;
  io::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("svg chart: series, legend, skipped updates and escaped text") {
  svg::Chart c{"a <title>", "y & z", {}, {3, 7}};
  c.series.push_back({"train", "#1f77b4", {{0, 1.0}, {5, 0.5}, {10, 0.25}}});
  c.series.push_back({"val's", "#ff7f0e", {{5, 0.6}, {10, 0.4}}, true});
  c.series.push_back({"empty", "#2ca02c", {}});
  const std::string s = svg::render_chart(c, 10);
  CHECK(s.rfind("<svg class='chart' xmlns='http://www.w3.org/2000/svg' width='860' height='300'", 0) == 0);
  CHECK(count(s, "<polyline") == 2);
  CHECK(count(s, "<circle") == 2);  // markers on the evaluations only
  CHECK(count(s, "class='skip'") == 2);
  CHECK(count(s, "class='legend'") == 2);  // an empty series has no legend entry
  CHECK(s.find(">val&#39;s</text>") != std::string::npos);
  CHECK(s.find("a &lt;title&gt;") != std::string::npos);
  CHECK(s.find("y &amp; z</text>") != std::string::npos);
  CHECK(s.find("<title>") == std::string::npos);
  CHECK(count(s, "class='xlabel'") >= 3);
  CHECK(count(s, "class='ylabel'") >= 3);
  CHECK(s.find("no data") == std::string::npos);
}

TEST_CASE("svg chart: without points it says so") {
  svg::Chart c{"empty", "y", {{"s", "#000", {}}}, {}};
  const std::string s = svg::render_chart(c, 0);
  CHECK(s.find("no data") != std::string::npos);
  CHECK(s.find("<polyline") == std::string::npos);
}

TEST_CASE("svg chart: values that differ by rounding only get a margin, not ticks too fine to reach the top") {
  // 40 samples per 0.5 s, with the times summed from 0.1 s steps: 80 samples/s give or take an ulp.
  svg::Chart c{"throughput", "samples/s", {{"s", "#000", {{1, 40 / (0.1 * 6 - 0.1)}, {2, 80.0}, {3, 40 / 0.5}}}}, {}};
  const std::string s = svg::render_chart(c, 3);
  CHECK(count(s, "class='ylabel'") <= 12);
  CHECK(s.find(">80</text>") != std::string::npos);
}

TEST_CASE("svg chart: a log axis leaves out values at or below 0 and labels decades") {
  svg::Chart c{"scale", "scale", {{"s", "#000", {{0, 0.0}, {1, -1.0}, {2, 10.0}, {3, 1000.0}}}}, {}, true};
  const std::string s = svg::render_chart(c, 3);
  CHECK(polyline_points(s) == 2);
  CHECK(s.find(">10</text>") != std::string::npos);
  CHECK(s.find(">1000</text>") != std::string::npos);
  CHECK(s.find("(log scale)") != std::string::npos);
}

TEST_CASE("svg chart: a long series is thinned to about twice the plot's width, keeping the last point") {
  svg::Points pts;
  for (int i = 0; i <= 100000; ++i) pts.emplace_back(i, std::sin(i * 0.001));
  const std::string s = svg::render_chart({"long", "y", {{"s", "#000", pts}}, {}}, 100000, {0, 0, 860, 300});
  const std::size_t n = polyline_points(s);
  CHECK(n <= 2 * (860 - 72 - 16) + 1);
  CHECK(n >= 700);
  // The last point lies on the right edge of the plot area (x = 860 - 16).
  CHECK(s.find("844,", s.find("<polyline")) != std::string::npos);
}

TEST_CASE("svg chart: moving average and number format") {
  const svg::Points avg = svg::moving_average({{0, 1}, {1, 3}, {2, 5}, {3, 7}}, 2);
  REQUIRE(avg.size() == 4);
  CHECK(avg[0].second == 1);
  CHECK(avg[1].second == 2);
  CHECK(avg[2].second == 4);
  CHECK(avg[3].second == 6);
  CHECK(svg::short_number(0.000123456) == "0.0001235");
  CHECK(svg::short_number(NAN) == "n/a");
}

TEST_CASE("svg chart: a document stacks its charts under one style") {
  svg::Chart a{"A", "a", {{"s", "#000", {{0, 1}, {1, 2}}}}, {}};
  const std::string doc = svg::chart_document({a, a, a}, 1, 920, 230, "a note");
  CHECK(doc.rfind("<svg xmlns='http://www.w3.org/2000/svg' width='920' height='714'", 0) == 0);
  CHECK(count(doc, "<style>") == 1);
  CHECK(count(doc, "<svg class='chart'") == 3);
  CHECK(doc.find("x='0' y='460' width='920' height='230'") != std::string::npos);
  CHECK(doc.find(">a note</text>") != std::string::npos);
  CHECK(count(doc, "<svg") == count(doc, "</svg>"));
}

TEST_CASE("training.svg: loss with evaluations, learning rate per group, gradient norm and scale") {
  const fs::path dir = fresh_dir("training-svg");
  {
    std::ofstream log(dir / "metrics.jsonl");
    log << R"({"kind":"train","step":1,"iteration":1,"loss":2.0,"lr":[0.1,0.01],"grad_norm":3.0,"grad_norm_clipped":1.0,"scale":65536,"skipped":false})"
        << "\n"
        << R"({"kind":"train","step":2,"iteration":2,"loss":null,"lr":[0.1,0.01],"grad_norm":null,"scale":32768,"skipped":true})"
        << "\n"
        << R"({"kind":"eval","split":"val","step":2,"iteration":2,"loss":1.5,"accuracy":0.5})"
        << "\n"
        << "not json\n"
        << R"({"kind":"train","step":3,"iteration":3,"loss":1.8,"lr":[0.09,0.009],"grad_norm":2.0,"grad_norm_clipped":1.0,"scale":32768,"skipped":false})"
        << "\n";
  }
  write_training_plot(dir / "metrics.jsonl", dir / "training.svg");
  const std::string s = read(dir / "training.svg");
  CHECK(count(s, "<svg class='chart'") == 4);
  CHECK(count(s, "<svg") == count(s, "</svg>"));
  for (const char* label : {">train</text>", ">val loss</text>", ">group 0</text>", ">group 1</text>",
                            ">before clipping</text>", ">after clipping</text>", ">scale</text>"})
    CHECK(s.find(label) != std::string::npos);
  CHECK(count(s, "class='skip'") == 3);  // loss, gradient norm and scale mark the skipped update
  CHECK(s.find("skipped updates (1)") != std::string::npos);
  CHECK(s.find("no data") == std::string::npos);
  CHECK_THROWS(write_training_plot(dir / "missing.jsonl", dir / "other.svg"));
}

TEST_CASE("report.html: one chart per figure, evaluation metrics charted, names escaped") {
  const fs::path dir = fresh_dir("run-report");
  {
    std::ofstream log(dir / "metrics.jsonl");
    for (int i = 1; i <= 40; ++i)
      log << R"({"kind":"train","step":)" << i << R"(,"iteration":)" << i << R"(,"samples":)" << 8 * i << R"(,"time":)"
          << 0.1 * i << R"(,"loss":)" << 2.0 / i << R"(,"lr":[0.1],"grad_norm":1.0,)"
          << R"("grad_norm_clipped":1.0,"scale":1.0,"skipped":)" << (i == 7 ? "true" : "false") << "}\n";
    log << R"({"kind":"eval","split":"val","step":20,"iteration":20,"count":16,"loss":0.5,"top<1>":0.75})"
        << "\n";
    log << R"({"kind":"eval","split":"val","step":40,"iteration":40,"count":16,"loss":0.4,"top<1>":0.8})"
        << "\n";
  }
  write_run_report(dir);
  const std::string h = read(dir / "report.html");
  const std::regex figure("<figure id='[^']*'><svg class='chart'");
  const auto figures = std::distance(std::sregex_iterator(h.begin(), h.end(), figure), std::sregex_iterator());
  CHECK(figures == static_cast<long>(count(h, "<figure")));
  CHECK(figures == 5);  // loss, top<1>, lr, gradient norm, throughput (no scaler: no scale chart)
  CHECK(count(h, "<svg class='chart'") == 5);
  CHECK(h.find("<figure id='metric-top&lt;1&gt;'>") != std::string::npos);
  CHECK(h.find("top<1>") == std::string::npos);
  CHECK(h.find("svg.chart{") != std::string::npos);  // the charts' style is in the page
  CHECK(count(h, "class='skip'") == 5);              // the skipped update in every chart
  for (const char* section : {"Summary", "Environment", "Evaluations", "Plots", "Recipe"})
    CHECK(h.find(std::string("<h2>") + section + "</h2>") != std::string::npos);
  CHECK(count(read(dir / "metrics.csv"), "\n") == 43);
}

}  // namespace refit_test_svg_chart
