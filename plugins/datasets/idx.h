#pragma once
// The IDX format (LeCun's MNIST files): a big-endian header, magic 0x0000TTNN with data type TT
// and NN dimensions, NN 32-bit sizes, then the data in row-major order. Only unsigned bytes
// (TT = 0x08) are read; gzipped files are decompressed on the fly.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/types.h>

namespace refit::datasets {

struct IdxArray {
  std::vector<std::int64_t> dims;  // from the header
  at::Tensor data;                 // uint8, shaped `dims`
  std::uint64_t header_bytes = 0;  // where the data starts
};

/// Reads an IDX file of unsigned bytes with `ndims` dimensions. `record` names one entry along
/// the first dimension in errors ("image", "label"). Throws refit::Error naming the file and the
/// offset (uncompressed) or record for: a short header, a wrong magic number, a zero dimension,
/// truncated data, trailing bytes, corrupt gzip data.
IdxArray read_idx(const std::filesystem::path& path, std::size_t ndims, const std::string& record);

}  // namespace refit::datasets
