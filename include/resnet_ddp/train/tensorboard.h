// TensorBoard scalars without TensorBoard: the event file format written directly.
//
// An event file is a sequence of TFRecords (uint64 length, masked CRC-32C of the
// length, the bytes, masked CRC-32C of the bytes; little-endian), each holding one
// serialized tensorflow.Event protobuf. We only need three of its shapes, encoded
// by hand (field numbers from tensorboard/compat/proto/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
//   SessionLog { enum status = 1 (START = 1); }
// Only rank 0 makes a writer. See docs/usage.md ("TensorBoard").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rd::train {

namespace tfevents {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from `crc`
// (0 to start): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masking, so that a CRC stored next to the data it covers does not
// checksum to a fixed value: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t mask_crc(uint32_t crc);

// Protobuf base-128 varint (int64 fields are written as their two's complement).
void put_varint(std::string& out, uint64_t v);
// Appends one TFRecord holding `data`.
void append_record(std::string& out, const std::string& data);

// Serialized Event messages.
std::string file_version_event(double wall_time);  // file_version "brain.Event:2"
// SessionLog START at `step`: TensorBoard's reader then drops what an earlier run
// logged at steps >= `step` (a killed run's steps past its last checkpoint).
std::string session_start_event(double wall_time, int64_t step);
using Scalars = std::vector<std::pair<std::string, float>>;
std::string scalars_event(double wall_time, int64_t step, const Scalars& values);

}  // namespace tfevents

// Appends scalar events to OUTPUT_DIR/events.out.tfevents.<unix seconds>.<host>
// (TensorBoard's file name; a new file for every run, `.1`, `.2`... when the name is
// taken). Records are buffered and written (no fsync) by flush(), every
// kFlushSeconds, and on destruction. An I/O error never stops training: it prints one
// warning, and the writer drops everything after it.
class TensorBoardWriter {
 public:
  static constexpr double kFlushSeconds = 30.0;
  static constexpr size_t kFlushBytes = 1 << 20;

  // Creates the file in `dir` and writes the file-version and session-start events
  // (first_step: the first step this run logs). Null, after a warning on stderr, when
  // the file cannot be created.
  static std::unique_ptr<TensorBoardWriter> create(const std::string& dir, int64_t first_step);
  // Writes to `path` exactly (created or truncated); null after a warning on failure.
  static std::unique_ptr<TensorBoardWriter> create_file(const std::string& path, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event holding every value, at `step` (doubles are stored as float32, which is
  // what simple_value holds).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // Writes what is buffered. False once a write has failed (the warning is printed).
  bool flush();
  bool failed() const { return fd_ < 0; }
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(int fd, std::string path);
  // Writes the file-version and session-start events.
  static std::unique_ptr<TensorBoardWriter> start(int fd, const std::string& path, int64_t first_step);
  void fail(int err);

  int fd_;
  std::string path_;
  std::string buf_;
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace rd::train
