#pragma once
// GGUF reading (llama.cpp's single-file model format, versions 2 and 3, which share one layout;
// little-endian files only).
//
// Like the safetensors reader (safetensors.h), everything is checked before a tensor byte is
// touched: the magic and version, every length and count against the bytes that remain (a string
// or array claiming more bytes than the file has is refused before anything is allocated), every
// metadata value type, nesting of arrays (one level: an array of arrays is refused),
// `general.alignment` (a power of two), each tensor's number of dimensions (1..4), dimensions
// (positive, product without overflow, the innermost a multiple of the type's block), type (known
// to the format; a type refit cannot dequantize is refused by name when it is read, not when the
// file is opened), offset (aligned), and that every tensor lies inside the data section without
// overlapping another. A truncated or hostile file is an error naming the file and the key or
// tensor, never an out-of-bounds read.
//
// No LibTorch here: the tokenizer library (plugins/text) and the fuzz target link this alone.
// Tensors come out as raw bytes or dequantized into caller-provided float or bf16 buffers;
// gguf_tensor.h wraps them as torch tensors. Shapes are given in torch's order (GGUF lists the
// innermost dimension first; this reader reverses them), so a linear layer's weight is
// [out_features, in_features] as in PyTorch.
//
// A file is not memory-mapped: open() reads the header with pread() and keeps the descriptor;
// tensor bytes are read with pread() when asked for.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace refit::io {

/// GGUF's tensor types (ggml_type, as gguf-py 0.19.0 lists them with their block layouts). A
/// type whose layout is known opens (its bytes can be located and bounds-checked) but only those
/// gguf_can_dequantize() accepts are read; a number the format does not define is refused when
/// the file is opened.
enum class GgufType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

/// "Q4_1", "F32", ...; "type 42" for a value the format does not define.
std::string gguf_type_name(GgufType t);
/// Elements per block and bytes per block of a type (F32: 1 and 4; Q8_0: 32 and 34; Q4_0: 32 and
/// 18; Q4_1: 32 and 20); nullopt for a type whose layout this reader does not know.
struct GgufBlockLayout {
  std::uint64_t elements, bytes;
};
std::optional<GgufBlockLayout> gguf_block_layout(GgufType t);
/// Whether dequantize() supports the type: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
bool gguf_can_dequantize(GgufType t);

/// GGUF's metadata value types (gguf_type).
enum class GgufValueType : std::uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);

/// One metadata value. Integers of every width are held as int64/uint64 with their declared type
/// kept; an array holds scalars or strings of one element type (never arrays).
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  GgufValueType element_type = GgufValueType::UINT8;  // arrays: the elements' type
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, std::vector<std::uint64_t>, std::vector<std::int64_t>,
               std::vector<double>, std::vector<bool>, std::vector<std::string>>
      value;
};

struct GgufTensorInfo {
  std::string name;
  GgufType type = GgufType::F32;
  std::vector<std::int64_t> shape;  // torch order: outermost first
  std::uint64_t offset = 0;         // from the start of the data section
  std::uint64_t nbytes = 0;         // stored (packed) bytes
  std::int64_t numel() const;
};

class GgufFile {
 public:
  /// Opens and validates; throws refit::Error naming the file and the place on any inconsistency.
  static GgufFile open(const std::filesystem::path& path);
  /// Validates an in-memory image (tests and fuzzing).
  static GgufFile from_bytes(std::shared_ptr<const std::uint8_t> bytes, std::size_t size, std::string label);

  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  const std::string& label() const { return label_; }
  /// Where the data section starts (the tensor infos' end, rounded up to the alignment).
  std::uint64_t data_start() const { return data_start_; }
  /// The file's digest for the frozen base's fingerprint: header and sampled windows of every
  /// tensor, O(tensors) bytes read (io/sampled_digest.h).
  std::string sampled_digest() const;

  // ---- metadata ----
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  bool has(const std::string& key) const { return metadata_.count(key) > 0; }
  /// The value of `key`; an Error naming the key (and the file) when absent.
  const GgufValue& value(const std::string& key) const;
  /// Typed access: an Error naming the key when it is absent or of another type. get_uint
  /// accepts every unsigned and non-negative signed integer type, get_int every integer type,
  /// get_float FLOAT32/FLOAT64.
  std::string get_string(const std::string& key) const;
  std::uint64_t get_uint(const std::string& key) const;
  std::int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  /// Integer arrays of any integer element type, widened.
  std::vector<std::int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  /// `general.architecture` ("llama", "qwen2", ...).
  std::string architecture() const { return get_string("general.architecture"); }

  // ---- tensors ----
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  /// An Error naming the tensor (and listing a few present names) when absent.
  const GgufTensorInfo& info(const std::string& name) const;
  /// The stored bytes of a tensor, as packed in the file.
  std::vector<std::uint8_t> read_raw(const std::string& name) const;
  /// Dequantizes a tensor into `out` (numel() floats), row-major in torch order. Throws for a
  /// type gguf_can_dequantize() refuses, naming the tensor and the type.
  void dequantize(const std::string& name, float* out) const;
  /// The same, rounded to bf16 (round to nearest even, as torch's float -> bfloat16 cast; a NaN
  /// becomes 0x7FC0, as c10::BFloat16's), as raw uint16 bit patterns. Staged through a small
  /// float buffer, never a float copy of the tensor.
  void dequantize_bf16(const std::string& name, std::uint16_t* out) const;

 private:
  friend class GgufParser;  // gguf.cpp: reads and checks the header into these fields
  /// `n` bytes at `offset` of the data section (checked by the parser to lie inside it).
  void read_bytes(std::uint64_t offset, std::uint64_t n, std::uint8_t* out) const;
  /// Calls `f(src, first_element, n_elements)` over a tensor's packed bytes, whole rows at a
  /// time (a bounded buffer for a file; the image itself for from_bytes).
  template <typename F>
  void for_each_chunk(const GgufTensorInfo& t, F&& f) const;

  std::shared_ptr<const std::uint8_t> bytes_;  // whole image (from_bytes), or null
  std::shared_ptr<const int> fd_;              // the open file (open()), or null
  std::size_t size_ = 0;
  std::uint64_t data_start_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::string label_;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
};

/// Dequantizes `n` elements (a multiple of the type's block) of packed `src` into `out`.
/// Exposed for tests and the quantized-base kernels.
void gguf_dequantize_row(GgufType type, const std::uint8_t* src, float* out, std::int64_t n);

}  // namespace refit::io
