#pragma once
// safetensors reading and writing (https://github.com/huggingface/safetensors, format v0.x).
//
// Reading checks everything before it touches tensor bytes: the header length against the file
// size, the header as one JSON object starting with '{' and followed by nothing but whitespace
// (a NUL byte and garbage after it are refused, as the reference implementation refuses them),
// each entry's dtype, shape and data_offsets, that every tensor's byte size equals numel * dtype
// size, and that the tensors tile the data buffer exactly (sorted, no overlap, no gap, no
// trailing bytes). A truncated or hostile file is an error naming the file and the entry, never
// an out-of-bounds read.
//
// A file is not memory-mapped: open() reads the header with pread() and keeps the descriptor;
// load() reads a tensor's bytes with pread() straight into the tensor. A file truncated by
// another process after open() is then an error when a tensor is read ("shorter than when it was
// opened"), never a SIGBUS; a file rewritten in place (not replaced by rename, as refit's writer
// does) can still yield a mix of old and new bytes, which no reader can detect.
// Writing pads the header to 8 bytes and is atomic (temporary file, fsync, rename).
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace refit::io {

struct TensorInfo {
  std::string name;
  c10::ScalarType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data buffer
};

class SafetensorsFile {
 public:
  /// Opens and validates; throws refit::Error on any inconsistency.
  static SafetensorsFile open(const std::filesystem::path& path);

  /// Validates an in-memory image (used by open(); exposed for tests and fuzzing).
  static SafetensorsFile from_bytes(std::shared_ptr<const std::uint8_t> bytes, std::size_t size, std::string label);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  /// A CPU tensor owning a copy of the bytes.
  torch::Tensor load(const std::string& name) const;
  std::map<std::string, torch::Tensor> load_all() const;
  const std::string& label() const { return label_; }
  /// The file's digest for the frozen base's fingerprint: header and sampled windows of every
  /// tensor, O(tensors) bytes read (io/sampled_digest.h).
  std::string sampled_digest() const;

 private:
  /// Checks the header (`n` bytes at `header`) of a file of `size` bytes and indexes its tensors.
  void parse_header(const std::uint8_t* header, std::uint64_t n, std::size_t size);

  std::shared_ptr<const std::uint8_t> bytes_;  // whole image (from_bytes), or null
  std::shared_ptr<const int> fd_;              // the open file (open()), or null
  std::size_t size_ = 0;
  std::size_t data_start_ = 0;
  std::string label_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (any device; stored contiguous, little-endian) with `metadata`, atomically.
void save_safetensors(const std::filesystem::path& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The file format's dtype names.
const char* safetensors_dtype_name(c10::ScalarType t);

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, fsync, rename.
void write_file_atomic(const std::filesystem::path& path, const std::string& bytes);

}  // namespace refit::io
