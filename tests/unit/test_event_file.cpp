// TensorBoard event files (framework/io/event_file.h, callbacks/tensorboard.h): CRC-32C against
// published vectors, the TFRecord framing and the Event messages decoded field by field by a
// protobuf wire-format reader written here, and the metrics log's lines as scalars.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "test_support.h"

#include "callbacks/tensorboard.h"
#include "io/event_file.h"
#include "io/remove_tree.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_event_file {

namespace fs = std::filesystem;
using refit::io::crc32c;
using refit::io::masked_crc32c;

namespace {

std::uint64_t little_endian(const std::string& bytes, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes.at(at + i))) << (8 * i);
  return v;
}

/// One field of a protobuf message: varints in `number`, everything else (fixed-width values,
/// strings, embedded messages) as its bytes.
struct WireField {
  std::uint32_t field = 0;
  std::uint32_t wire_type = 0;
  std::uint64_t varint = 0;
  std::string bytes;
  double as_double() const {
    REQUIRE(wire_type == 1);
    const std::uint64_t bits = little_endian(bytes, 0, 8);
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  float as_float() const {
    REQUIRE(wire_type == 5);
    const auto bits = static_cast<std::uint32_t>(little_endian(bytes, 0, 4));
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
};

std::uint64_t read_varint(const std::string& m, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < m.size());
    REQUIRE(shift < 64);
    const auto byte = static_cast<unsigned char>(m[at++]);
    v |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
    if (!(byte & 0x80)) return v;
  }
}

std::vector<WireField> decode(const std::string& m) {
  std::vector<WireField> fields;
  std::size_t at = 0;
  while (at < m.size()) {
    const std::uint64_t key = read_varint(m, at);
    WireField f;
    f.field = static_cast<std::uint32_t>(key >> 3);
    f.wire_type = static_cast<std::uint32_t>(key & 7);
    std::size_t length = 0;
    switch (f.wire_type) {
      case 0: f.varint = read_varint(m, at); break;
      case 1: length = 8; break;
      case 2: length = static_cast<std::size_t>(read_varint(m, at)); break;
      case 5: length = 4; break;
      default: FAIL("wire type " << f.wire_type);
    }
    REQUIRE(at + length <= m.size());
    f.bytes = m.substr(at, length);
    at += length;
    fields.push_back(f);
  }
  return fields;
}

/// The only field numbered `field`.
WireField only(const std::vector<WireField>& fields, std::uint32_t field) {
  const WireField* found = nullptr;
  for (const auto& f : fields)
    if (f.field == field) {
      REQUIRE(found == nullptr);
      found = &f;
    }
  REQUIRE(found != nullptr);
  return *found;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The records of a TFRecord stream, each record's framing and both CRCs checked.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < file.size()) {
    REQUIRE(at + 12 <= file.size());
    const std::uint64_t length = little_endian(file, at, 8);
    CHECK(little_endian(file, at + 8, 4) == masked_crc32c(file.data() + at, 8));
    REQUIRE(at + 12 + length + 4 <= file.size());
    const std::string data = file.substr(at + 12, length);
    CHECK(little_endian(file, at + 12 + length, 4) == masked_crc32c(data.data(), data.size()));
    out.push_back(data);
    at += 12 + length + 4;
  }
  return out;
}

/// A scalar event's tag, value and step.
struct Scalar {
  std::string tag;
  float value;
  std::int64_t step;
};

std::vector<Scalar> scalars(const std::vector<std::string>& events) {
  std::vector<Scalar> out;
  for (const auto& e : events) {
    const auto fields = decode(e);
    bool has_summary = false;
    for (const auto& f : fields) has_summary |= f.field == 5;
    if (!has_summary) continue;
    const auto value = decode(only(decode(only(fields, 5).bytes), 1).bytes);
    bool simple = false;
    for (const auto& f : value) simple |= f.field == 2;
    if (simple)
      out.push_back({only(value, 1).bytes, only(value, 2).as_float(), static_cast<std::int64_t>(only(fields, 2).varint)});
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("refit-test-" + name + "-" + std::to_string(::getpid()));
  refit::io::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("crc32c: the RFC 3720 (B.4) test vectors and \"123456789\"") {
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(crc32c(ascending.data(), ascending.size()) == 0x46DD794Eu);
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  // The mask: rotated right by 15 bits, plus a constant.
  CHECK(masked_crc32c("123456789", 9) == ((0xE3069283u >> 15 | 0xE3069283u << 17) + 0xa282ead8u));
}

TEST_CASE("event file: a TFRecord record is length, its masked CRC, the data and the data's masked CRC") {
  const std::string data = "some event bytes";
  const std::string r = refit::io::tfrecord(data);
  REQUIRE(r.size() == 8 + 4 + data.size() + 4);
  CHECK(little_endian(r, 0, 8) == data.size());
  CHECK(little_endian(r, 8, 4) == masked_crc32c(r.data(), 8));
  CHECK(r.substr(12, data.size()) == data);
  CHECK(little_endian(r, 12 + data.size(), 4) == masked_crc32c(data.data(), data.size()));
}

TEST_CASE("event file: a scalar event decodes field by field to wall_time, step and Summary.Value{tag, simple_value}") {
  const auto event = decode(refit::io::scalar_event("train/loss", 0.25f, 1234567890123LL, 1700000000.5));
  REQUIRE(event.size() == 3);
  CHECK(only(event, 1).as_double() == 1700000000.5);
  CHECK(only(event, 2).wire_type == 0);
  CHECK(only(event, 2).varint == 1234567890123ULL);
  const auto summary = decode(only(event, 5).bytes);
  REQUIRE(summary.size() == 1);
  const auto value = decode(only(summary, 1).bytes);
  REQUIRE(value.size() == 2);
  CHECK(only(value, 1).bytes == "train/loss");
  CHECK(only(value, 2).as_float() == 0.25f);
  // A step that needs all ten varint bytes (negative) still round-trips.
  CHECK(static_cast<std::int64_t>(only(decode(refit::io::scalar_event("t", 1, -1, 0)), 2).varint) == -1);
}

TEST_CASE("event file: text, session start and file version events") {
  const auto text = decode(refit::io::text_event("recipe", "```json\n{}\n```\n", 7, 1.0));
  CHECK(only(text, 2).varint == 7);
  const auto value = decode(only(decode(only(text, 5).bytes), 1).bytes);
  CHECK(only(value, 1).bytes == "recipe");
  const auto tensor = decode(only(value, 8).bytes);
  CHECK(only(tensor, 1).varint == 7);  // DT_STRING
  CHECK(only(tensor, 2).bytes.empty());
  CHECK(only(tensor, 8).bytes == "```json\n{}\n```\n");
  const auto plugin_data = decode(only(decode(only(value, 9).bytes), 1).bytes);
  CHECK(only(plugin_data, 1).bytes == "text");

  const auto start = decode(refit::io::session_start_event(12, 2.0));
  CHECK(only(start, 2).varint == 12);
  CHECK(only(decode(only(start, 7).bytes), 1).varint == 1);  // SessionLog.status = START

  CHECK(only(decode(refit::io::file_version_event(3.0)), 3).bytes == "brain.Event:2");
}

TEST_CASE("event file: the writer names the file for TensorBoard, starts with the file version, and CRCs hold") {
  const fs::path dir = fresh_dir("event-file");
  {
    refit::io::EventFileWriter w(dir);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string name = w.path().filename().string();
    CHECK(name.rfind("events.out.tfevents.", 0) == 0);
    CHECK(name.find(std::string(".") + host + "." + std::to_string(::getpid())) != std::string::npos);
    w.add_scalar("a", 1.5f, 3, 10.0);
    w.flush();
    // A second writer in the same second gets a file of its own.
    refit::io::EventFileWriter second(dir);
    CHECK(second.path() != w.path());
  }
  const auto files = event_files(dir);
  REQUIRE(files.size() == 2);
  for (const auto& f : files) {
    const auto events = records(read_file(f));
    REQUIRE(!events.empty());
    CHECK(only(decode(events[0]), 3).bytes == "brain.Event:2");
  }
  refit::io::remove_tree(dir);
}

TEST_CASE("tensorboard: the metrics log's lines become scalars at their steps, samples/s between updates") {
  const fs::path dir = fresh_dir("tensorboard");
  refit::io::EventFileWriter stale(dir);  // a former run's file: a fresh run removes it
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> seen;
  std::vector<std::string> events;
  {
    refit::TensorBoardWriter tb(dir, {"backbone", "head"}, "{\"name\": \"x\"}\n", /*resuming=*/false);
    tb.on_train_begin(0, false);
    auto train = [](std::int64_t step, double samples, double time) {
      return nlohmann::json{{"kind", "train"}, {"step", step},       {"samples", samples}, {"time", time},
                            {"loss", 0.5},     {"lr", {0.1, 0.01}},  {"grad_norm", 2.0},   {"grad_norm_clipped", 1.0},
                            {"scale", 1.0},    {"scale_after", 1.0}, {"skipped", false},   {"skipped_total", 0}};
    };
    tb.on_line(train(1, 8, 1.0));
    tb.on_line(train(2, 16, 1.5));  // 8 samples in 0.5 s
    tb.on_line({{"kind", "eval"},
                {"split", "val"},
                {"step", 2},
                {"iteration", 2},
                {"count", 10},
                {"loss", 0.75},
                {"accuracy", 0.5}});
    tb.on_line(train(3, 24, 4.0));  // across the evaluation: no throughput
    tb.on_line(train(4, 32, 4.25));
    tb.on_flush();
    const auto files = event_files(dir);
    REQUIRE(files.size() == 1);
    CHECK(files[0] == tb.path());
    events = records(read_file(tb.path()));
  }
  for (const auto& s : scalars(events)) seen[s.tag].emplace_back(s.step, s.value);
  using Points = std::vector<std::pair<std::int64_t, float>>;
  CHECK(seen["train/loss"] == Points{{1, 0.5f}, {2, 0.5f}, {3, 0.5f}, {4, 0.5f}});
  CHECK(seen["train/lr/backbone"].size() == 4);
  CHECK(seen["train/lr/head"][0] == std::make_pair(std::int64_t{1}, 0.01f));
  CHECK(seen["train/grad_norm"][0].second == 2.0f);
  CHECK(seen["train/grad_norm_clipped"][0].second == 1.0f);
  CHECK(seen["train/loss_scale"].size() == 4);
  CHECK(seen["train/skipped_total"].size() == 4);
  CHECK(seen["train/samples_per_second"] == Points{{2, 16.0f}, {4, 32.0f}});
  CHECK(seen["val/loss"] == Points{{2, 0.75f}});
  CHECK(seen["val/accuracy"] == Points{{2, 0.5f}});
  CHECK(seen.count("val/count") == 0);
  CHECK(seen.count("val/iteration") == 0);
  CHECK(seen.count("train/skipped") == 0);
  // After the file version: START at step 0, then the recipe as a Markdown code block.
  REQUIRE(events.size() >= 3);
  CHECK(only(decode(only(decode(events[1]), 7).bytes), 1).varint == 1);
  const auto recipe = decode(only(decode(only(decode(events[2]), 5).bytes), 1).bytes);
  CHECK(only(recipe, 1).bytes == "recipe");
  CHECK(only(decode(only(recipe, 8).bytes), 8).bytes == "```json\n{\"name\": \"x\"}\n```\n");
  refit::io::remove_tree(dir);
}

TEST_CASE("tensorboard: a resumed run keeps the folder's files and starts its own with START one step past the checkpoint") {
  const fs::path dir = fresh_dir("tensorboard-resume");
  { refit::TensorBoardWriter killed(dir, {}, "", false); }
  refit::TensorBoardWriter resumed(dir, {}, "", /*resuming=*/true);
  resumed.on_train_begin(40, true);
  CHECK(event_files(dir).size() == 2);
  const auto events = records(read_file(resumed.path()));
  REQUIRE(events.size() == 2);  // the file version and START (no recipe text without a recipe)
  const auto start = decode(events[1]);
  CHECK(only(start, 2).varint == 41);
  CHECK(only(decode(only(start, 7).bytes), 1).varint == 1);
  resumed.on_line({{"kind", "train"}, {"step", 41}, {"lr", {0.5}}});
  resumed.on_flush();
  const auto s = scalars(records(read_file(resumed.path())));
  REQUIRE(s.size() == 1);
  CHECK(s[0].tag == "train/lr/0");  // no group names: the group's index
  refit::io::remove_tree(dir);
}

}  // namespace refit_test_event_file
