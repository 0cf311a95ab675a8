#include "idx.h"

#include <cstdio>

#include <ATen/ATen.h>

#include "data_file.h"
#include "refit/error.h"

namespace refit::datasets {

namespace {

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

std::uint32_t big_endian(const unsigned char* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | std::uint32_t(p[3]);
}

std::string plural(std::uint64_t n, const std::string& what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

}  // namespace

IdxArray read_idx(const std::filesystem::path& path, std::size_t ndims, const std::string& record) {
  const std::string file = path.string();
  DataFile in(path);
  IdxArray out;
  out.header_bytes = 4 + 4 * ndims;

  std::vector<unsigned char> header(out.header_bytes);
  std::size_t got = in.read(header.data(), 4);
  const std::uint32_t expected_magic = 0x0800u | static_cast<std::uint32_t>(ndims);
  const std::string expected = hex32(expected_magic) + " (unsigned bytes, " + plural(ndims, "dimension") + ")";
  if (got < 4)
    throw Error(file + ": not an IDX file: " + plural(got, "byte") + " long, expected the magic number " + expected +
                (in.error().empty() ? "" : "; " + in.error()));
  const std::uint32_t magic = big_endian(header.data());
  if (magic != expected_magic) {
    std::string why;
    if ((magic >> 16) != 0) why = " (the first two bytes must be 0: not an IDX file)";
    else if (((magic >> 8) & 0xFF) != 0x08)
      why = " (data type 0x" + hex32((magic >> 8) & 0xFF).substr(8) + "; only 0x08, unsigned bytes, is supported)";
    else
      why = " (" + plural(magic & 0xFF, "dimension") + ")";
    throw Error(file + ": bad IDX magic number " + hex32(magic) + " at offset 0" + why + ", expected " + expected);
  }
  got = in.read(header.data() + 4, out.header_bytes - 4);
  if (got < out.header_bytes - 4)
    throw Error(file + ": truncated IDX header: " + plural(4 + got, "byte") + ", expected " +
                std::to_string(out.header_bytes) + (in.error().empty() ? "" : "; " + in.error()));

  std::uint64_t total = 1;
  for (std::size_t d = 0; d < ndims; ++d) {
    std::uint32_t n = big_endian(header.data() + 4 + 4 * d);
    if (n == 0)
      throw Error(file + ": IDX dimension " + std::to_string(d) + " is 0 (offset " + std::to_string(4 + 4 * d) + ")");
    out.dims.push_back(static_cast<std::int64_t>(n));
    total *= n;
    if (total > (std::uint64_t(1) << 40))
      throw Error(file + ": IDX header announces more than 2^40 bytes of data (offset " + std::to_string(4 + 4 * d) + ")");
  }
  const std::uint64_t record_bytes = total / static_cast<std::uint64_t>(out.dims[0]);

  out.data = at::empty(out.dims, at::TensorOptions().dtype(at::kByte));
  got = in.read(out.data.data_ptr<std::uint8_t>(), static_cast<std::size_t>(total));
  if (got < total) {
    std::uint64_t broken = got / record_bytes;
    throw Error(file + ": truncated: the header announces " + plural(out.dims[0], record) + " of " +
                plural(record_bytes, "byte") + " (" + std::to_string(out.header_bytes + total) +
                " bytes in all) but the data ends at offset " + std::to_string(out.header_bytes + got) + ", in " + record +
                " " + std::to_string(broken) + " (which starts at offset " +
                std::to_string(out.header_bytes + broken * record_bytes) + ")" +
                (in.error().empty() ? "" : "; " + in.error()));
  }
  std::uint64_t extra = in.skip_to_end();
  if (!in.error().empty())
    throw Error(file + ": " + in.error() + " after the last " + record + " (offset " +
                std::to_string(out.header_bytes + total + extra) + ")");
  if (extra)
    throw Error(file + ": " + plural(extra, "unexpected byte") + " after the last " + record + " (from offset " +
                std::to_string(out.header_bytes + total) + "; the header announces " + plural(out.dims[0], record) + ")");
  return out;
}

}  // namespace refit::datasets
