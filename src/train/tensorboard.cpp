// TensorBoard event files written directly (see tensorboard.h for the format).
#include "resnet_ddp/train/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace rd::train {

namespace tfevents {

namespace {

// Byte-at-a-time table of the reflected Castagnoli polynomial: a few hundred bytes
// per step are not worth slicing-by-8 or SSE4.2's crc32 instruction.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

// Wire types of the protobuf encoding.
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_key(std::string& out, uint32_t field, Wire wire) { put_varint(out, (uint64_t{field} << 3) | wire); }

// Fixed-width fields are little-endian whatever the host's order.
void put_le(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void put_bytes(std::string& out, uint32_t field, const std::string& s) {
  put_key(out, field, kBytes);
  put_varint(out, s.size());
  out += s;
}

// wall_time (1) and step (2), common to every event.
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  uint64_t bits = 0;
  std::memcpy(&bits, &wall_time, sizeof bits);
  put_key(e, 1, kFixed64);
  put_le(e, bits, 8);
  put_key(e, 2, kVarint);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void append_record(std::string& out, const std::string& data) {
  std::string len;
  put_le(len, data.size(), 8);
  out += len;
  put_le(out, mask_crc(crc32c(len.data(), len.size())), 4);
  out += data;
  put_le(out, mask_crc(crc32c(data.data(), data.size())), 4);
}

std::string file_version_event(double wall_time) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_key(log, 1, kVarint);  // SessionLog.status
  put_varint(log, 1);        // START
  std::string e = event_header(wall_time, step);
  put_bytes(e, 7, log);
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, 1, tag);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    put_key(v, 2, kFixed32);
    put_le(v, bits, 4);
    put_bytes(summary, 1, v);
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

}  // namespace tfevents

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void warn_cannot(const std::string& path, int err) {
  std::fprintf(stderr,
               "resnet_ddp: warning: --tensorboard: cannot write '%s': %s; no more TensorBoard scalars in this "
               "run (training continues; metrics.csv has the per-epoch values)\n",
               path.c_str(), std::strerror(err));
  std::fflush(stderr);
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(int fd, std::string path)
    : fd_(fd), path_(std::move(path)), last_flush_(std::chrono::steady_clock::now()) {}

std::unique_ptr<TensorBoardWriter> TensorBoardWriter::start(int fd, const std::string& path, int64_t first_step) {
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(fd, path));
  const double now = unix_now();
  tfevents::append_record(w->buf_, tfevents::file_version_event(now));
  tfevents::append_record(w->buf_, tfevents::session_start_event(now, first_step));
  if (!w->flush()) return nullptr;
  return w;
}

std::unique_ptr<TensorBoardWriter> TensorBoardWriter::create(const std::string& dir, int64_t first_step) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  char base[512];
  std::snprintf(base, sizeof base, "events.out.tfevents.%010lld.%s",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count()),
                host);
  const std::string stem = (std::filesystem::path(dir) / base).string();
  // A resume within the same second on the same host must not overwrite the file of
  // the run it continues: O_EXCL, and a numbered name when taken (TensorBoard reads
  // every file whose name contains "tfevents", in name order).
  std::string path = stem;
  int fd = -1;
  for (int n = 1; n < 1000; ++n) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) break;
    path = stem + "." + std::to_string(n);
  }
  if (fd < 0) {
    warn_cannot(path, errno);
    return nullptr;
  }
  return start(fd, path, first_step);
}

std::unique_ptr<TensorBoardWriter> TensorBoardWriter::create_file(const std::string& path, int64_t first_step) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    warn_cannot(path, errno);
    return nullptr;
  }
  return start(fd, path, first_step);
}

TensorBoardWriter::~TensorBoardWriter() {
  flush();
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (fd_ < 0) return;
  tfevents::Scalars v;
  v.reserve(values.size());
  for (const auto& [tag, x] : values) v.emplace_back(tag, static_cast<float>(x));
  tfevents::append_record(buf_, tfevents::scalars_event(unix_now(), step, v));
  // Periodic flush so a killed run keeps its recent steps; a write per step would
  // cost a syscall on the hot path for nothing TensorBoard reloads that often.
  if (buf_.size() >= kFlushBytes ||
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush_).count() >= kFlushSeconds)
    flush();
}

bool TensorBoardWriter::flush() {
  if (fd_ < 0) return false;
  last_flush_ = std::chrono::steady_clock::now();
  size_t off = 0;
  while (off < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(n < 0 ? errno : EIO);
      return false;
    }
    off += static_cast<size_t>(n);
  }
  buf_.clear();
  return true;
}

void TensorBoardWriter::fail(int err) {
  warn_cannot(path_, err);
  ::close(fd_);
  fd_ = -1;
  buf_.clear();
  buf_.shrink_to_fit();
}

}  // namespace rd::train
