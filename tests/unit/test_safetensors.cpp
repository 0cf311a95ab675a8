// safetensors: a file written by Python's safetensors reads back exactly; refit's files round
// trip; every corrupt variant is an error, never an out-of-bounds read.
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/nn/modules/linear.h>

#include "io/adapter_files.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_safetensors {

using namespace refit;
using io::SafetensorsFile;
namespace fs = std::filesystem;

namespace {

fs::path golden() { return fs::path(test::source_dir()) / "tests/golden/safetensors/mixed.safetensors"; }

fs::path temp(const std::string& name) {
  fs::path d = fs::temp_directory_path() / "refit-tests";
  fs::create_directories(d);
  return d / name;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

SafetensorsFile parse(const std::string& bytes) {
  auto buf = std::shared_ptr<std::uint8_t>(new std::uint8_t[bytes.size() + 1], std::default_delete<std::uint8_t[]>());
  std::memcpy(buf.get(), bytes.data(), bytes.size());
  return SafetensorsFile::from_bytes(buf, bytes.size(), "test");
}

/// A file image with the given header JSON and `data` bytes.
std::string image(const nlohmann::json& header, const std::string& data) {
  std::string h = header.dump();
  std::uint64_t n = h.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + h + data;
}

}  // namespace

TEST_CASE("a file written by Python safetensors reads back with every dtype") {
  auto f = SafetensorsFile::open(golden());
  CHECK(f.metadata().at("producer") == "python safetensors");
  CHECK(f.tensors().size() == 10);
  CHECK(torch::equal(f.load("f32"), torch::arange(6, torch::kFloat).reshape({2, 3}) / 4));
  CHECK(torch::equal(f.load("f16"), torch::arange(5, torch::kFloat).to(torch::kHalf) / 8));
  CHECK(torch::equal(f.load("bf16"), (torch::arange(4, torch::kFloat) - 1.5).to(torch::kBFloat16).reshape({2, 2})));
  CHECK(torch::equal(f.load("f64"), torch::arange(3, torch::kDouble) * 0.1));
  CHECK(torch::equal(f.load("i64"), torch::arange(4, torch::kLong) - 2));
  CHECK(torch::equal(f.load("i32"), torch::arange(3, torch::kInt) * 7));
  CHECK(torch::equal(f.load("u8"), torch::arange(7, torch::kByte)));
  CHECK(torch::equal(f.load("bool"), torch::tensor({true, false, true})));
  CHECK(f.load("scalar").dim() == 0);
  CHECK(f.load("scalar").item<float>() == 3.25f);
  CHECK(f.load("empty").sizes() == torch::IntArrayRef({0, 4}));
}

TEST_CASE("refit's writer round-trips, aligns the data to 8 bytes and stores metadata") {
  auto src = SafetensorsFile::open(golden()).load_all();
  auto p = temp("roundtrip.safetensors");
  io::save_safetensors(p, src, {{"producer", "refit"}});
  auto bytes = file_bytes(p);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  auto back = SafetensorsFile::open(p);
  CHECK(back.metadata().at("producer") == "refit");
  for (const auto& kv : src) {
    INFO(kv.first);
    CHECK(torch::equal(back.load(kv.first), kv.second));
  }
  // No temporary files are left next to it.
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
}

TEST_CASE("the sampled digest reads the header and three 64-byte windows per tensor, not every byte") {
  const fs::path p = temp("digest.safetensors");
  // 256 float32 (1,024 bytes): windows at bytes [0, 64), [480, 544) and [960, 1024) of its data.
  io::save_safetensors(p, {{"w", torch::arange(256, torch::kFloat)}, {"b", torch::ones({3})}}, {{"k", "v"}});
  const std::string bytes = file_bytes(p);
  const std::string digest = SafetensorsFile::open(p).sampled_digest();
  const auto info = SafetensorsFile::open(p).info("w");
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const std::size_t w = 8 + static_cast<std::size_t>(header) + static_cast<std::size_t>(info.begin);
  const auto digest_with = [&](std::size_t at) {
    std::string changed = bytes;
    changed[at] = static_cast<char>(changed[at] ^ 0x40);
    auto image = std::shared_ptr<std::uint8_t>(new std::uint8_t[changed.size()], std::default_delete<std::uint8_t[]>());
    std::memcpy(image.get(), changed.data(), changed.size());
    return SafetensorsFile::from_bytes(image, changed.size(), "image").sampled_digest();
  };
  CHECK(digest_with(w + 1000) != digest);                       // the last window
  CHECK(digest_with(w + 500) != digest);                        // the middle one
  CHECK(digest_with(w + 3) != digest);                          // the first one
  CHECK(digest_with(w + 200) == digest);                        // between windows: what the digest does not read
  const std::size_t in_header = bytes.find("\"k\":\"v\"") + 5;  // the metadata value
  REQUIRE(in_header > 5);
  CHECK(digest_with(in_header) != digest);
}

TEST_CASE("corrupt files are errors that say what is wrong") {
  const std::string good = file_bytes(golden());
  SECTION("shorter than the length prefix") {
    CHECK_THROWS_WITH(parse(good.substr(0, 5)), Catch::Contains("shorter than the 8-byte header length"));
  }
  SECTION("truncated data") {
    CHECK_THROWS_WITH(parse(good.substr(0, good.size() - 3)), Catch::Contains("run past the data buffer"));
  }
  SECTION("header length past the end") {
    std::string b = good;
    std::uint64_t n = b.size();
    std::memcpy(&b[0], &n, 8);
    CHECK_THROWS_WITH(parse(b), Catch::Contains("runs past the end of the file"));
  }
  SECTION("absurd header length") {
    std::string b = good;
    std::uint64_t n = ~0ull;
    std::memcpy(&b[0], &n, 8);
    CHECK_THROWS_WITH(parse(b), Catch::Contains("exceeds the 100 MiB limit"));
  }
  SECTION("header is not JSON") {
    CHECK_THROWS_WITH(parse(image(nlohmann::json::object(), "").replace(8, 2, "{x")), Catch::Contains("not valid JSON"));
  }
  const std::string data(16, '\0');
  auto t = [](const char* dtype, std::vector<std::int64_t> shape, std::uint64_t b, std::uint64_t e) {
    return nlohmann::json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
  };
  SECTION("overlapping offsets") {
    nlohmann::json h{{"a", t("F32", {2}, 0, 8)}, {"b", t("F32", {2}, 4, 12)}, {"c", t("F32", {1}, 12, 16)}};
    CHECK_THROWS_WITH(parse(image(h, data)), Catch::Contains("overlaps"));
  }
  SECTION("out-of-range offsets") {
    nlohmann::json h{{"a", t("F32", {4}, 8, 24)}};
    CHECK_THROWS_WITH(parse(image(h, data)), Catch::Contains("run past the data buffer (16 bytes)"));
  }
  SECTION("begin after end") {
    nlohmann::json h{{"a", t("F32", {0}, 8, 4)}};
    CHECK_THROWS_WITH(parse(image(h, data)), Catch::Contains("begin > end"));
  }
  SECTION("byte size does not match dtype and shape") {
    nlohmann::json h{{"a", t("F32", {3}, 0, 16)}};
    CHECK_THROWS_WITH(parse(image(h, data)), Catch::Contains("holds 16 bytes but dtype F32 and its shape need 12"));
  }
  SECTION("a gap or trailing bytes") {
    nlohmann::json gap{{"a", t("F32", {2}, 8, 16)}};
    CHECK_THROWS_WITH(parse(image(gap, data)), Catch::Contains("gap of 8 bytes"));
    nlohmann::json trailing{{"a", t("F32", {2}, 0, 8)}};
    CHECK_THROWS_WITH(parse(image(trailing, data)), Catch::Contains("8 trailing bytes"));
  }
  SECTION("unknown dtype, negative or overflowing shape") {
    CHECK_THROWS_WITH(parse(image({{"a", t("F8", {16}, 0, 16)}}, data)), Catch::Contains("unsupported dtype \"F8\""));
    nlohmann::json neg{{"a", {{"dtype", "U8"}, {"shape", {-16}}, {"data_offsets", {0, 16}}}}};
    CHECK_THROWS_WITH(parse(image(neg, data)), Catch::Contains("negative dimension"));
    nlohmann::json huge{{"a", t("F64", {1ll << 40, 1ll << 40}, 0, 16)}};
    CHECK_THROWS_WITH(parse(image(huge, data)), Catch::Contains("overflows"));
  }
}

TEST_CASE("a header followed by a NUL byte and garbage is refused, as the reference implementation does") {
  std::string h = "{}";
  h += std::string("\0garbage", 8);
  std::uint64_t n = h.size();
  const std::string bytes = std::string(reinterpret_cast<const char*>(&n), 8) + h;
  CHECK_THROWS_WITH(parse(bytes), Catch::Contains("NUL byte at offset 2 of the header"));
  // Space padding (what writers add to align the data) stays valid; other trailing bytes do not.
  std::string padded = "{}      ";
  n = padded.size();
  CHECK(parse(std::string(reinterpret_cast<const char*>(&n), 8) + padded).tensors().empty());
  std::string junk = "{} x";
  n = junk.size();
  CHECK_THROWS_WITH(parse(std::string(reinterpret_cast<const char*>(&n), 8) + junk), Catch::Contains("not valid JSON"));
  std::string array = " []";
  n = array.size();
  CHECK_THROWS_WITH(parse(std::string(reinterpret_cast<const char*>(&n), 8) + array),
                    Catch::Contains("header does not start with '{'"));
}

TEST_CASE("a file truncated after it was opened is an error when its tensors are read, not a SIGBUS") {
  const fs::path p = temp("truncated-while-open.safetensors");
  std::map<std::string, torch::Tensor> tensors{{"a", torch::arange(1 << 16, torch::kFloat)},
                                               {"b", torch::ones({1 << 16}, torch::kFloat)}};
  io::save_safetensors(p, tensors);
  auto f = SafetensorsFile::open(p);
  fs::resize_file(p, 64);  // another process truncates the file: a mapping of it would fault
  CHECK_THROWS_WITH(f.load("b"), Catch::Contains("is shorter than when it was opened"));
  CHECK_THROWS_WITH(f.load_all(), Catch::Contains("is shorter than when it was opened"));
  fs::remove(p);
}

namespace {
class TwoLayer : public TensorModel {
 public:
  TwoLayer(int h = 3) {
    a = register_module("a", torch::nn::Linear(2, h));
    b = register_module("b", torch::nn::Linear(h, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return b->forward(a->forward(x)); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
}  // namespace

TEST_CASE("weights load strictly: values copied, or a readable diff of what does not match") {
  TwoLayer src;
  auto p = temp("two_layer.safetensors");
  io::save_safetensors(p, model_state(src));
  TwoLayer dst;
  load_weights(dst, p, "m");
  CHECK(torch::equal(dst.a->weight, src.a->weight));
  CHECK(torch::equal(dst.b->bias, src.b->bias));

  TwoLayer wider(5);
  try {
    load_weights(wider, p, "m");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("shape mismatches (3)") && Catch::Contains("a.weight: file [3, 2], model [5, 2]"));
  }
  auto state = model_state(src);
  state.erase("b.bias");
  state["extra.weight"] = torch::zeros({1});
  io::save_safetensors(p, state);
  try {
    load_weights(dst, p, "m");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("missing from the file (1):\n    b.bias [2]") &&
                             Catch::Contains("unexpected in the file (1):\n    extra.weight [1]"));
  }
  CHECK_THROWS_WITH(load_weights(dst, temp("nope.safetensors"), "m"), Catch::Contains("does not exist"));
}

TEST_CASE("an adapter_config.json with a NUL byte and garbage after its JSON is refused") {
  const fs::path dir = temp("adapter-nul");
  fs::create_directories(dir);
  io::save_safetensors(dir / "adapter_model.safetensors", {{"a", torch::zeros({2})}});
  std::ofstream(dir / "adapter_config.json", std::ios::binary) << std::string("{\"r\": 4}\0garbage", 16);
  CHECK_THROWS_WITH(io::read_adapter_files(dir), Catch::Contains("a NUL byte at offset 8"));
}

}  // namespace refit_test_safetensors
