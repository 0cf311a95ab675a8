#include "io/safetensors.h"

#include "io/pread_full.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/atomic_output.h"
#include "io/fault.h"
#include "io/sampled_digest.h"
#include "refit/error.h"

namespace refit::io {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace {

constexpr std::uint64_t kMaxHeader = 100ull * 1024 * 1024;  // the reference implementation's limit

struct DtypeEntry {
  const char* name;
  c10::ScalarType type;
  std::size_t size;
};
const DtypeEntry kDtypes[] = {
    {"F64", c10::kDouble, 8}, {"F32", c10::kFloat, 4}, {"F16", c10::kHalf, 2},  {"BF16", c10::kBFloat16, 2},
    {"I64", c10::kLong, 8},   {"I32", c10::kInt, 4},   {"I16", c10::kShort, 2}, {"I8", c10::kChar, 1},
    {"U8", c10::kByte, 1},    {"BOOL", c10::kBool, 1},
};

const DtypeEntry* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw Error("corrupt safetensors file " + label + ": " + what);
}

/// numel * size with overflow detection.
bool byte_size(const std::vector<std::int64_t>& shape, std::size_t elem, std::uint64_t& out) {
  unsigned __int128 n = elem;
  for (auto d : shape) {
    n *= static_cast<unsigned __int128>(d);
    if (n > std::numeric_limits<std::uint64_t>::max()) return false;
  }
  out = static_cast<std::uint64_t>(n);
  return true;
}

}  // namespace

const char* safetensors_dtype_name(c10::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw Error(std::string("safetensors cannot store dtype ") + c10::toString(t));
}

namespace {

/// The header length from the 8-byte prefix, checked against the file size.
std::uint64_t header_length(const std::uint8_t* prefix, std::size_t size, const std::string& label) {
  std::uint64_t n = 0;
  std::memcpy(&n, prefix, 8);
  if (n > kMaxHeader) fail(label, "header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n > size - 8)
    fail(label,
         "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) + " bytes)");
  return n;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  ReadableFile file = open_regular_file(path);
  const int fd = *file.fd;
  SafetensorsFile f;
  f.fd_ = std::move(file.fd);
  f.size_ = file.size;
  f.label_ = path.string();
  std::uint8_t prefix[8];
  if (f.size_ < 8 || !pread_full(fd, prefix, 8, 0, f.label_))
    fail(f.label_, "file is " + std::to_string(f.size_) + " bytes, shorter than the 8-byte header length");
  const std::uint64_t n = header_length(prefix, f.size_, f.label_);
  std::vector<std::uint8_t> header(static_cast<std::size_t>(n));
  if (!pread_full(fd, header.data(), header.size(), 8, f.label_))
    fail(f.label_, "the file is shorter than when it was opened (truncated while reading?)");
  f.parse_header(header.data(), n, f.size_);
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::shared_ptr<const std::uint8_t> bytes, std::size_t size, std::string label) {
  SafetensorsFile f;
  f.bytes_ = std::move(bytes);
  f.size_ = size;
  f.label_ = std::move(label);
  if (size < 8) fail(f.label_, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const std::uint64_t n = header_length(f.bytes_.get(), size, f.label_);
  f.parse_header(f.bytes_.get() + 8, n, size);
  return f;
}

void SafetensorsFile::parse_header(const std::uint8_t* text, std::uint64_t n, std::size_t size) {
  SafetensorsFile& f = *this;
  f.data_start_ = 8 + static_cast<std::size_t>(n);
  const std::uint64_t data_size = size - f.data_start_;
  if (n == 0) fail(f.label_, "header does not start with '{'");
  // nlohmann's parser takes a NUL byte for the end of the input, so "{...}\0garbage" would pass;
  // JSON text holds no raw NUL (in a string it must be escaped), so any NUL is an error.
  if (const void* nul = std::memchr(text, 0, static_cast<std::size_t>(n)))
    fail(f.label_, "NUL byte at offset " + std::to_string(static_cast<const std::uint8_t*>(nul) - text) +
                       " of the header (a header is JSON text, optionally padded with spaces)");
  if (text[0] != '{') fail(f.label_, "header does not start with '{'");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + n);
  } catch (const std::exception& e) {
    fail(f.label_, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(f.label_, "header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(f.label_, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(f.label_, "__metadata__/" + m.key() + " is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\": ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail(f.label_, where + "expected {dtype, shape, data_offsets}");
    if (!v["dtype"].is_string()) fail(f.label_, where + "dtype is not a string");
    const DtypeEntry* dt = find_dtype(v["dtype"].get<std::string>());
    if (!dt) fail(f.label_, where + "unsupported dtype \"" + v["dtype"].get<std::string>() + "\"");
    TensorInfo info;
    info.name = name;
    info.dtype = dt->type;
    if (!v["shape"].is_array()) fail(f.label_, where + "shape is not an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail(f.label_, where + "shape has a non-integer or negative dimension");
      std::uint64_t dim = d.get<std::uint64_t>();
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(f.label_, where + "dimension too large");
      info.shape.push_back(static_cast<std::int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(f.label_, where + "data_offsets must be two non-negative integers");
    info.begin = off[0].get<std::uint64_t>();
    info.end = off[1].get<std::uint64_t>();
    if (info.begin > info.end) fail(f.label_, where + "data_offsets begin > end");
    if (info.end > data_size)
      fail(f.label_, where + "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                         ") run past the data buffer (" + std::to_string(data_size) + " bytes)");
    std::uint64_t expected = 0;
    if (!byte_size(info.shape, dt->size, expected)) fail(f.label_, where + "shape overflows");
    if (expected != info.end - info.begin)
      fail(f.label_, where + "holds " + std::to_string(info.end - info.begin) + " bytes but dtype " + dt->name +
                         " and its shape need " + std::to_string(expected));
    f.tensors_.push_back(std::move(info));
  }
  // The tensors must tile the data buffer: sorted by offset, each starting where the last ended.
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : f.tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t cursor = 0;
  for (const TensorInfo* t : sorted) {
    if (t->begin < cursor) fail(f.label_, "tensor \"" + t->name + "\" overlaps the previous tensor");
    if (t->begin > cursor)
      fail(f.label_, "gap of " + std::to_string(t->begin - cursor) + " bytes before tensor \"" + t->name + "\"");
    cursor = t->end;
  }
  if (cursor != data_size) fail(f.label_, std::to_string(data_size - cursor) + " trailing bytes after the last tensor");
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(label_ + ": no tensor \"" + name + "\"");
  return tensors_[it->second];
}

torch::Tensor SafetensorsFile::load(const std::string& name) const {
  const TensorInfo& i = info(name);
  auto t = torch::empty(i.shape, torch::TensorOptions().dtype(i.dtype));
  if (i.end == i.begin) return t;
  const std::size_t n = static_cast<std::size_t>(i.end - i.begin);
  if (bytes_) {
    std::memcpy(t.data_ptr(), bytes_.get() + data_start_ + i.begin, n);
  } else if (!pread_full(*fd_, t.data_ptr(), n, data_start_ + i.begin, label_)) {
    throw Error("corrupt safetensors file " + label_ + ": tensor \"" + name +
                "\": the file is shorter than when it was opened (truncated while reading?)");
  }
  return t;
}

std::string SafetensorsFile::sampled_digest() const {
  std::vector<ByteRange> ranges;
  for (const auto& t : tensors_) ranges.push_back({data_start_ + t.begin, data_start_ + t.end});
  return sampled_file_digest(size_, data_start_, ranges, [this](std::uint64_t at, std::uint64_t n, unsigned char* out) {
    if (n == 0) return;
    if (bytes_) std::memcpy(out, bytes_.get() + at, static_cast<std::size_t>(n));
    else if (!pread_full(*fd_, out, static_cast<std::size_t>(n), at, label_))
      throw Error("corrupt safetensors file " + label_ +
                  ": the file is shorter than when it was opened (truncated while reading?)");
  });
}

std::map<std::string, torch::Tensor> SafetensorsFile::load_all() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& t : tensors_) out[t.name] = load(t.name);
  return out;
}

void write_file_atomic(const std::filesystem::path& path, const std::string& bytes) {
  AtomicOutputFile file(path);
  file.write(bytes);
  file.commit();
}

void save_safetensors(const std::filesystem::path& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> contiguous;
  std::uint64_t offset = 0;
  for (const auto& kv : tensors) {
    if (kv.first == "__metadata__") throw Error("a tensor cannot be named __metadata__");
    auto t = kv.second.detach().to(torch::kCPU).contiguous();
    std::uint64_t n = static_cast<std::uint64_t>(t.numel()) * t.element_size();
    header[kv.first] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                        {"shape", t.sizes().vec()},
                        {"data_offsets", {offset, offset + n}}};
    offset += n;
    contiguous.push_back(t);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned
  std::string out;
  out.reserve(8 + h.size() + offset);
  std::uint64_t n = h.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += h;
  for (const auto& t : contiguous)
    out.append(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.numel()) * t.element_size());
  write_file_atomic(path, out);
}

}  // namespace refit::io
