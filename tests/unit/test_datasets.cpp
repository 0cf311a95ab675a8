// The datasets plugin: Fashion-MNIST (IDX), CSV and image folders load the real files right;
// classes, split and limit select and relabel samples; transforms give the right shapes and are
// reproducible for a seed from several threads and new every epoch; multi-crop views are resized
// windows of the image like torchvision's RandomResizedCrop; every corrupt input is an error naming the file
// and the record or line. Fixtures are written into a temp folder by the tests themselves.
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <unistd.h>

#include <ATen/ATen.h>

#include "core/plugin_loader.h"
#include "io/remove_tree.h"
#include "data_support.h"
#include "test_support.h"

// stb_image_write, header-only from Debian's libstb-dev, with internal linkage: the plugin's
// stb (libstb.so) stays separate.
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_datasets {

using namespace refit;
using namespace refit::test;
namespace fs = std::filesystem;

namespace {

const fs::path kFashionRoot = "/usr/share/datasets/fashion-mnist";

/// The datasets plugin, loaded once for all tests.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    static PluginLoader loader(*reg);
    loader.load("datasets");
    return reg;
  }();
  return *r;
}

/// The problems parsing `config` records (empty when it parses).
std::vector<ConfigIssue> parse_issues(const std::string& type, const Json& config) {
  auto issues = std::make_shared<ConfigIssues>();
  ConfigReader c(config, "/config", issues);
  registry().datasets.parse(type, "/type", c);
  return issues->list();
}

/// Parses and builds (for a run whose /training/seed is `run_seed`); parse problems are thrown
/// as a ConfigError.
DatasetPtr build(const std::string& type, const Json& config, std::uint64_t run_seed = 0) {
  auto issues = std::make_shared<ConfigIssues>();
  ConfigReader c(config, "/config", issues);
  auto builder = registry().datasets.parse(type, "/type", c);
  issues->throw_if_any();
  REQUIRE(builder);
  BuildContext ctx;
  ctx.seed = run_seed;
  return builder(ctx);
}

/// A fresh folder for one test's fixtures, unique to this process (ctest runs test cases in
/// parallel, and other build trees may run the same tests), removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / "refit-tests" / ("datasets-" + std::to_string(::getpid())) / name) {
    if (fs::exists(path)) io::remove_tree(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    try {
      io::remove_tree(path);
      std::error_code ec;
      fs::remove(path.parent_path(), ec);  // only when no other test's folder is left in it
    } catch (...) {
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  operator const fs::path&() const { return path; }
  fs::path operator/(const std::string& p) const { return path / p; }
  std::string string() const { return path.string(); }
};

void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string be32(std::uint32_t v) { return {char(v >> 24), char((v >> 16) & 0xFF), char((v >> 8) & 0xFF), char(v & 0xFF)}; }

/// An IDX file image: magic, big-endian sizes, data.
std::string idx(std::uint32_t magic, const std::vector<std::uint32_t>& dims, const std::string& data) {
  std::string out = be32(magic);
  for (auto d : dims) out += be32(d);
  return out + data;
}

/// The first `n` images and labels of Fashion-MNIST's test split as raw bytes (from the plugin's
/// own decoding: images are stored as b / 255, which rounds back to b exactly).
std::pair<std::string, std::string> real_fashion_bytes(std::int64_t n) {
  auto ds = build("fashion_mnist", {{"split", "test"}, {"limit", n}});
  std::string images, labels;
  for (std::int64_t i = 0; i < n; ++i) {
    auto e = ds->get(i);
    auto b = (input_of(e) * 255).round().to(at::kByte).contiguous();
    images.append(reinterpret_cast<const char*>(b.data_ptr<std::uint8_t>()), 784);
    labels.push_back(static_cast<char>(label_of(e).item<std::int64_t>()));
  }
  return {images, labels};
}

/// Writes train-{images,labels} files in `root` and returns the error that building fails with.
std::string fashion_error(const fs::path& root, const std::string& images, const std::string& labels) {
  write_file(root / "train-images-idx3-ubyte", images);
  write_file(root / "train-labels-idx1-ubyte", labels);
  try {
    build("fashion_mnist", {{"root", root.string()}});
  } catch (const std::exception& e) {
    return e.what();
  }
  FAIL("no error for a corrupt Fashion-MNIST folder");
  return "";
}

std::map<std::int64_t, std::int64_t> histogram(const Dataset& ds) {
  std::map<std::int64_t, std::int64_t> h;
  for (std::int64_t i = 0; i < ds.size(); ++i) ++h[label_of(ds.get(i)).item<std::int64_t>()];
  return h;
}

std::vector<std::int64_t> shape_of(const at::Tensor& t) { return t.sizes().vec(); }

/// A PNG of h x w x c pixels.
std::string png(int w, int h, int c, const std::vector<unsigned char>& pixels) {
  std::string out;
  stbi_write_png_to_func([](void* ctx, void* data,
                            int size) { static_cast<std::string*>(ctx)->append(static_cast<char*>(data), size); },
                         &out, w, h, c, pixels.data(), w * c);
  REQUIRE(!out.empty());
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("fashion_mnist: the real test split loads 10000 images, 1000 of each class") {
  auto ds = build("fashion_mnist", {{"split", "test"}});
  REQUIRE(ds->size() == 10000);
  CHECK(ds->num_classes() == 10);
  CHECK(ds->describe() == "fashion_mnist test: 10000 samples, 10 classes, [1, 28, 28]");
  // The names Zalando publishes with the dataset, by label.
  const auto names = ds->class_names();
  REQUIRE(names.size() == 10);
  CHECK(names.front() == "T-shirt/top");
  CHECK(names[5] == "Sandal");
  CHECK(names.back() == "Ankle boot");
  auto h = histogram(*ds);
  CHECK(h.size() == 10);
  for (const auto& kv : h) CHECK(kv.second == 1000);

  auto e = ds->get(0);
  CHECK(input_of(e).scalar_type() == at::kFloat);
  CHECK(shape_of(input_of(e)) == std::vector<std::int64_t>{1, 28, 28});
  CHECK(label_of(e).dim() == 0);
  CHECK(label_of(e).scalar_type() == at::kLong);
  CHECK(label_of(e).item<std::int64_t>() == 9);  // the first test image is an ankle boot
  CHECK(input_of(e).min().item<float>() >= 0.0f);
  CHECK(input_of(e).max().item<float>() <= 1.0f);
  // Row 14 of the first image, as the file has it.
  const int row14[] = {0,   0,   0,   0,   0,   0,   2,   4,   1,   0,   0,   0,   98,  136,
                       110, 109, 110, 162, 135, 144, 149, 159, 167, 144, 158, 169, 119, 0};
  for (int x = 0; x < 28; ++x) CHECK(input_of(e)[0][14][x].item<float>() == static_cast<float>(row14[x]) / 255.0f);
  // "set" says the same as a string "split".
  CHECK(build("fashion_mnist", {{"set", "test"}, {"limit", 3}})->describe() ==
        "fashion_mnist test: 3 samples, 10 classes, [1, 28, 28], limit 3");
}

TEST_CASE("fashion_mnist: the real train split loads 60000 images quickly") {
  auto start = std::chrono::steady_clock::now();
  auto ds = build("fashion_mnist", Json::object());
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("loading the train split took " << seconds << " s");
  CHECK(ds->size() == 60000);
  CHECK(ds->describe() == "fashion_mnist train: 60000 samples, 10 classes, [1, 28, 28]");
  CHECK(seconds < 10.0);
  auto h = histogram(*ds);
  for (const auto& kv : h) CHECK(kv.second == 6000);
}

TEST_CASE("dataset classes: keep the listed classes, relabelled 0..k-1 in the order given") {
  auto ds = build("fashion_mnist", {{"split", "test"}, {"classes", {5, 6, 7, 8, 9}}});
  CHECK(ds->size() == 5000);
  CHECK(ds->num_classes() == 5);
  CHECK(ds->describe() == "fashion_mnist test: 5000 samples, classes [5,6,7,8,9] -> 5 classes, [1, 28, 28]");
  auto h = histogram(*ds);
  CHECK(h == std::map<std::int64_t, std::int64_t>{{0, 1000}, {1, 1000}, {2, 1000}, {3, 1000}, {4, 1000}});

  // [9, 0]: 9 -> 0 and 0 -> 1, in file order, with the same images.
  auto base = build("fashion_mnist", {{"split", "test"}, {"limit", 400}});
  auto sub = build("fashion_mnist", {{"split", "test"}, {"classes", {9, 0}}});
  CHECK(sub->num_classes() == 2);
  std::int64_t j = 0;
  for (std::int64_t i = 0; i < base->size(); ++i) {
    auto b = base->get(i);
    auto label = label_of(b).item<std::int64_t>();
    if (label != 9 && label != 0) continue;
    auto s = sub->get(j++);
    CHECK(label_of(s).item<std::int64_t>() == (label == 9 ? 0 : 1));
    CHECK(at::equal(input_of(s), input_of(b)));
  }
  CHECK(j > 50);

  // The synthetic dataset takes the same options.
  auto syn = build("synthetic", {{"num_classes", 4}, {"classes", {3, 1}}});
  CHECK(syn->num_classes() == 2);
  CHECK(syn->describe().rfind("synthetic: ", 0) == 0);
  CHECK(syn->describe().find("classes [3,1] -> 2 classes, [16]") != std::string::npos);
  for (const auto& kv : histogram(*syn)) CHECK((kv.first == 0 || kv.first == 1));
}

TEST_CASE("dataset split: the two parts are disjoint, cover the samples and are reproducible") {
  // Sample i has the single feature i, so every sample is recognisable.
  TempDir dir("split");
  std::string csv;
  for (int i = 0; i < 1000; ++i) csv += std::to_string(i) + "," + std::to_string(i % 3) + "\n";
  write_file(dir / "ids.csv", csv);
  auto ids = [](const Dataset& ds) {
    std::vector<std::int64_t> out;
    for (std::int64_t i = 0; i < ds.size(); ++i)
      out.push_back(static_cast<std::int64_t>(input_of(ds.get(i))[0].item<float>()));
    return out;
  };
  auto part = [&](const std::string& which, std::uint64_t seed, Json extra = Json::object()) {
    Json c = {{"path", (dir / "ids.csv").string()}, {"split", {{"fraction", 0.7}, {"part", which}, {"seed", seed}}}};
    c.update(extra);
    return build("csv", c);
  };

  auto first = part("first", 3), second = part("second", 3);
  CHECK(first->size() == 700);
  CHECK(second->size() == 300);
  auto a = ids(*first), b = ids(*second);
  std::set<std::int64_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  CHECK(all.size() == 1000);  // disjoint and covering
  CHECK(*all.begin() == 0);
  CHECK(*all.rbegin() == 999);
  CHECK(ids(*part("first", 3)) == a);  // the same seed gives the same samples in the same order
  CHECK(ids(*part("first", 4)) != a);  // another seed another split
  CHECK(first->describe().find("split first of fraction 0.7 (seed 3)") != std::string::npos);

  // After "classes": only the kept samples are split.
  Json only = {{"classes", {2, 0}}};
  auto f2 = part("first", 3, only), s2 = part("second", 3, only);
  CHECK(f2->size() + s2->size() == 667);
  CHECK(f2->size() == 467);
  std::set<std::int64_t> kept;
  for (auto id : ids(*f2)) kept.insert(id);
  for (auto id : ids(*s2)) CHECK(kept.insert(id).second);
  CHECK(kept.size() == 667);
  for (auto id : kept) CHECK(id % 3 != 1);
  for (std::int64_t i = 0; i < f2->size(); ++i) {
    auto e = f2->get(i);
    auto id = static_cast<std::int64_t>(input_of(e)[0].item<float>());
    CHECK(label_of(e).item<std::int64_t>() == (id % 3 == 2 ? 0 : 1));
  }

  // "limit" takes the first N of the part.
  auto limited = part("first", 3, {{"limit", 10}});
  CHECK(limited->size() == 10);
  CHECK(ids(*limited) == std::vector<std::int64_t>(a.begin(), a.begin() + 10));
}

TEST_CASE("dataset split: three parts (train, val, test) of one source, disjoint, covering and seeded") {
  TempDir dir("split3");
  std::string csv;
  for (int i = 0; i < 1000; ++i) csv += std::to_string(i) + "," + std::to_string(i % 3) + "\n";
  write_file(dir / "ids.csv", csv);
  auto ids = [&](Json split) {
    auto ds = build("csv", Json{{"path", (dir / "ids.csv").string()}, {"split", split}});
    std::vector<std::int64_t> out;
    for (std::int64_t i = 0; i < ds->size(); ++i)
      out.push_back(static_cast<std::int64_t>(input_of(ds->get(i))[0].item<float>()));
    return out;
  };
  auto part = [&](const char* which, std::uint64_t seed) {
    return ids({{"fractions", {0.8, 0.15, 0.05}}, {"part", which}, {"seed", seed}});
  };
  const auto train = part("train", 4), val = part("val", 4), test = part("test", 4);
  CHECK(train.size() == 800);
  CHECK(val.size() == 150);
  CHECK(test.size() == 50);
  std::set<std::int64_t> all;
  for (const auto* p : {&train, &val, &test})
    for (auto id : *p) CHECK(all.insert(id).second);  // disjoint
  CHECK(all.size() == 1000);                          // covering
  CHECK(part("val", 4) == val);
  CHECK(part("val", 5) != val);
  // One permutation for both forms: "train" of [0.8, ...] is "first" of 0.8.
  CHECK(ids({{"fraction", 0.8}, {"part", "first"}, {"seed", 4}}) == train);
  CHECK(build("csv", Json{{"path", (dir / "ids.csv").string()},
                          {"split", {{"fractions", {0.8, 0.15, 0.05}}, {"part", "test"}, {"seed", 4}}}})
            ->describe()
            .find("split test of 0.8/0.15/0.05 (seed 4)") != std::string::npos);
  const Json bad = {{"path", (dir / "ids.csv").string()}, {"split", {{"fractions", {0.8, 0.3}}, {"part", "dev"}}}};
  auto issues = parse_issues("csv", bad);
  CHECK_THAT(message_at(issues, "/config/split/fractions"), Catch::Contains("three non-negative fractions"));
  CHECK_THAT(message_at(issues, "/config/split/part"), Catch::Contains("expected one of train, val, test"));
}

TEST_CASE("dataset seeds: without their own, the transforms, crops, split and synthetic data follow /training/seed") {
  auto inputs = [](const Dataset& ds, std::int64_t epoch) {
    std::vector<at::Tensor> out;
    for (std::int64_t i = 0; i < ds.size(); ++i) out.push_back(input_of(ds.sample(i, epoch)));
    return out;
  };
  auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!at::equal(a[i], b[i])) return false;
    return true;
  };
  // Transforms and crops: run seed 0 is the former default seed 0; run seed 3 draws other crops.
  const Json pipeline = {{{"type", "random_crop"}, {"size", {28, 28}}, {"padding", 4}}, {{"type", "hflip"}}};
  const Json crops = {{"global_crops", 2}, {"global_size", {24, 24}}, {"local_crops", 2}, {"local_size", {12, 12}}};
  const Json unseeded = {{"split", "test"}, {"limit", 16}, {"transforms", pipeline}, {"multi_crop", crops}};
  Json zero = unseeded;
  zero["seed"] = 0;
  CHECK(same(inputs(*build("fashion_mnist", unseeded, 0), 1), inputs(*build("fashion_mnist", zero, 0), 1)));
  auto three = build("fashion_mnist", unseeded, 3);
  CHECK_FALSE(same(inputs(*three, 1), inputs(*build("fashion_mnist", unseeded, 0), 1)));
  CHECK_FALSE(at::equal(three->sample(0, 1).at("local_crop.0"),
                        build("fashion_mnist", unseeded, 0)->sample(0, 1).at("local_crop.0")));
  CHECK(three->describe().find("(seed 3)") != std::string::npos);
  // A dataset that sets its seed keeps it whatever the run's.
  Json five = unseeded;
  five["seed"] = 5;
  CHECK(same(inputs(*build("fashion_mnist", five, 3), 1), inputs(*build("fashion_mnist", five, 0), 1)));

  // The split: of the run's seed (or the dataset's seed) unless it sets its own; the two parts of
  // one run stay disjoint and covering.
  {
    TempDir dir("seeds");
    std::string csv;
    for (int i = 0; i < 200; ++i) csv += std::to_string(i) + "," + std::to_string(i % 3) + "\n";
    write_file(dir / "ids.csv", csv);
    auto ids = [&](const std::string& which, std::uint64_t run_seed, Json split_extra = Json::object(),
                   Json extra = Json::object()) {
      Json split = {{"fraction", 0.5}, {"part", which}};
      split.update(split_extra);
      Json c = {{"path", (dir / "ids.csv").string()}, {"split", split}};
      c.update(extra);
      auto ds = build("csv", c, run_seed);
      std::vector<std::int64_t> out;
      for (std::int64_t i = 0; i < ds->size(); ++i)
        out.push_back(static_cast<std::int64_t>(input_of(ds->get(i))[0].item<float>()));
      return out;
    };
    CHECK(ids("first", 0) == ids("first", 0, {{"seed", 0}}));  // run seed 0: the former default
    CHECK(ids("first", 3) != ids("first", 0));
    std::set<std::int64_t> all;
    for (const char* which : {"first", "second"})
      for (auto id : ids(which, 3)) CHECK(all.insert(id).second);
    CHECK(all.size() == 200);
    CHECK(ids("first", 3, {{"seed", 9}}) == ids("first", 0, {{"seed", 9}}));  // its own seed
    CHECK(ids("first", 3, Json::object(), {{"seed", 9}}) ==
          ids("first", 0, Json::object(), {{"seed", 9}}));  // the dataset's seed
  }

  // synthetic: the data itself (centres from the run's seed, samples from seed + 1) unless set.
  const Json small = {{"num_samples", 8}, {"num_features", 3}};
  Json former = small;
  former["seed"] = 0;
  former["sample_seed"] = 1;
  CHECK(same(inputs(*build("synthetic", small, 0), 0), inputs(*build("synthetic", former, 0), 0)));
  CHECK_FALSE(same(inputs(*build("synthetic", small, 3), 0), inputs(*build("synthetic", small, 0), 0)));
  CHECK(same(inputs(*build("synthetic", former, 3), 0), inputs(*build("synthetic", former, 0), 0)));
}

TEST_CASE("csv: sklearn's digits load as 1797 images of 1x8x8 scaled to 0..1") {
  const fs::path digits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
  // scripts/setup.sh installs python3-sklearn: a missing file is a broken setup, not a skip.
  INFO(digits << " is missing: install Debian's python3-sklearn (scripts/setup.sh does)");
  REQUIRE(fs::exists(digits));
  auto ds = build("csv", {{"path", digits.string()}, {"shape", {1, 8, 8}}, {"scale", 16}});
  REQUIRE(ds->size() == 1797);
  CHECK(ds->num_classes() == 10);
  CHECK(ds->describe() == "csv " + digits.string() + ": 1797 samples, 10 classes, [1, 8, 8]");
  auto e = ds->get(0);
  CHECK(shape_of(input_of(e)) == std::vector<std::int64_t>{1, 8, 8});
  CHECK(label_of(e).item<std::int64_t>() == 0);
  CHECK(input_of(e)[0][0][2].item<float>() == 5.0f / 16);  // the file's first row: 0,0,5,13,9,1,0,0,...
  CHECK(input_of(e)[0][0][3].item<float>() == 13.0f / 16);
  float lo = 1, hi = 0;
  for (std::int64_t i = 0; i < ds->size(); ++i) {
    auto x = input_of(ds->get(i));
    lo = std::min(lo, x.min().item<float>());
    hi = std::max(hi, x.max().item<float>());
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
  auto h = histogram(*ds);
  CHECK(h == std::map<std::int64_t, std::int64_t>{
                 {0, 178}, {1, 182}, {2, 177}, {3, 183}, {4, 181}, {5, 182}, {6, 181}, {7, 179}, {8, 174}, {9, 180}});
}

TEST_CASE("csv: header, label column, delimiter, quotes, blank lines and CRLF") {
  TempDir dir("csv");
  write_file(dir / "t.csv", "a;b;label;c\r\n1;2;3;4\r\n\r\n\"5\"; 6 ;0;-7.5\r\n");
  auto ds = build("csv", {{"path", (dir / "t.csv").string()}, {"header", true}, {"label_column", -2}, {"delimiter", ";"}});
  REQUIRE(ds->size() == 2);
  CHECK(ds->num_classes() == 4);
  CHECK(at::equal(input_of(ds->get(0)), at::tensor({1.0f, 2.0f, 4.0f})));
  CHECK(at::equal(input_of(ds->get(1)), at::tensor({5.0f, 6.0f, -7.5f})));
  CHECK(label_of(ds->get(0)).item<std::int64_t>() == 3);
  CHECK(label_of(ds->get(1)).item<std::int64_t>() == 0);
  // label_column 2 is the same column; num_classes can be given.
  auto ds2 = build(
      "csv",
      {{"path", (dir / "t.csv").string()}, {"header", true}, {"label_column", 2}, {"delimiter", ";"}, {"num_classes", 10}});
  CHECK(ds2->num_classes() == 10);
  CHECK(at::equal(input_of(ds2->get(1)), input_of(ds->get(1))));
  CHECK(ds2->class_names().empty());  // classes by index only
}

TEST_CASE("csv: \"label_column\": null reads rows without labels, every column a feature") {
  TempDir dir("csv-unlabelled");
  write_file(dir / "u.csv", "1,2,3\n4,5,6\n");
  auto ds = build("csv", {{"path", (dir / "u.csv").string()}, {"label_column", nullptr}});
  REQUIRE(ds->size() == 2);
  CHECK(ds->num_classes() == -1);
  CHECK(field_names(ds->fields()) == std::vector<std::string>{"features"});
  const Example e = ds->get(1);
  CHECK_FALSE(e.has("labels"));
  CHECK(at::equal(input_of(e), at::tensor({4.0f, 5.0f, 6.0f})));
  CHECK_THAT(ds->describe(), Catch::Contains("2 samples, no labels, [3]"));
  // Choosing classes needs labels.
  CHECK_THAT(error_of([&] {
               build("csv", {{"path", (dir / "u.csv").string()}, {"label_column", nullptr}, {"classes", {0}}});
             }),
             Catch::Contains("the samples have no labels to choose classes by"));
  // A single column is a feature vector of one.
  write_file(dir / "one.csv", "7\n8\n");
  CHECK(input_of(build("csv", {{"path", (dir / "one.csv").string()}, {"label_column", nullptr}})->get(0)).numel() == 1);
}

TEST_CASE("csv: a bad row is an error naming the file and the line") {
  TempDir dir("csv-bad");
  auto error = [&](const std::string& name, const std::string& text, Json extra = Json::object()) {
    write_file(dir / name, text);
    Json c = {{"path", (dir / name).string()}};
    c.update(extra);
    return error_of([&] { build("csv", c); });
  };
  const std::string f = (dir / "field.csv").string();
  CHECK_THAT(error("field.csv", "1,2,0\n3,4,1\n5,x,0\n"), Catch::Contains(f + ":3: column 2: \"x\" is not a number"));
  CHECK_THAT(error("cols.csv", "1,2,0\n3,4,1\n\n5,0\n"),
             Catch::Contains((dir / "cols.csv").string() + ":4: expected 3 columns (as on the first data line), got 2"));
  CHECK_THAT(error("label.csv", "1,2,0\n3,4,1.5\n"),
             Catch::Contains((dir / "label.csv").string() + ":2: column 3: label \"1.5\" is not a class index"));
  CHECK_THAT(error("neg.csv", "1,2,-1\n"), Catch::Contains("neg.csv:1: column 3: label \"-1\" is not a class index"));
  CHECK_THAT(error("empty.csv", "h1,h2\n", {{"header", true}}),
             Catch::Contains("empty.csv: no data rows after the header line"));
  CHECK_THAT(error("shape.csv", "1,2,3,0\n", {{"shape", {2, 2}}}),
             Catch::Contains("shape.csv: shape [2, 2] has 4 elements but the rows have 3 features"));
  CHECK_THAT(error("range.csv", "1,2,5\n", {{"num_classes", 3}}),
             Catch::Contains("range.csv:1: label 5 is out of range for num_classes 3"));
  CHECK_THAT(error("col.csv", "1,2,5\n", {{"label_column", 3}}),
             Catch::Contains("col.csv: label_column 3 is out of range for 3 columns"));
  // gzipped: a truncated stream is reported, not read as a short file.
  const std::string digits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
  if (fs::exists(digits)) {
    write_file(dir / "cut.csv.gz", file_bytes(digits).substr(0, 3000));
    CHECK_THAT(error_of([&] {
                 build("csv", {{"path", (dir / "cut.csv.gz").string()}});
               }),
               Catch::Contains("cut.csv.gz: corrupt or truncated gzip data") && Catch::Contains("unexpected end of file"));
  }
}

TEST_CASE("fashion_mnist: corrupt files are errors naming the file and the record") {
  auto [images, labels] = real_fashion_bytes(100);
  TempDir root("fashion-bad");
  const std::string image_file = (root / "train-images-idx3-ubyte").string();
  const std::string label_file = (root / "train-labels-idx1-ubyte").string();
  const std::string good_images = idx(0x803, {100, 28, 28}, images), good_labels = idx(0x801, {100}, labels);

  SECTION("the uncompressed slice itself loads") {
    write_file(root / "train-images-idx3-ubyte", good_images);
    write_file(root / "train-labels-idx1-ubyte", good_labels);
    auto ds = build("fashion_mnist", {{"root", root.string()}});
    CHECK(ds->size() == 100);
    CHECK(label_of(ds->get(0)).item<std::int64_t>() == 9);
  }
  SECTION("truncated image data names the image") {
    auto msg = fashion_error(root, good_images.substr(0, 16 + 57 * 784 + 300), good_labels);
    CHECK_THAT(msg, Catch::Contains(image_file + ": truncated: the header announces 100 images of 784 bytes") &&
                        Catch::Contains("ends at offset " + std::to_string(16 + 57 * 784 + 300) + ", in image 57") &&
                        Catch::Contains("starts at offset " + std::to_string(16 + 57 * 784)));
  }
  SECTION("a truncated header") {
    CHECK_THAT(fashion_error(root, good_images.substr(0, 10), good_labels),
               Catch::Contains(image_file + ": truncated IDX header: 10 bytes, expected 16"));
  }
  SECTION("a wrong magic number") {
    CHECK_THAT(fashion_error(root, idx(0x801, {100, 28, 28}, images), good_labels),
               Catch::Contains(image_file + ": bad IDX magic number 0x00000801 at offset 0") &&
                   Catch::Contains("expected 0x00000803"));
    CHECK_THAT(fashion_error(root, good_images, idx(0x0D01, {100}, labels)),
               Catch::Contains(label_file + ": bad IDX magic number 0x00000D01") && Catch::Contains("data type 0x0D"));
  }
  SECTION("label and image counts disagree") {
    CHECK_THAT(fashion_error(root, good_images, idx(0x801, {99}, labels.substr(0, 99))),
               Catch::Contains(label_file + " has 99 labels but " + image_file + " has 100 images"));
  }
  SECTION("a label out of range names its record and offset") {
    std::string bad = labels;
    bad[5] = 12;
    CHECK_THAT(fashion_error(root, good_images, idx(0x801, {100}, bad)),
               Catch::Contains(label_file + ": label 12 of record 5 (offset 13) is not a class index in [0, 9]"));
  }
  SECTION("bytes after the last record") {
    CHECK_THAT(fashion_error(root, good_images + "xyz", good_labels),
               Catch::Contains(image_file + ": 3 unexpected bytes after the last image"));
  }
  SECTION("images that are not 28x28") {
    CHECK_THAT(fashion_error(root, idx(0x803, {100, 56, 14}, images), good_labels),
               Catch::Contains(image_file + ": expected 28x28 images, the header says 56x14"));
  }
  SECTION("a truncated gzip file (a slice of the real one)") {
    write_file(root / "train-images-idx3-ubyte.gz",
               file_bytes(kFashionRoot / "t10k-images-idx3-ubyte.gz").substr(0, 100000));
    write_file(root / "train-labels-idx1-ubyte.gz", file_bytes(kFashionRoot / "t10k-labels-idx1-ubyte.gz"));
    auto msg = error_of([&] { build("fashion_mnist", {{"root", root.string()}}); });
    CHECK_THAT(msg, Catch::Contains(image_file + ".gz: truncated: the header announces 10000 images") &&
                        Catch::Contains("corrupt or truncated gzip data (zlib: unexpected end of file)"));
  }
  SECTION("missing files list the names tried") {
    CHECK_THAT(error_of([&] {
                 build("fashion_mnist", {{"root", root.string()}});
               }),
               Catch::Contains("no train images in " + root.string()) && Catch::Contains(image_file + ".gz"));
  }
}

TEST_CASE("image_folder: classes are the sorted folder names, with RGB, grayscale and resizing") {
  TempDir root("images");
  // cat/b.png: gray levels 10, 20, 30, 40; cat/c.png: RGB; dog/a.jpg: a flat colour (JPEG).
  write_file(root / "cat" / "b.png", png(2, 2, 1, {10, 20, 30, 40}));
  write_file(root / "cat" / "c.png", png(2, 2, 3, {255, 0, 0, 0, 255, 0, 0, 0, 255, 7, 7, 7}));
  std::vector<unsigned char> flat(8 * 8 * 3);
  for (std::size_t i = 0; i < flat.size(); i += 3) flat[i] = 200, flat[i + 1] = 100, flat[i + 2] = 50;
  std::string jpg;
  stbi_write_jpg_to_func([](void* ctx, void* d, int n) { static_cast<std::string*>(ctx)->append(static_cast<char*>(d), n); },
                         &jpg, 8, 8, 3, flat.data(), 95);
  write_file(root / "dog" / "a.JPG", jpg);
  write_file(root / "cat" / "notes.txt", "not an image");
  write_file(root / ".cache" / "x.png", "ignored: hidden");
  write_file(root / "cat" / ".hidden.png", "ignored: hidden");

  auto rgb = build("image_folder", {{"root", root.string()}, {"size", {2, 2}}});
  REQUIRE(rgb->size() == 3);
  CHECK(rgb->num_classes() == 2);
  CHECK(rgb->describe() == "image_folder " + root.string() + ": 3 samples, 2 classes, [3, 2, 2]");
  CHECK(label_of(rgb->get(0)).item<std::int64_t>() == 0);  // cat/b.png
  CHECK(label_of(rgb->get(1)).item<std::int64_t>() == 0);  // cat/c.png
  CHECK(label_of(rgb->get(2)).item<std::int64_t>() == 1);  // dog/a.JPG
  // Grayscale becomes three equal channels; RGB pixels are exact.
  auto b = input_of(rgb->get(0));
  CHECK(shape_of(b) == std::vector<std::int64_t>{3, 2, 2});
  for (int ch = 0; ch < 3; ++ch) CHECK(at::equal(b[ch], at::tensor({10.0f, 20.0f, 30.0f, 40.0f}).reshape({2, 2}) / 255.0f));
  auto c = input_of(rgb->get(1));
  CHECK(c[0][0][0].item<float>() == 1.0f);
  CHECK(c[1][0][0].item<float>() == 0.0f);
  CHECK(c[1][0][1].item<float>() == 1.0f);
  CHECK(c[2][1][0].item<float>() == 1.0f);
  CHECK(c[0][1][1].item<float>() == 7.0f / 255.0f);
  // The 8x8 JPEG is resized to 2x2; a flat colour stays (nearly) flat.
  auto a = input_of(rgb->get(2));
  CHECK(shape_of(a) == std::vector<std::int64_t>{3, 2, 2});
  CHECK(at::allclose(a[0], at::full({2, 2}, 200.0f / 255), 0, 3.0 / 255));
  CHECK(at::allclose(a[2], at::full({2, 2}, 50.0f / 255), 0, 3.0 / 255));

  auto gray = build("image_folder", {{"root", root.string()}, {"size", {4, 6}}, {"channels", 1}});
  CHECK(shape_of(input_of(gray->get(0))) == std::vector<std::int64_t>{1, 4, 6});
  CHECK(shape_of(input_of(gray->get(2))) == std::vector<std::int64_t>{1, 4, 6});
  auto g = input_of(build("image_folder", {{"root", root.string()}, {"size", {2, 2}}, {"channels", 1}})->get(0));
  CHECK(at::equal(g[0], at::tensor({10.0f, 20.0f, 30.0f, 40.0f}).reshape({2, 2}) / 255.0f));

  // The common options work on folders too.
  auto dogs = build("image_folder", {{"root", root.string()}, {"size", {2, 2}}, {"classes", {1}}});
  CHECK(dogs->size() == 1);
  CHECK(label_of(dogs->get(0)).item<std::int64_t>() == 0);
  CHECK(dogs->num_classes() == 1);
  CHECK_THAT(error_of([&] {
               build("image_folder", {{"root", root.string()}, {"size", {2, 2}}, {"classes", {2}}});
             }),
             Catch::Contains("class 2 does not exist (the dataset has 2 classes, 0..1)"));
  // The classes' names: the folders', and through a view the kept ones in the view's order.
  CHECK(rgb->class_names() == std::vector<std::string>{"cat", "dog"});
  CHECK(dogs->class_names() == std::vector<std::string>{"dog"});
  auto swapped = build("image_folder", {{"root", root.string()}, {"size", {2, 2}}, {"classes", {1, 0}}});
  CHECK(swapped->class_names() == std::vector<std::string>{"dog", "cat"});
  CHECK(label_of(swapped->get(0)).item<std::int64_t>() == 1);  // cat/b.png: "cat" is now class 1
}

TEST_CASE("image_folder: a corrupt image is an error naming the file") {
  TempDir root("images-bad");
  std::vector<unsigned char> noise(64 * 64 * 3);
  for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  const std::string good = png(64, 64, 3, noise);
  write_file(root / "a" / "good.png", good);

  SECTION("not an image at all: found when the folder is listed") {
    write_file(root / "b" / "broken.png", "this is not a PNG file");
    CHECK_THAT(error_of([&] {
                 build("image_folder", {{"root", root.string()}, {"size", {8, 8}}});
               }),
               Catch::Contains((root / "b" / "broken.png").string() + ": not a readable image (stb_image:"));
  }
  SECTION("a truncated PNG with a valid header: found when the image is decoded") {
    write_file(root / "b" / "cut.png", good.substr(0, good.size() / 2));
    auto ds = build("image_folder", {{"root", root.string()}, {"size", {8, 8}}});
    CHECK(input_of(ds->get(0)).size(0) == 3);
    CHECK_THAT(error_of([&] { ds->get(1); }),
               Catch::Contains((root / "b" / "cut.png").string() + ": cannot decode the image (stb_image:"));
  }
  SECTION("a class folder without images") {
    fs::create_directories(root / "empty");
    CHECK_THAT(error_of([&] {
                 build("image_folder", {{"root", root.string()}, {"size", {8, 8}}});
               }),
               Catch::Contains("class folder " + (root / "empty").string() + " has no image files"));
  }
}

TEST_CASE("dataset transforms: output shapes, exact values, and the same draws for the same seed from any thread") {
  const Json base = {{"split", "test"}, {"limit", 64}};
  auto plain = build("fashion_mnist", base);
  auto with = [&](Json transforms, std::uint64_t seed = 7) {
    Json c = base;
    c["transforms"] = std::move(transforms);
    c["seed"] = seed;
    return build("fashion_mnist", c);
  };

  // Deterministic transforms, exactly.
  auto norm = with({{{"type", "normalize"}, {"mean", {0.5}}, {"std", {0.25}}}});
  CHECK(at::allclose(input_of(norm->get(3)), (input_of(plain->get(3)) - 0.5) / 0.25));
  auto flip = with({{{"type", "hflip"}, {"p", 1.0}}});
  CHECK(at::equal(input_of(flip->get(3)), input_of(plain->get(3)).flip({-1})));
  auto crop_all = with({{{"type", "random_crop"}, {"size", {28, 28}}}});
  CHECK(at::equal(input_of(crop_all->get(3)), input_of(plain->get(3))));
  auto big = with({{{"type", "resize"}, {"size", {56, 40}}}});
  CHECK(shape_of(input_of(big->get(0))) == std::vector<std::int64_t>{1, 56, 40});
  auto small = with({{{"type", "resize"}, {"size", {14, 14}}, {"antialias", false}}});
  CHECK(at::allclose(input_of(small->get(0)),
                     at::upsample_bilinear2d(input_of(plain->get(0)).unsqueeze(0), {14, 14}, false).squeeze(0)));

  // A random pipeline.
  const Json pipeline = {{{"type", "random_crop"}, {"size", {28, 28}}, {"padding", 4}},
                         {{"type", "hflip"}, {"p", 0.5}},
                         {{"type", "resize"}, {"size", {32, 32}}},
                         {{"type", "normalize"}, {"mean", {0.2860}}, {"std", {0.3530}}}};
  auto a = with(pipeline, 7), a2 = with(pipeline, 7), other = with(pipeline, 8);
  CHECK(a->describe() == "fashion_mnist test: 64 samples, 10 classes, [1, 32, 32], limit 64, transforms: random_crop 28x28 "
                         "pad 4, hflip p=0.5, resize 32x32, normalize mean [0.286] std [0.353] (seed 7)");
  std::vector<at::Tensor> serial;
  bool differs = false;
  for (std::int64_t i = 0; i < a->size(); ++i) {
    auto x = input_of(a->get(i));
    CHECK(shape_of(x) == std::vector<std::int64_t>{1, 32, 32});
    CHECK(at::equal(x, input_of(a->get(i))));   // the same draws every time
    CHECK(at::equal(x, input_of(a2->get(i))));  // and in another dataset with the same seed
    differs = differs || !at::equal(x, input_of(other->get(i)));
    serial.push_back(x);
  }
  CHECK(differs);

  // hflip with p = 0.5 flips some samples and not others.
  auto half = with({{{"type", "hflip"}}});
  int flipped = 0, kept = 0;
  for (std::int64_t i = 0; i < half->size(); ++i) {
    auto x = input_of(half->get(i)), p = input_of(plain->get(i));
    if (at::equal(p, p.flip({-1}))) continue;
    (at::equal(x, p) ? kept : flipped) += 1;
  }
  CHECK(flipped > 10);
  CHECK(kept > 10);

  // Four threads at once see exactly what one thread saw.
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (std::int64_t k = 0; k < a->size(); ++k) {
          std::int64_t i = (k * (t + 1) * 7 + round) % a->size();
          if (!at::equal(input_of(a->get(i)), serial[static_cast<std::size_t>(i)]))
            ++mismatches[static_cast<std::size_t>(t)];
        }
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));

  // The draws belong to the sample, not to its position: a subset sees the same crops.
  auto subset =
      build("fashion_mnist", {{"split", "test"}, {"limit", 64}, {"classes", {9}}, {"transforms", pipeline}, {"seed", 7}});
  std::int64_t j = 0;
  for (std::int64_t i = 0; i < plain->size(); ++i)
    if (label_of(plain->get(i)).item<std::int64_t>() == 9 && j < subset->size())
      CHECK(at::equal(input_of(subset->get(j++)), serial[static_cast<std::size_t>(i)]));
}

TEST_CASE("dataset configs: every problem is reported at its JSON pointer") {
  using test::message_at;
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"split", "valid"}}), "/config/split"),
             Catch::Contains("expected one of train, test, got \"valid\""));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"set", "test"}, {"split", "test"}}), "/config/split"),
             Catch::Contains("given twice"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"classes", {3, 12}}}), "/config/classes"),
             Catch::Contains("class 12 does not exist (the dataset has 10 classes, 0..9)"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"classes", {3, 3}}}), "/config/classes"),
             Catch::Contains("class 3 is listed twice"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"split", {{"fraction", 1.5}}}}), "/config/split/fraction"),
             Catch::Contains("strictly between 0 and 1"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"split", {{"fraction", 0.5}, {"part", "2nd"}}}}),
                        "/config/split/part"),
             Catch::Contains("expected one of first, second"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"split", {{"fraction", 0.5}, {"seeds", 1}}}}),
                        "/config/split/seeds"),
             Catch::Contains("unknown key (did you mean \"seed\"?)"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"split", 0.5}}), "/config/split"),
             Catch::Contains("expected an object {\"fraction\": f, \"part\": \"first\"|\"second\", \"seed\": s} or one of "
                             "\"train\", \"test\", got 0.5"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"transforms", {"hflip"}}}), "/config/transforms/0"),
             Catch::Contains("expected an object, got string \"hflip\""));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"transforms", {{"type", "hflip"}}}}), "/config/transforms"),
             Catch::Contains("expected an array, got object"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"root", "/no/such/folder"}}), "/config/root"),
             Catch::Contains("no such folder: /no/such/folder"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"limt", 5}}), "/config/limt"),
             Catch::Contains("did you mean \"limit\""));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"limit", 0}}), "/config/limit"),
             Catch::Contains("expected a value in [1,"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"transforms", {{{"type", "resize"}}}}}),
                        "/config/transforms/0/size"),
             Catch::Contains("missing required key"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"transforms", {{{"type", "rotate"}}}}}),
                        "/config/transforms/0/type"),
             Catch::Contains("expected one of normalize, resize, random_crop, hflip"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"transforms", {{{"type", "hflip"}, {"size", {2, 2}}}}}}),
                        "/config/transforms/0/size"),
             Catch::Contains("unknown key"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist",
                                     {{"transforms",
                                       {{{"type", "normalize"}, {"mean", {0.5, 0.5, 0.5}}, {"std", {1, 1, 1}}}}}}),
                        "/config/transforms/0/mean"),
             Catch::Contains("has 3 values; expected 1 or one per channel (1,"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist",
                                     {{"transforms", {{{"type", "normalize"}, {"mean", {0.5}}, {"std", {0}}}}}}),
                        "/config/transforms/0/std"),
             Catch::Contains("expected positive values"));
  CHECK_THAT(message_at(parse_issues("fashion_mnist", {{"transforms", {{{"type", "random_crop"}, {"size", {40, 40}}}}}}),
                        "/config/transforms/0/size"),
             Catch::Contains("a 40x40 crop does not fit in the 28x28 input with padding 0"));
  auto flat = parse_issues("csv", {{"path", "/no/file.csv"}, {"transforms", {{{"type", "hflip"}}}}});
  CHECK_THAT(message_at(flat, "/config/path"), Catch::Contains("no such file"));
  CHECK(message_at(flat, "/config/transforms/0").empty());  // the input shape is unknown without "shape"
  CHECK_THAT(message_at(parse_issues("synthetic", {{"transforms", {{{"type", "hflip"}}}}}), "/config/transforms/0"),
             Catch::Contains("hflip needs image inputs [C, H, W], got [16]"));
  CHECK_THAT(message_at(parse_issues("csv", {{"path", "x.csv"}, {"split", "test"}}), "/config/split"),
             Catch::Contains("expected an object"));
  CHECK_THAT(message_at(parse_issues("image_folder", {{"root", "/tmp"}}), "/config/size"),
             Catch::Contains("missing required key"));
  CHECK_THAT(message_at(parse_issues("image_folder", {{"root", "/tmp"}, {"size", {8}}}), "/config/size"),
             Catch::Contains("expected [height, width]"));
  CHECK_THAT(message_at(parse_issues("image_folder", {{"root", "/tmp"}, {"size", {8, 8}}, {"channels", 2}}),
                        "/config/channels"),
             Catch::Contains("expected 1 (grayscale) or 3 (RGB)"));

  // A csv without "shape" gives flat rows: image transforms fail when it is built.
  TempDir dir("csv-flat");
  write_file(dir / "f.csv", "1,2,0\n");
  CHECK_THAT(error_of([&] {
               build("csv", {{"path", (dir / "f.csv").string()}, {"transforms", {{{"type", "hflip"}}}}});
             }),
             Catch::Contains("/config/transforms/0: hflip needs image inputs [C, H, W], got [2]"));
  CHECK_THAT(error_of([&] {
               build("csv", {{"path", (dir / "f.csv").string()}, {"classes", {4}}});
             }),
             Catch::Contains("class 4 does not exist (the dataset has 1 class, 0..0)"));
}

TEST_CASE("dataset epochs: random transforms draw anew every epoch, as a function of (seed, index, epoch)") {
  const Json pipeline = {{{"type", "random_crop"}, {"size", {28, 28}}, {"padding", 4}}, {{"type", "hflip"}}};
  const Json base = {{"split", "test"}, {"limit", 32}, {"transforms", pipeline}, {"seed", 3}};
  auto a = build("fashion_mnist", base), a2 = build("fashion_mnist", base);
  int changed = 0;
  for (std::int64_t i = 0; i < a->size(); ++i) {
    CHECK(at::equal(input_of(a->get(i)), input_of(a->sample(i, 0))));         // epoch 0 is get()
    CHECK(at::equal(input_of(a->sample(i, 2)), input_of(a2->sample(i, 2))));  // the same draws for the same epoch
    CHECK(at::equal(input_of(a->sample(i, 2)), input_of(a->sample(i, 2))));
    changed += !at::equal(input_of(a->sample(i, 1)), input_of(a->sample(i, 0)));
  }
  CHECK(changed > 24);  // 81 crop positions x 2 flips: a repeat is rare
  // Epochs' draws belong to the sample, not to its position in the view.
  Json c = base;
  c["classes"] = {9};
  auto subset = build("fashion_mnist", c);
  std::int64_t j = 0;
  for (std::int64_t i = 0; i < a->size(); ++i)
    if (label_of(a->get(i)).item<std::int64_t>() == 9 && j < subset->size())
      CHECK(at::equal(input_of(subset->sample(j++, 5)), input_of(a->sample(i, 5))));
  CHECK(j > 0);
  // Without random transforms every epoch gives the same sample.
  auto plain = build("fashion_mnist", {{"split", "test"}, {"limit", 4}, {"transforms", {{{"type", "hflip"}, {"p", 1.0}}}}});
  CHECK(at::equal(input_of(plain->sample(3, 7)), input_of(plain->get(3))));
  CHECK_THAT(error_of([&] { a->sample(0, -1); }), Catch::Contains("epoch -1 is negative"));
}

TEST_CASE("dataset multi_crop: global then local views of the transformed input, with their shapes") {
  const Json normalize = {{{"type", "normalize"}, {"mean", {0.5}}, {"std", {0.25}}}};
  auto plain = build("fashion_mnist", {{"split", "test"}, {"limit", 8}, {"transforms", normalize}});
  auto mc =
      build("fashion_mnist", {{"split", "test"},
                              {"limit", 8},
                              {"seed", 11},
                              {"transforms", normalize},
                              {"multi_crop", {{"global_size", {24, 24}}, {"local_crops", 3}, {"local_size", {12, 10}}}}});
  CHECK(mc->describe() ==
        "fashion_mnist test: 8 samples, 10 classes, [1, 28, 28], limit 8, transforms: normalize mean [0.5] std [0.25], "
        "multi_crop: 2 global 24x24 scale [0.4,1] + 3 local 12x10 scale [0.05,0.4], ratio [0.75,1.33333], hflip p=0.5 (seed "
        "11)");
  const std::vector<std::vector<std::int64_t>> shapes{{1, 24, 24}, {1, 24, 24}, {1, 12, 10}, {1, 12, 10}, {1, 12, 10}};
  for (std::int64_t i = 0; i < mc->size(); ++i) {
    Example e = mc->get(i);
    CHECK(at::equal(input_of(e), input_of(plain->get(i))));  // the input is the transformed full image
    CHECK(at::equal(label_of(e), label_of(plain->get(i))));
    REQUIRE(views_of(e).size() == 5);
    for (std::size_t v = 0; v < 5; ++v) {
      CHECK(shape_of(views_of(e)[v]) == shapes[v]);
      CHECK(views_of(e)[v].scalar_type() == at::kFloat);
      CHECK(views_of(e)[v].is_contiguous());
    }
  }
  // The default: two global crops, no local one; a dataset without multi_crop has no views.
  auto two = build("fashion_mnist", {{"split", "test"}, {"limit", 2}, {"multi_crop", {{"global_size", {16, 20}}}}});
  CHECK(views_of(two->get(1)).size() == 2);
  CHECK(shape_of(views_of(two->get(1))[1]) == std::vector<std::int64_t>{1, 16, 20});
  CHECK(views_of(plain->get(0)).empty());
}

TEST_CASE("dataset multi_crop: the same crops for the same (seed, index, epoch), new ones every epoch") {
  const Json base = {{"split", "test"},
                     {"limit", 24},
                     {"seed", 5},
                     {"multi_crop", {{"global_size", {20, 20}}, {"local_crops", 2}, {"local_size", {8, 8}}}}};
  auto a = build("fashion_mnist", base), a2 = build("fashion_mnist", base);
  Json c = base;
  c["seed"] = 6;
  auto other = build("fashion_mnist", c);
  auto same = [](const Example& x, const Example& y) {
    if (!at::equal(input_of(x), input_of(y)) || views_of(x).size() != views_of(y).size()) return false;
    for (std::size_t v = 0; v < views_of(x).size(); ++v)
      if (!at::equal(views_of(x)[v], views_of(y)[v])) return false;
    return true;
  };
  int new_epoch = 0, new_seed = 0, views_differ = 0;
  std::vector<Example> serial;
  for (std::int64_t i = 0; i < a->size(); ++i) {
    Example e0 = a->sample(i, 0);
    CHECK(same(a->get(i), e0));
    CHECK(same(a2->sample(i, 4), a->sample(i, 4)));
    CHECK(same(a->sample(i, 4), a->sample(i, 4)));
    Example e1 = a->sample(i, 1);
    CHECK(at::equal(input_of(e1), input_of(e0)));  // no random transforms: the input stays
    for (std::size_t v = 0; v < views_of(e0).size(); ++v) new_epoch += !at::equal(views_of(e1)[v], views_of(e0)[v]);
    new_seed += !same(other->get(i), e0);
    views_differ += !at::equal(views_of(e0)[0], views_of(e0)[1]);
    serial.push_back(a->sample(i, 3));
  }
  CHECK(new_epoch > 24 * 4 * 9 / 10);
  CHECK(new_seed > 20);
  CHECK(views_differ > 20);  // two crops of one sample are drawn independently

  // Four threads at once see what one thread saw.
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (std::int64_t k = 0; k < a->size(); ++k) {
        std::int64_t i = (k * (t + 1) * 7 + t) % a->size();
        if (!same(a->sample(i, 3), serial[static_cast<std::size_t>(i)])) ++mismatches[static_cast<std::size_t>(t)];
      }
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("dataset multi_crop: crops are resized windows of the image, flipped with probability hflip") {
  auto plain = build("fashion_mnist", {{"split", "test"}, {"limit", 6}});
  auto with = [](Json multi_crop) {
    return build("fashion_mnist", {{"split", "test"}, {"limit", 6}, {"seed", 9}, {"multi_crop", std::move(multi_crop)}});
  };
  auto aa = [](const at::Tensor& x, std::int64_t h, std::int64_t w) {
    return at::_upsample_bilinear2d_aa(x.unsqueeze(0), {h, w}, false).squeeze(0);
  };

  // The whole image (scale [1, 1], ratio [1, 1] on 28x28), resized and always or never flipped.
  auto flipped = with({{"global_size", {16, 16}}, {"global_scale", {1, 1}}, {"ratio", {1, 1}}, {"hflip", 1.0}});
  auto kept = with({{"global_size", {16, 16}}, {"global_scale", {1, 1}}, {"ratio", {1, 1}}, {"hflip", 0.0}});
  for (std::int64_t i = 0; i < plain->size(); ++i) {
    at::Tensor resized = aa(input_of(plain->get(i)), 16, 16);
    for (const auto& v : views_of(flipped->sample(i, 2))) CHECK(at::allclose(v, resized.flip({-1})));
    for (const auto& v : views_of(kept->sample(i, 2))) CHECK(at::allclose(v, resized));
  }

  // No attempt fits (a 2:1 crop of the whole area is 40 wide): torchvision's fallback, the
  // central crop with the ratio clamped, 28x14 (rows 7..20); likewise 14x28 for ratio 1:2.
  auto wide = with({{"global_size", {14, 28}}, {"global_scale", {1, 1}}, {"ratio", {2, 2}}, {"hflip", 0.0}});
  auto tall = with({{"global_size", {28, 14}}, {"global_scale", {1, 1}}, {"ratio", {0.5, 0.5}}, {"hflip", 0.0}});
  for (std::int64_t i = 0; i < plain->size(); ++i) {
    CHECK(at::equal(views_of(wide->get(i))[0], input_of(plain->get(i)).narrow(1, 7, 14)));
    CHECK(at::equal(views_of(tall->get(i))[1], input_of(plain->get(i)).narrow(2, 7, 14)));
  }

  // A quarter of the area at ratio 1 is a 14x14 window, placed anywhere: each view is one of them.
  auto quarter = with({{"global_size", {14, 14}},
                       {"global_scale", {0.25, 0.25}},
                       {"ratio", {1, 1}},
                       {"hflip", 0.0},
                       {"global_crops", 3},
                       {"local_crops", 3},
                       {"local_size", {14, 14}},
                       {"local_scale", {0.25, 0.25}}});
  std::set<std::pair<std::int64_t, std::int64_t>> positions;
  for (std::int64_t i = 0; i < plain->size(); ++i) {
    at::Tensor x = input_of(plain->get(i));
    for (std::int64_t epoch = 0; epoch < 3; ++epoch)
      for (const auto& v : views_of(quarter->sample(i, epoch))) {
        bool found = false;
        for (std::int64_t top = 0; top <= 14 && !found; ++top)
          for (std::int64_t left = 0; left <= 14 && !found; ++left)
            if (at::equal(v, x.narrow(1, top, 14).narrow(2, left, 14))) {
              found = true;
              positions.insert({top, left});
            }
        CHECK(found);
      }
  }
  CHECK(positions.size() > 30);  // 108 crops over 225 positions

  // A constant image gives constant crops (csv rows as [3, 6, 8] images, one value per channel).
  TempDir dir("multi-crop-constant");
  std::string row;
  for (int ch = 0; ch < 3; ++ch)
    for (int k = 0; k < 48; ++k) row += std::to_string(ch + 1) + ",";
  write_file(dir / "c.csv", row + "0\n" + row + "1\n");
  auto constant = build("csv", {{"path", (dir / "c.csv").string()},
                                {"shape", {3, 6, 8}},
                                {"scale", 4},
                                {"multi_crop", {{"global_size", {5, 7}}, {"local_crops", 4}, {"local_size", {3, 3}}}}});
  for (std::int64_t i = 0; i < constant->size(); ++i)
    for (std::int64_t epoch = 0; epoch < 4; ++epoch) {
      Example e = constant->sample(i, epoch);
      REQUIRE(views_of(e).size() == 6);
      for (const auto& v : views_of(e))
        for (int ch = 0; ch < 3; ++ch) CHECK(at::allclose(v[ch], at::full_like(v[ch], (ch + 1) / 4.0)));
    }

  // p = 0.5 flips some crops and not others (the whole image, symmetric samples skipped).
  auto half = with({{"global_size", {28, 28}}, {"global_scale", {1, 1}}, {"ratio", {1, 1}}, {"global_crops", 8}});
  int flips = 0, keeps = 0;
  for (std::int64_t i = 0; i < plain->size(); ++i) {
    at::Tensor x = input_of(plain->get(i));
    if (at::equal(x, x.flip({-1}))) continue;
    for (const auto& v : views_of(half->get(i))) (at::equal(v, x) ? keeps : flips) += 1;
  }
  CHECK(flips > 8);
  CHECK(keeps > 8);
}

TEST_CASE("dataset multi_crop: config problems are reported at their JSON pointers") {
  using test::message_at;
  auto issue = [](const Json& multi_crop, const std::string& pointer, const std::string& type = "fashion_mnist") {
    return message_at(parse_issues(type, {{"multi_crop", multi_crop}}), pointer);
  };
  const Json size = {16, 16};
  CHECK(parse_issues("fashion_mnist", {{"multi_crop", {{"global_size", size}, {"local_crops", 2}, {"local_size", {8, 8}}}}})
            .empty());
  CHECK_THAT(issue({{"global_size", size}, {"global_scale", {0.5, 0.2}}}, "/config/multi_crop/global_scale"),
             Catch::Contains("expected [min, max] with 0 < min <= max <= 1, got [0.5,0.2]"));
  CHECK_THAT(issue({{"global_size", size}, {"global_scale", {0, 1}}}, "/config/multi_crop/global_scale"),
             Catch::Contains("expected [min, max] with 0 < min <= max <= 1"));
  CHECK_THAT(issue({{"global_size", size}, {"global_scale", {0.5, 1.5}}}, "/config/multi_crop/global_scale"),
             Catch::Contains("got [0.5,1.5]"));
  CHECK_THAT(issue({{"global_size", size}, {"local_scale", {0.1}}}, "/config/multi_crop/local_scale"),
             Catch::Contains("expected [min, max]"));
  CHECK_THAT(issue({{"global_size", size}, {"global_scale", "big"}}, "/config/multi_crop/global_scale"),
             Catch::Contains("expected an array of numbers, got string"));
  CHECK_THAT(issue({{"global_size", size}, {"ratio", {1.5, 0.5}}}, "/config/multi_crop/ratio"),
             Catch::Contains("expected [min, max] with 0 < min <= max, got [1.5,0.5]"));
  CHECK_THAT(issue({{"global_scale", {0.4, 1}}}, "/config/multi_crop/global_size"), Catch::Contains("missing required key"));
  CHECK_THAT(issue({{"global_size", {16}}}, "/config/multi_crop/global_size"), Catch::Contains("expected [height, width]"));
  CHECK_THAT(issue({{"global_size", size}, {"local_crops", 4}}, "/config/multi_crop/local_size"),
             Catch::Contains("missing required key"));
  CHECK_THAT(issue({{"global_size", size}, {"local_size", {0, 4}}}, "/config/multi_crop/local_size"),
             Catch::Contains("expected [height, width]"));
  CHECK_THAT(issue({{"global_size", size}, {"global_crops", 0}}, "/config/multi_crop/global_crops"),
             Catch::Contains("expected a value in [1, 64], got 0"));
  CHECK_THAT(issue({{"global_size", size}, {"local_crops", -1}}, "/config/multi_crop/local_crops"),
             Catch::Contains("expected a value in [0, 64], got -1"));
  CHECK_THAT(issue({{"global_size", size}, {"hflip", 1.5}}, "/config/multi_crop/hflip"),
             Catch::Contains("expected a value in [0.0, 1.0], got 1.5"));
  CHECK_THAT(issue({{"global_size", size}, {"global_scales", {0.4, 1}}}, "/config/multi_crop/global_scales"),
             Catch::Contains("unknown key (did you mean \"global_scale\"?)"));
  CHECK_THAT(issue(3, "/config/multi_crop"), Catch::Contains("expected an object {\"global_crops\": n"));
  CHECK_THAT(issue({{"global_size", size}}, "/config/multi_crop", "synthetic"),
             Catch::Contains("multi_crop needs image inputs [C, H, W], got [16] after the transforms"));

  // A csv without "shape": the input shape is known only when the dataset is built.
  TempDir dir("csv-flat-multi-crop");
  write_file(dir / "f.csv", "1,2,0\n");
  CHECK(parse_issues("csv", {{"path", (dir / "f.csv").string()}, {"multi_crop", {{"global_size", size}}}}).empty());
  CHECK_THAT(error_of([&] {
               build("csv", {{"path", (dir / "f.csv").string()}, {"multi_crop", {{"global_size", size}}}});
             }),
             Catch::Contains("/config/multi_crop: multi_crop needs image inputs [C, H, W], got [2]"));
}

}  // namespace refit_test_datasets
