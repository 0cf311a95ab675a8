#include "text_lines.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include <torch/types.h>

#include "refit/error.h"

namespace refit::text {

TextLines::TextLines(const std::string& file, std::shared_ptr<const WordPieceTokenizer> tokenizer, std::int64_t max_length,
                     std::string max_length_from)
    : file_(file), tokenizer_(std::move(tokenizer)), max_length_(max_length), max_length_from_(std::move(max_length_from)) {
  fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error("text_lines: cannot read " + file + ": " + std::strerror(errno));
  // One pass in fixed-size blocks: memory is the line starts, whatever the file's size.
  std::vector<char> block(1 << 20);
  std::uint64_t offset = 0;
  starts_.push_back(0);
  bool ends_with_break = true;
  for (;;) {
    const ssize_t n = ::pread(fd_, block.data(), block.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("text_lines: cannot read " + file + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; ++i)
      if (block[static_cast<std::size_t>(i)] == '\n') starts_.push_back(offset + static_cast<std::uint64_t>(i) + 1);
    ends_with_break = block[static_cast<std::size_t>(n - 1)] == '\n';
    offset += static_cast<std::uint64_t>(n);
  }
  if (!ends_with_break) starts_.push_back(offset);  // a last line without a line break
}

TextLines::~TextLines() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<FieldInfo> TextLines::fields() const {
  return {{"input_ids", true, static_cast<double>(tokenizer_->pad_id()), "attention_mask"},
          {"token_type_ids", true, 0.0, "attention_mask"}};
}

std::string TextLines::line(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw Error("text_lines " + file_ + ": line " + std::to_string(index + 1) + " is out of range (the file has " +
                std::to_string(size()) + " lines)");
  const auto begin = starts_[static_cast<std::size_t>(index)], end = starts_[static_cast<std::size_t>(index) + 1];
  std::string text(end - begin, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::pread(fd_, text.data() + got, text.size() - got, static_cast<off_t>(begin + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error("text_lines " + file_ + ": line " + std::to_string(index + 1) + " cannot be read (the file changed?)");
    got += static_cast<std::size_t>(n);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

Example TextLines::get(std::int64_t index) const {
  const Encoding e = tokenizer_->encode(line(index), static_cast<std::size_t>(max_length_));
  auto ids = [](const std::vector<std::int64_t>& v) { return torch::tensor(at::ArrayRef<std::int64_t>(v), torch::kLong); };
  return Example{{"input_ids", ids(e.input_ids)}, {"token_type_ids", ids(e.token_type_ids)}};
}

std::string TextLines::describe() const {
  return "text_lines " + file_ + ": " + std::to_string(size()) + " lines (read as needed), WordPiece max_length " +
         std::to_string(max_length_) + (max_length_from_.empty() ? "" : " (" + max_length_from_ + ")");
}

}  // namespace refit::text
