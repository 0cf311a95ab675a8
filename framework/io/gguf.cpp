#include "io/gguf.h"

#include "io/pread_full.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "io/sampled_digest.h"
#include "refit/error.h"

namespace refit::io {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the GGUF reader assumes a little-endian host");

namespace {

struct TypeEntry {
  GgufType type;
  const char* name;
  std::uint64_t elements, bytes;  // per block
};
// gguf-py 0.19.0's GGML_QUANT_SIZES: every type a file can name, so that any tensor's bytes can
// be located and bounds-checked even when refit cannot dequantize it.
const TypeEntry kTypes[] = {
    {GgufType::F32, "F32", 1, 4},
    {GgufType::F16, "F16", 1, 2},
    {GgufType::Q4_0, "Q4_0", 32, 18},
    {GgufType::Q4_1, "Q4_1", 32, 20},
    {GgufType::Q5_0, "Q5_0", 32, 22},
    {GgufType::Q5_1, "Q5_1", 32, 24},
    {GgufType::Q8_0, "Q8_0", 32, 34},
    {GgufType::Q8_1, "Q8_1", 32, 40},
    {GgufType::Q2_K, "Q2_K", 256, 84},
    {GgufType::Q3_K, "Q3_K", 256, 110},
    {GgufType::Q4_K, "Q4_K", 256, 144},
    {GgufType::Q5_K, "Q5_K", 256, 176},
    {GgufType::Q6_K, "Q6_K", 256, 210},
    {GgufType::Q8_K, "Q8_K", 256, 292},
    {GgufType::IQ2_XXS, "IQ2_XXS", 256, 66},
    {GgufType::IQ2_XS, "IQ2_XS", 256, 74},
    {GgufType::IQ3_XXS, "IQ3_XXS", 256, 98},
    {GgufType::IQ1_S, "IQ1_S", 256, 50},
    {GgufType::IQ4_NL, "IQ4_NL", 32, 18},
    {GgufType::IQ3_S, "IQ3_S", 256, 110},
    {GgufType::IQ2_S, "IQ2_S", 256, 82},
    {GgufType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgufType::I8, "I8", 1, 1},
    {GgufType::I16, "I16", 1, 2},
    {GgufType::I32, "I32", 1, 4},
    {GgufType::I64, "I64", 1, 8},
    {GgufType::F64, "F64", 1, 8},
    {GgufType::IQ1_M, "IQ1_M", 256, 56},
    {GgufType::BF16, "BF16", 1, 2},
    {GgufType::TQ1_0, "TQ1_0", 256, 54},
    {GgufType::TQ2_0, "TQ2_0", 256, 66},
    {GgufType::MXFP4, "MXFP4", 32, 17},
    {GgufType::NVFP4, "NVFP4", 64, 36},
    {GgufType::Q1_0, "Q1_0", 128, 18},
};

const TypeEntry* find_type(std::uint32_t v) {
  for (const auto& t : kTypes)
    if (static_cast<std::uint32_t>(t.type) == v) return &t;
  return nullptr;
}

const char* const kValueTypeNames[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                       "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
constexpr std::uint32_t kValueTypeCount = sizeof(kValueTypeNames) / sizeof(kValueTypeNames[0]);

/// Bytes of a scalar value type; 0 for STRING and ARRAY (variable length).
std::uint64_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 || t == GgufValueType::UINT64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 || t == GgufValueType::INT64;
}
bool is_float(GgufValueType t) { return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64; }

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw Error("corrupt GGUF file " + label + ": " + what);
}

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// IEEE binary16 -> binary32, exact (every half is a float): what numpy's float16 -> float32 and
/// ggml's GGML_FP16_TO_FP32 give, NaN payloads kept.
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float (mant < 2^10; 2^-24 is a power of two).
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// float -> bfloat16 bits, round to nearest even, NaN -> 0x7FC0: c10::BFloat16's conversion
/// (round_to_nearest_even), so that the result equals torch's .to(torch::kBFloat16).
std::uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t rounding_bias = ((u >> 16) & 1u) + 0x7FFFu;
  return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
}

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The row and sub-row sizes of the chunked reads: a multiple of every dequantizable block (1, 32).
constexpr std::uint64_t kChunkBytes = 4u << 20;    // packed bytes read from a file at a time
constexpr std::int64_t kBf16Elements = 64 * 1024;  // floats staged before rounding to bf16
constexpr std::uint64_t kWindow = 1u << 20;        // header bytes read from a file at a time

}  // namespace

std::string gguf_type_name(GgufType t) {
  if (const TypeEntry* e = find_type(static_cast<std::uint32_t>(t))) return e->name;
  return "type " + std::to_string(static_cast<std::uint32_t>(t));
}

std::optional<GgufBlockLayout> gguf_block_layout(GgufType t) {
  if (const TypeEntry* e = find_type(static_cast<std::uint32_t>(t))) return GgufBlockLayout{e->elements, e->bytes};
  return std::nullopt;
}

bool gguf_can_dequantize(GgufType t) {
  return t == GgufType::F32 || t == GgufType::F16 || t == GgufType::BF16 || t == GgufType::Q8_0 || t == GgufType::Q4_0 ||
         t == GgufType::Q4_1;
}

const char* gguf_value_type_name(GgufValueType t) {
  const auto v = static_cast<std::uint32_t>(t);
  return v < kValueTypeCount ? kValueTypeNames[v] : "unknown";
}

std::int64_t GgufTensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;  // the parser refused a product that overflows
  return n;
}

void gguf_dequantize_row(GgufType type, const std::uint8_t* src, float* out, std::int64_t n) {
  const auto layout = gguf_block_layout(type);
  if (!gguf_can_dequantize(type) || !layout)
    throw Error("GGUF tensor type " + gguf_type_name(type) +
                " cannot be dequantized (refit reads F32, F16, BF16, Q8_0, Q4_0 and Q4_1)");
  if (n < 0 || static_cast<std::uint64_t>(n) % layout->elements != 0)
    throw Error("GGUF dequantization of " + std::to_string(n) + " elements: not a whole number of " + gguf_type_name(type) +
                " blocks of " + std::to_string(layout->elements));
  // The arithmetic is gguf-py's (gguf/quants.py, numpy in float32) and ggml's reference rows
  // (dequantize_row_q*): one float32 product per element, plus one float32 sum for Q4_1. This
  // file is compiled with -ffp-contract=off, so d * q + m is never fused into one rounding.
  switch (type) {
    case GgufType::F32: std::memcpy(out, src, static_cast<std::size_t>(n) * 4); return;
    case GgufType::F16:
      for (std::int64_t i = 0; i < n; ++i) out[i] = half_to_float(load_u16(src + 2 * i));
      return;
    case GgufType::BF16:
      for (std::int64_t i = 0; i < n; ++i) out[i] = bits_to_float(static_cast<std::uint32_t>(load_u16(src + 2 * i)) << 16);
      return;
    case GgufType::Q8_0:  // {fp16 d; int8 q[32]}: d * q
      for (std::int64_t b = 0; b < n / 32; ++b, src += 34, out += 32) {
        const float d = half_to_float(load_u16(src));
        for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<std::int8_t>(src[2 + j])) * d;
      }
      return;
    case GgufType::Q4_0:  // {fp16 d; uint8 qs[16]}: element j < 16 is the low nibble of qs[j], j + 16 the high
      for (std::int64_t b = 0; b < n / 32; ++b, src += 18, out += 32) {
        const float d = half_to_float(load_u16(src));
        for (int j = 0; j < 16; ++j) {
          out[j] = d * static_cast<float>(static_cast<int>(src[2 + j] & 0x0F) - 8);
          out[j + 16] = d * static_cast<float>(static_cast<int>(src[2 + j] >> 4) - 8);
        }
      }
      return;
    case GgufType::Q4_1:  // {fp16 d; fp16 m; uint8 qs[16]}: d * q + m, nibbles as Q4_0
      for (std::int64_t b = 0; b < n / 32; ++b, src += 20, out += 32) {
        const float d = half_to_float(load_u16(src));
        const float m = half_to_float(load_u16(src + 2));
        for (int j = 0; j < 16; ++j) {
          out[j] = d * static_cast<float>(src[4 + j] & 0x0F) + m;
          out[j + 16] = d * static_cast<float>(src[4 + j] >> 4) + m;
        }
      }
      return;
    default: break;
  }
  throw Error("GGUF tensor type " + gguf_type_name(type) + " cannot be dequantized");
}

// ---- parsing ---------------------------------------------------------------------------------

/// Reads the header of a GGUF image or file into a GgufFile, checking every length against the
/// bytes that remain before anything is allocated or copied.
class GgufParser {
 public:
  GgufParser(GgufFile& f, const std::uint8_t* mem, int fd) : f_(f), mem_(mem), fd_(fd) {}

  void run() {
    where_ = "header";
    const std::uint8_t* magic = take(4, "the magic bytes");
    if (std::memcmp(magic, "GGUF", 4) != 0) fail_here("does not start with the magic \"GGUF\" (not a GGUF file)");
    const auto version = read<std::uint32_t>("the version");
    const std::uint32_t swapped = __builtin_bswap32(version);
    if (swapped == 2 || swapped == 3)
      fail_here("big-endian GGUF (version " + std::to_string(swapped) + " byte-swapped) is not supported");
    if (version == 1) fail_here("GGUF version 1 (32-bit counts) is not supported: convert the model again");
    if (version != 2 && version != 3)
      fail_here("unsupported GGUF version " + std::to_string(version) + " (this reader reads versions 2 and 3)");
    f_.version_ = version;
    const auto n_tensors = read<std::uint64_t>("the tensor count");
    const auto n_kv = read<std::uint64_t>("the metadata count");
    // The smallest metadata entry is 13 bytes (key length, type, a UINT8) and the smallest tensor
    // info 32 (name length, n_dims, one dimension, type, offset): larger counts cannot fit.
    if (n_kv > remaining() / 13)
      fail_here(std::to_string(n_kv) + " metadata entries cannot fit in the " + std::to_string(remaining()) +
                " bytes after the header");
    if (n_tensors > remaining() / 32)
      fail_here(std::to_string(n_tensors) + " tensor infos cannot fit in the " + std::to_string(remaining()) +
                " bytes after the header");

    for (std::uint64_t i = 0; i < n_kv; ++i) {
      where_ = "metadata entry " + std::to_string(i) + " of " + std::to_string(n_kv);
      std::string key = read_string("its key");
      where_ = "metadata key \"" + key + "\"";
      if (f_.metadata_.count(key)) fail_here("appears twice");
      const auto type = read_value_type("its value type");
      f_.metadata_.emplace(std::move(key), read_value(type));
    }

    if (f_.has("general.alignment")) {
      where_ = "metadata key \"general.alignment\"";
      const GgufValue& v = f_.metadata_.at("general.alignment");
      if (v.type != GgufValueType::UINT32)
        fail_here(std::string("is ") + gguf_value_type_name(v.type) + ", the format requires UINT32");
      const std::uint64_t a = std::get<std::uint64_t>(v.value);
      if (a == 0 || (a & (a - 1)) != 0) fail_here(std::to_string(a) + " is not a power of two");
      f_.alignment_ = a;
    }

    f_.tensors_.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      where_ = "tensor info " + std::to_string(i) + " of " + std::to_string(n_tensors);
      GgufTensorInfo t;
      t.name = read_string("its name");
      where_ = "tensor \"" + t.name + "\"";
      if (f_.index_.count(t.name)) fail_here("appears twice");
      const auto n_dims = read<std::uint32_t>("its number of dimensions");
      if (n_dims < 1 || n_dims > 4) fail_here(std::to_string(n_dims) + " dimensions (GGUF tensors have 1 to 4)");
      std::vector<std::uint64_t> ne(n_dims);  // GGUF's order: innermost first
      for (auto& d : ne) d = read<std::uint64_t>("a dimension");
      const auto raw_type = read<std::uint32_t>("its type");
      const TypeEntry* type = find_type(raw_type);
      if (!type) fail_here("tensor type " + std::to_string(raw_type) + " is not a ggml type");
      t.type = type->type;
      unsigned __int128 numel = 1;
      for (std::size_t d = 0; d < ne.size(); ++d) {
        if (ne[d] == 0) fail_here("dimension " + std::to_string(d) + " is 0");
        numel *= ne[d];
        if (numel > static_cast<unsigned __int128>(std::numeric_limits<std::int64_t>::max()))
          fail_here("its dimensions' product overflows");
      }
      if (ne[0] % type->elements != 0)
        fail_here("innermost dimension " + std::to_string(ne[0]) + " is not a multiple of " + type->name + "'s block of " +
                  std::to_string(type->elements) + " elements");
      // numel < 2^63 and bytes per element <= 40, so the byte count fits in 128 bits; it must fit in 64.
      const unsigned __int128 nbytes = numel / type->elements * type->bytes;
      if (nbytes > std::numeric_limits<std::uint64_t>::max()) fail_here("its byte size overflows");
      t.nbytes = static_cast<std::uint64_t>(nbytes);
      for (auto it = ne.rbegin(); it != ne.rend(); ++it) t.shape.push_back(static_cast<std::int64_t>(*it));
      t.offset = read<std::uint64_t>("its data offset");
      if (t.offset % f_.alignment_ != 0)
        fail_here("data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                  std::to_string(f_.alignment_));
      f_.index_[t.name] = f_.tensors_.size();
      f_.tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment (pos_ <= size, so no overflow).
    f_.data_start_ = pos_ + (f_.alignment_ - pos_ % f_.alignment_) % f_.alignment_;
    if (f_.tensors_.empty()) return;
    if (f_.data_start_ > f_.size_)
      fail(f_.label_, "the data section would start at byte " + std::to_string(f_.data_start_) +
                          ", past the end of the file (" + std::to_string(f_.size_) + " bytes)");
    const std::uint64_t data_size = f_.size_ - f_.data_start_;
    std::vector<const GgufTensorInfo*> sorted;
    for (const auto& t : f_.tensors_) {
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        fail(f_.label_, "tensor \"" + t.name + "\" (" + gguf_type_name(t.type) + ", " + std::to_string(t.nbytes) +
                            " bytes at data offset " + std::to_string(t.offset) +
                            ") runs past the end of the data section (" + std::to_string(data_size) +
                            " bytes from file offset " + std::to_string(f_.data_start_) + ")");
      sorted.push_back(&t);
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < sorted.size(); ++i) {
      const GgufTensorInfo& prev = *sorted[i - 1];
      if (sorted[i]->offset < prev.offset + prev.nbytes)
        fail(f_.label_, "tensor \"" + sorted[i]->name + "\" (data offset " + std::to_string(sorted[i]->offset) +
                            ") overlaps tensor \"" + prev.name + "\" (bytes [" + std::to_string(prev.offset) + ", " +
                            std::to_string(prev.offset + prev.nbytes) + "))");
    }
  }

 private:
  [[noreturn]] void fail_here(const std::string& what) const { fail(f_.label_, where_ + ": " + what); }
  std::uint64_t remaining() const { return f_.size_ - pos_; }

  /// `n` bytes at the cursor, which then moves past them; the end of the file is an error naming
  /// what was being read.
  const std::uint8_t* take(std::uint64_t n, const char* what) {
    if (n > remaining())
      fail_here(std::string(what) + " (" + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                ") runs past the end of the file (" + std::to_string(f_.size_) + " bytes)");
    const std::uint8_t* p = nullptr;
    if (mem_) {
      p = mem_ + pos_;
    } else {
      // A window of the file around the cursor: the vocabulary's ~100,000 strings cost a few
      // reads, not one each. n <= remaining(), so the window never exceeds the file's size.
      if (pos_ < window_start_ || pos_ + n > window_start_ + window_.size()) {
        const std::uint64_t len = std::min<std::uint64_t>(std::max<std::uint64_t>(n, kWindow), remaining());
        window_.resize(static_cast<std::size_t>(len));
        window_start_ = pos_;
        if (!pread_full(fd_, window_.data(), window_.size(), pos_, f_.label_))
          fail(f_.label_, "the file is shorter than when it was opened (truncated while reading?)");
      }
      p = window_.data() + (pos_ - window_start_);
    }
    pos_ += n;
    return p;
  }

  template <typename T>
  T read(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }

  std::string read_string(const char* what) {
    const auto n = read<std::uint64_t>(what);
    const std::uint8_t* p = take(n, what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
  }

  GgufValueType read_value_type(const char* what) {
    const auto raw = read<std::uint32_t>(what);
    if (raw >= kValueTypeCount)
      fail_here("value type " + std::to_string(raw) + " is not a GGUF value type (0 to " +
                std::to_string(kValueTypeCount - 1) + ")");
    return static_cast<GgufValueType>(raw);
  }

  bool read_bool() {
    const auto b = read<std::uint8_t>("a BOOL value");
    if (b > 1) fail_here("BOOL value " + std::to_string(b) + " is neither 0 nor 1");
    return b == 1;
  }

  /// A scalar of an integer or float type, widened.
  template <typename T>
  T read_scalar(GgufValueType t) {
    switch (t) {
      case GgufValueType::UINT8: return static_cast<T>(read<std::uint8_t>("a UINT8 value"));
      case GgufValueType::INT8: return static_cast<T>(read<std::int8_t>("an INT8 value"));
      case GgufValueType::UINT16: return static_cast<T>(read<std::uint16_t>("a UINT16 value"));
      case GgufValueType::INT16: return static_cast<T>(read<std::int16_t>("an INT16 value"));
      case GgufValueType::UINT32: return static_cast<T>(read<std::uint32_t>("a UINT32 value"));
      case GgufValueType::INT32: return static_cast<T>(read<std::int32_t>("an INT32 value"));
      case GgufValueType::UINT64: return static_cast<T>(read<std::uint64_t>("a UINT64 value"));
      case GgufValueType::INT64: return static_cast<T>(read<std::int64_t>("an INT64 value"));
      case GgufValueType::FLOAT32: return static_cast<T>(read<float>("a FLOAT32 value"));
      case GgufValueType::FLOAT64: return static_cast<T>(read<double>("a FLOAT64 value"));
      default: break;
    }
    fail_here("internal: not a scalar type");
  }

  GgufValue read_value(GgufValueType type) {
    GgufValue v;
    v.type = type;
    if (is_unsigned(type)) v.value = read_scalar<std::uint64_t>(type);
    else if (is_signed(type))
      v.value = read_scalar<std::int64_t>(type);
    else if (is_float(type))
      v.value = read_scalar<double>(type);
    else if (type == GgufValueType::BOOL)
      v.value = read_bool();
    else if (type == GgufValueType::STRING)
      v.value = read_string("the string value");
    else
      read_array(v);
    return v;
  }

  void read_array(GgufValue& v) {
    const auto et = read_value_type("the array's element type");
    if (et == GgufValueType::ARRAY) fail_here("an array of arrays (nested arrays are not supported)");
    v.element_type = et;
    const auto n = read<std::uint64_t>("the array's length");
    // Refused before anything is reserved: each element takes at least this many bytes.
    const std::uint64_t min_size = et == GgufValueType::STRING ? 8 : scalar_size(et);
    if (n > remaining() / min_size)
      fail_here("an array of " + std::to_string(n) + " " + gguf_value_type_name(et) + " elements (at least " +
                std::to_string(min_size) + " bytes each) cannot fit in the " + std::to_string(remaining()) +
                " bytes left in the file");
    const auto count = static_cast<std::size_t>(n);
    if (is_unsigned(et)) v.value = read_elements<std::uint64_t>(count, [&] { return read_scalar<std::uint64_t>(et); });
    else if (is_signed(et))
      v.value = read_elements<std::int64_t>(count, [&] { return read_scalar<std::int64_t>(et); });
    else if (is_float(et))
      v.value = read_elements<double>(count, [&] { return read_scalar<double>(et); });
    else if (et == GgufValueType::BOOL)
      v.value = read_elements<bool>(count, [&] { return read_bool(); });
    else
      v.value = read_elements<std::string>(count, [&] { return read_string("a string element"); });
  }

  template <typename T, typename F>
  std::vector<T> read_elements(std::size_t n, F&& next) {
    std::vector<T> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.push_back(next());
    return out;
  }

  GgufFile& f_;
  const std::uint8_t* mem_;
  int fd_;
  std::uint64_t pos_ = 0;
  std::vector<std::uint8_t> window_;
  std::uint64_t window_start_ = 0;
  std::string where_;
};

GgufFile GgufFile::open(const std::filesystem::path& path) {
  ReadableFile file = open_regular_file(path);
  GgufFile f;
  f.fd_ = std::move(file.fd);
  f.size_ = file.size;
  f.label_ = path.string();
  GgufParser(f, nullptr, *f.fd_).run();
  return f;
}

GgufFile GgufFile::from_bytes(std::shared_ptr<const std::uint8_t> bytes, std::size_t size, std::string label) {
  GgufFile f;
  f.bytes_ = std::move(bytes);
  f.size_ = size;
  f.label_ = std::move(label);
  GgufParser(f, f.bytes_.get(), -1).run();
  return f;
}

// ---- metadata --------------------------------------------------------------------------------

namespace {
std::string describe(const GgufValue& v) {
  if (v.type == GgufValueType::ARRAY) return std::string("an ARRAY of ") + gguf_value_type_name(v.element_type);
  return gguf_value_type_name(v.type);
}
}  // namespace

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) throw Error(label_ + ": no metadata key \"" + key + "\"");
  return it->second;
}

namespace {
[[noreturn]] void type_error(const std::string& label, const std::string& key, const GgufValue& v, const char* expected) {
  throw Error(label + ": metadata key \"" + key + "\" is " + describe(v) + ", expected " + expected);
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::STRING) type_error(label_, key, v, "a STRING");
  return std::get<std::string>(v.value);
}

std::uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = value(key);
  if (is_unsigned(v.type)) return std::get<std::uint64_t>(v.value);
  if (is_signed(v.type)) {
    const std::int64_t s = std::get<std::int64_t>(v.value);
    if (s < 0)
      throw Error(label_ + ": metadata key \"" + key + "\" is " + std::to_string(s) + ", expected a non-negative integer");
    return static_cast<std::uint64_t>(s);
  }
  type_error(label_, key, v, "an unsigned integer");
}

std::int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  if (is_signed(v.type)) return std::get<std::int64_t>(v.value);
  if (is_unsigned(v.type)) {
    const std::uint64_t u = std::get<std::uint64_t>(v.value);
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw Error(label_ + ": metadata key \"" + key + "\" is " + std::to_string(u) + ", beyond the int64 range");
    return static_cast<std::int64_t>(u);
  }
  type_error(label_, key, v, "an integer");
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_float(v.type)) type_error(label_, key, v, "a FLOAT32 or FLOAT64");
  return std::get<double>(v.value);
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::BOOL) type_error(label_, key, v, "a BOOL");
  return std::get<bool>(v.value);
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || v.element_type != GgufValueType::STRING)
    type_error(label_, key, v, "an ARRAY of STRING");
  return std::get<std::vector<std::string>>(v.value);
}

std::vector<std::int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type == GgufValueType::ARRAY && is_signed(v.element_type)) return std::get<std::vector<std::int64_t>>(v.value);
  if (v.type == GgufValueType::ARRAY && is_unsigned(v.element_type)) {
    const auto& u = std::get<std::vector<std::uint64_t>>(v.value);
    std::vector<std::int64_t> out;
    out.reserve(u.size());
    for (std::size_t i = 0; i < u.size(); ++i) {
      if (u[i] > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw Error(label_ + ": metadata key \"" + key + "\", element " + std::to_string(i) + ": " + std::to_string(u[i]) +
                    " is beyond the int64 range");
      out.push_back(static_cast<std::int64_t>(u[i]));
    }
    return out;
  }
  type_error(label_, key, v, "an ARRAY of integers");
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || !is_float(v.element_type))
    type_error(label_, key, v, "an ARRAY of FLOAT32 or FLOAT64");
  return std::get<std::vector<double>>(v.value);
}

// ---- tensors ---------------------------------------------------------------------------------

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it != index_.end()) return tensors_[it->second];
  std::string msg = label_ + ": no tensor \"" + name + "\" (the file has " + std::to_string(tensors_.size()) + " tensors";
  for (std::size_t i = 0; i < tensors_.size() && i < 5; ++i) msg += (i ? ", " : ": ") + tensors_[i].name;
  if (tensors_.size() > 5) msg += ", ...";
  throw Error(msg + ")");
}

void GgufFile::read_bytes(std::uint64_t offset, std::uint64_t n, std::uint8_t* out) const {
  if (n == 0) return;
  if (bytes_) {
    std::memcpy(out, bytes_.get() + data_start_ + offset, static_cast<std::size_t>(n));
  } else if (!pread_full(*fd_, out, static_cast<std::size_t>(n), data_start_ + offset, label_)) {
    throw Error("corrupt GGUF file " + label_ + ": the file is shorter than when it was opened (truncated while reading?)");
  }
}

std::string GgufFile::sampled_digest() const {
  std::vector<ByteRange> ranges;
  for (const auto& t : tensors_) ranges.push_back({data_start_ + t.offset, data_start_ + t.offset + t.nbytes});
  return sampled_file_digest(size_, std::min<std::uint64_t>(data_start_, size_), ranges,
                             [this](std::uint64_t at, std::uint64_t n, unsigned char* out) {
                               if (n == 0) return;
                               if (bytes_) std::memcpy(out, bytes_.get() + at, static_cast<std::size_t>(n));
                               else if (!pread_full(*fd_, out, static_cast<std::size_t>(n), at, label_))
                                 throw Error("corrupt GGUF file " + label_ +
                                             ": the file is shorter than when it was opened (truncated while reading?)");
                             });
}

std::vector<std::uint8_t> GgufFile::read_raw(const std::string& name) const {
  const GgufTensorInfo& t = info(name);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(t.nbytes));
  read_bytes(t.offset, t.nbytes, out.data());
  return out;
}

template <typename F>
void GgufFile::for_each_chunk(const GgufTensorInfo& t, F&& f) const {
  const GgufBlockLayout layout = *gguf_block_layout(t.type);
  const std::int64_t row_elements = t.shape.back();  // innermost dimension, a whole number of blocks
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(row_elements) / layout.elements * layout.bytes;
  const std::int64_t rows = t.numel() / row_elements;
  if (bytes_) {
    f(bytes_.get() + data_start_ + t.offset, std::int64_t{0}, t.numel());
    return;
  }
  const std::int64_t chunk_rows = static_cast<std::int64_t>(std::max<std::uint64_t>(1, kChunkBytes / row_bytes));
  std::vector<std::uint8_t> buffer(static_cast<std::size_t>(std::min(chunk_rows, rows) * row_bytes));
  for (std::int64_t r = 0; r < rows; r += chunk_rows) {
    const std::int64_t n_rows = std::min(chunk_rows, rows - r);
    read_bytes(t.offset + static_cast<std::uint64_t>(r) * row_bytes, static_cast<std::uint64_t>(n_rows) * row_bytes,
               buffer.data());
    f(static_cast<const std::uint8_t*>(buffer.data()), r * row_elements, n_rows * row_elements);
  }
}

namespace {
void check_dequantizable(const std::string& label, const GgufTensorInfo& t) {
  if (!gguf_can_dequantize(t.type))
    throw Error(label + ": tensor \"" + t.name + "\" is " + gguf_type_name(t.type) +
                ", which refit cannot dequantize (it reads F32, F16, BF16, Q8_0, Q4_0 and Q4_1)");
}
}  // namespace

void GgufFile::dequantize(const std::string& name, float* out) const {
  const GgufTensorInfo& t = info(name);
  check_dequantizable(label_, t);
  for_each_chunk(t, [&](const std::uint8_t* src, std::int64_t first, std::int64_t n) {
    gguf_dequantize_row(t.type, src, out + first, n);
  });
}

void GgufFile::dequantize_bf16(const std::string& name, std::uint16_t* out) const {
  const GgufTensorInfo& t = info(name);
  check_dequantizable(label_, t);
  const std::uint64_t block_elements = gguf_block_layout(t.type)->elements, block_bytes = gguf_block_layout(t.type)->bytes;
  // Staged through a small float buffer (kBf16Elements, a whole number of blocks), never a float
  // copy of the tensor.
  std::vector<float> stage(static_cast<std::size_t>(std::min<std::int64_t>(kBf16Elements, t.numel())));
  for_each_chunk(t, [&](const std::uint8_t* src, std::int64_t first, std::int64_t n) {
    for (std::int64_t off = 0; off < n; off += kBf16Elements) {
      const std::int64_t m = std::min(kBf16Elements, n - off);
      gguf_dequantize_row(t.type, src + static_cast<std::uint64_t>(off) / block_elements * block_bytes, stage.data(), m);
      std::uint16_t* dst = out + first + off;
      for (std::int64_t i = 0; i < m; ++i) dst[i] = float_to_bf16(stage[static_cast<std::size_t>(i)]);
    }
  });
}

}  // namespace refit::io
