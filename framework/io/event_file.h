#pragma once
// TensorBoard event files, written natively: a TFRecord stream (each record framed by its length
// and masked CRC-32Cs) of serialized `tensorboard.Event` protobuf messages.
//
// The CRC-32C is Boost.CRC's (boost/crc.hpp, header-only). The protobuf wire encoding is written
// by hand on purpose: libtorch_cpu.so already exports protobuf symbols of its own version, so
// linking Debian's libprotobuf beside it would risk clashes between two definitions of the same
// symbols. The messages written are few and small (event.proto, summary.proto, tensor.proto).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace refit::io {

/// CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected), as TFRecord framing uses it.
std::uint32_t crc32c(const void* data, std::size_t size);
/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a CRC of data that
/// itself holds CRCs is not trivially predictable.
std::uint32_t masked_crc32c(const void* data, std::size_t size);

/// One TFRecord record: uint64 length (little-endian), uint32 masked CRC of those 8 bytes, the
/// data, uint32 masked CRC of the data.
std::string tfrecord(const std::string& data);

/// The serialized Event messages the writer appends (exposed for the unit tests).
std::string file_version_event(double wall_time);
std::string scalar_event(const std::string& tag, float value, std::int64_t step, double wall_time);
std::string text_event(const std::string& tag, const std::string& text, std::int64_t step, double wall_time);
std::string session_start_event(std::int64_t step, double wall_time);

/// Writes `<dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>` (the name TensorBoard
/// looks for in a log folder), starting with the file-version event "brain.Event:2". Records are
/// buffered; flush() hands them to the operating system. Throws refit::Error naming the file
/// when it cannot be created or written.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::filesystem::path& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalar(const std::string& tag, float value, std::int64_t step, double wall_time);
  /// A text summary (TensorBoard's text plugin renders it as Markdown).
  void add_text(const std::string& tag, const std::string& text, std::int64_t step, double wall_time);
  /// SessionLog START: TensorBoard drops the events of earlier files in the folder whose step is
  /// at or above `step` (those of a run killed after the checkpoint a resumed run starts from).
  void session_start(std::int64_t step, double wall_time);
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

/// Seconds since the Unix epoch, as event wall times count them.
double unix_seconds_now();

}  // namespace refit::io
