// TensorBoard event files without TensorFlow: TFRecord framing with Boost.CRC's CRC-32C
// (Castagnoli), and the protobuf wire format by hand, because libtorch_cpu.so already exports
// protobuf symbols of its own version (linking Debian's libprotobuf beside it would risk two
// definitions of the same symbols). Field numbers are those of tensorboard/compat/proto (event.proto,
// summary.proto, tensor.proto, tensor_shape.proto).
#include "io/event_file.h"

#include <boost/crc.hpp>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <unistd.h>

#include "refit/error.h"

namespace refit::io {

// Named for the unity build: files of the same batch have anonymous helpers of their own.
namespace event_wire {

// Field numbers and enum values (Event field 6 is the deprecated log_message).
namespace Event {
constexpr std::uint32_t wall_time = 1, step = 2, file_version = 3, summary = 5, session_log = 7;
}
namespace Summary {
constexpr std::uint32_t value = 1;
}
namespace SummaryValue {
constexpr std::uint32_t tag = 1, simple_value = 2, tensor = 8, metadata = 9;
}
namespace SummaryMetadata {
constexpr std::uint32_t plugin_data = 1;
}
namespace PluginData {
constexpr std::uint32_t plugin_name = 1;
}
namespace TensorProto {
constexpr std::uint32_t dtype = 1, tensor_shape = 2, string_val = 8;
constexpr std::int64_t DT_STRING = 7;
}  // namespace TensorProto
namespace SessionLog {
constexpr std::uint32_t status = 1;
constexpr std::int64_t START = 1;
}  // namespace SessionLog

void put_little_endian(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

/// A protobuf message in the wire format, fields appended in order.
class Message {
 public:
  Message& double_field(std::uint32_t field, double v) { return fixed_field<std::uint64_t>(field, v, kFixed64); }
  Message& float_field(std::uint32_t field, float v) { return fixed_field<std::uint32_t>(field, v, kFixed32); }
  /// int64 and enum fields: a negative value is written as its two's complement in 10 bytes.
  Message& int_field(std::uint32_t field, std::int64_t v) {
    key(field, kVarint);
    varint(static_cast<std::uint64_t>(v));
    return *this;
  }
  /// Strings, bytes and embedded messages.
  Message& bytes_field(std::uint32_t field, const std::string& v) {
    key(field, kLengthDelimited);
    varint(v.size());
    bytes_ += v;
    return *this;
  }
  Message& message_field(std::uint32_t field, const Message& m) { return bytes_field(field, m.bytes_); }
  const std::string& bytes() const { return bytes_; }

 private:
  enum WireType : std::uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
  /// A double or float as its IEEE bits, little-endian (wire types fixed64 / fixed32).
  template <class Bits, class Real>
  Message& fixed_field(std::uint32_t field, Real v, WireType wire_type) {
    static_assert(sizeof(Bits) == sizeof(Real));
    Bits bits;
    std::memcpy(&bits, &v, sizeof bits);
    key(field, wire_type);
    put_little_endian(bytes_, bits, sizeof bits);
    return *this;
  }
  void varint(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes_.push_back(static_cast<char>((v & 0x7F) | 0x80));
    bytes_.push_back(static_cast<char>(v));
  }
  void key(std::uint32_t field, WireType type) { varint((field << 3) | type); }

  std::string bytes_;
};

Message event(double wall_time, std::int64_t step) {
  Message e;
  e.double_field(Event::wall_time, wall_time).int_field(Event::step, step);
  return e;
}

std::string summary_event(const Message& value, std::int64_t step, double wall_time) {
  Message summary;
  summary.message_field(Summary::value, value);
  return event(wall_time, step).message_field(Event::summary, summary).bytes();
}

}  // namespace event_wire

std::uint32_t crc32c(const void* data, std::size_t size) {
  // CRC-32C: polynomial 0x1EDC6F41, initial and final XOR all ones, reflected in and out.
  boost::crc_optimal<32, 0x1EDC6F41u, 0xFFFFFFFFu, 0xFFFFFFFFu, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string record;
  event_wire::put_little_endian(record, data.size(), 8);
  event_wire::put_little_endian(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  event_wire::put_little_endian(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

std::string file_version_event(double wall_time) {
  using namespace event_wire;
  return event(wall_time, 0).bytes_field(Event::file_version, "brain.Event:2").bytes();
}

std::string scalar_event(const std::string& tag, float value, std::int64_t step, double wall_time) {
  using namespace event_wire;
  Message v;
  v.bytes_field(SummaryValue::tag, tag).float_field(SummaryValue::simple_value, value);
  return summary_event(v, step, wall_time);
}

std::string text_event(const std::string& tag, const std::string& text, std::int64_t step, double wall_time) {
  using namespace event_wire;
  Message tensor;
  tensor.int_field(TensorProto::dtype, TensorProto::DT_STRING)
      .message_field(TensorProto::tensor_shape, Message())  // no dimensions: a scalar string
      .bytes_field(TensorProto::string_val, text);
  Message plugin_data;
  plugin_data.bytes_field(PluginData::plugin_name, "text");
  Message metadata;
  metadata.message_field(SummaryMetadata::plugin_data, plugin_data);
  Message v;
  v.bytes_field(SummaryValue::tag, tag)
      .message_field(SummaryValue::tensor, tensor)
      .message_field(SummaryValue::metadata, metadata);
  return summary_event(v, step, wall_time);
}

std::string session_start_event(std::int64_t step, double wall_time) {
  using namespace event_wire;
  Message session_log;
  session_log.int_field(SessionLog::status, SessionLog::START);
  return event(wall_time, step).message_field(Event::session_log, session_log).bytes();
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventFileWriter::EventFileWriter(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const double now = unix_seconds_now();
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const std::string name =
      "events.out.tfevents." + std::to_string(static_cast<long long>(now)) + "." + host + "." + std::to_string(::getpid());
  // Exclusive creation: two writers of one process in one second (tests) get distinct files.
  for (int attempt = 0; !file_; ++attempt) {
    path_ = dir / (attempt == 0 ? name : name + "." + std::to_string(attempt));
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && (errno != EEXIST || attempt >= 100))
      throw Error("cannot create the TensorBoard event file " + path_.string() + ": " + std::strerror(errno));
  }
  try {
    write_event(file_version_event(now));
  } catch (...) {
    std::fclose(file_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::add_scalar(const std::string& tag, float value, std::int64_t step, double wall_time) {
  write_event(scalar_event(tag, value, step, wall_time));
}

void EventFileWriter::add_text(const std::string& tag, const std::string& text, std::int64_t step, double wall_time) {
  write_event(text_event(tag, text, step, wall_time));
}

void EventFileWriter::session_start(std::int64_t step, double wall_time) {
  write_event(session_start_event(step, wall_time));
}

void EventFileWriter::write_event(const std::string& event) {
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    throw Error("cannot write the TensorBoard event file " + path_.string() + ": " + std::strerror(errno));
}

void EventFileWriter::flush() {
  if (std::fflush(file_) != 0)
    throw Error("cannot write the TensorBoard event file " + path_.string() + ": " + std::strerror(errno));
}

}  // namespace refit::io
