// The TensorBoard event file encoder: CRC-32C against published check values, the
// protobuf varint and the TFRecord framing byte for byte, an Event worked out by hand
// from the protobuf wire format, and the writer's file and its I/O-error path. The
// e2e test tensorboard.sh reads a training run's file with TensorBoard's own reader.
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/train/cli.h"
#include "resnet_ddp/train/tensorboard.h"

namespace fs = std::filesystem;
using namespace rd::train;
using namespace rd::train::tfevents;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

uint64_t le(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + static_cast<size_t>(i)])} << (8 * i);
  return v;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Splits a file into its records, checking both masked CRCs of each.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    REQUIRE(file.size() - at >= 16);
    const uint64_t n = le(file, at, 8);
    CHECK(le(file, at + 8, 4) == mask_crc(crc32c(file.data() + at, 8)));
    REQUIRE(file.size() - at >= 16 + n);
    out.push_back(file.substr(at + 12, n));
    CHECK(le(file, at + 12 + n, 4) == mask_crc(crc_of(out.back())));
    at += 16 + n;
  }
  return out;
}

}  // namespace

TEST_CASE("crc32c matches the published check values", "[tensorboard]") {
  CHECK(crc_of("123456789") == 0xE3069283u);  // the CRC catalogue's check value
  CHECK(crc_of("") == 0u);
  // RFC 3720 (iSCSI) appendix B.4 test vectors.
  CHECK(crc_of(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc_of(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  CHECK(crc_of(inc) == 0x46DD794Eu);
  // Continuation: CRC of a split buffer equals the CRC of the whole.
  CHECK(crc32c("56789", 5, crc32c("1234", 4)) == 0xE3069283u);
}

TEST_CASE("masked crc is TFRecord's rotate-and-add", "[tensorboard]") {
  CHECK(mask_crc(0) == 0xa282ead8u);
  // 0x00008000 rotated right by 15 is 1.
  CHECK(mask_crc(0x00008000u) == 0xa282ead9u);
  // Wraps modulo 2^32: 0xE3069283 -> rotr15 = 0x2507C60D (hand-computed) + delta.
  const uint32_t c = 0xE3069283u;
  CHECK(mask_crc(c) == static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
  CHECK(((c >> 15) | (c << 17)) == 0x2507C60Du);
}

TEST_CASE("varints follow the protobuf encoding", "[tensorboard]") {
  auto enc = [](uint64_t v) {
    std::string s;
    put_varint(s, v);
    return s;
  };
  CHECK(enc(0) == bytes({0x00}));
  CHECK(enc(1) == bytes({0x01}));
  CHECK(enc(127) == bytes({0x7f}));
  CHECK(enc(128) == bytes({0x80, 0x01}));
  CHECK(enc(300) == bytes({0xac, 0x02}));  // the protobuf documentation's example
  CHECK(enc(16384) == bytes({0x80, 0x80, 0x01}));
  CHECK(enc(~uint64_t{0}) == bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  // A negative int64 step is its two's complement: ten bytes.
  CHECK(enc(static_cast<uint64_t>(int64_t{-2})) ==
        bytes({0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
}

TEST_CASE("a TFRecord is length, masked crc, data, masked crc", "[tensorboard]") {
  std::string out;
  append_record(out, "abc");
  REQUIRE(out.size() == 8 + 4 + 3 + 4);
  CHECK(out.substr(0, 8) == bytes({3, 0, 0, 0, 0, 0, 0, 0}));
  CHECK(le(out, 8, 4) == mask_crc(crc_of(bytes({3, 0, 0, 0, 0, 0, 0, 0}))));
  CHECK(out.substr(12, 3) == "abc");
  CHECK(le(out, 15, 4) == mask_crc(crc_of("abc")));
  // Empty payload: the data CRC is crc32c("") = 0, masked.
  std::string empty;
  append_record(empty, "");
  REQUIRE(empty.size() == 16);
  CHECK(le(empty, 12, 4) == 0xa282ead8u);
  // Records concatenate.
  append_record(out, std::string(300, 'x'));
  const auto r = records(out);
  REQUIRE(r.size() == 2);
  CHECK(r[0] == "abc");
  CHECK(r[1] == std::string(300, 'x'));
}

TEST_CASE("events encode as the protobuf wire format", "[tensorboard]") {
  // wall_time 1.0 = double 0x3FF0000000000000 little-endian, key 0x09 (field 1, fixed64);
  // step: key 0x10 (field 2, varint).
  const std::string head = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10});
  // Value { tag "a" (0x0a 01 'a'), simple_value 1.0f (0x15 + 0x3F800000 LE) } = 8 bytes;
  // Summary { value (0x0a 08 ...) } = 10 bytes; Event.summary = key 0x2a (field 5).
  CHECK(scalars_event(1.0, 5, {{"a", 1.0f}}) ==
        head + bytes({0x05, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 'a', 0x15, 0, 0, 0x80, 0x3f}));
  // Two values, step 300 (varint ac 02); -2.5f = 0xC0200000.
  CHECK(scalars_event(1.0, 300, {{"x", 0.0f}, {"yz", -2.5f}}) ==
        head + bytes({0xac, 0x02, 0x2a, 0x15,                                  //
                      0x0a, 0x08, 0x0a, 0x01, 'x', 0x15, 0, 0, 0, 0,           //
                      0x0a, 0x09, 0x0a, 0x02, 'y', 'z', 0x15, 0, 0, 0x20, 0xc0}));
  // file_version: key 0x1a (field 3, bytes), "brain.Event:2".
  CHECK(file_version_event(1.0) == head + bytes({0x00, 0x1a, 13}) + "brain.Event:2");
  // session_log: key 0x3a (field 7), SessionLog { status (0x08) = START (1) }.
  CHECK(session_start_event(1.0, 7) == head + bytes({0x07, 0x3a, 0x02, 0x08, 0x01}));
}

TEST_CASE("the writer makes a TensorBoard-named file of valid records", "[tensorboard]") {
  const fs::path dir = fs::temp_directory_path() / ("rd_tb_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string first_path;
  {
    auto w = TensorBoardWriter::create(dir.string(), 11);
    REQUIRE(w);
    first_path = w->path();
    const std::string name = fs::path(first_path).filename().string();
    CHECK(name.rfind("events.out.tfevents.", 0) == 0);
    w->scalars(11, {{"step/loss", 0.5}, {"step/lr", 1e-4}});
    w->scalars(12, {{"step/loss", 0.25}});
    // Buffered until a flush (no write per step).
    CHECK(records(read_all(first_path)).size() == 2);
    CHECK(w->flush());
    CHECK_FALSE(w->failed());
  }
  const auto r = records(read_all(first_path));
  REQUIRE(r.size() == 4);
  CHECK(r[0].find("brain.Event:2") != std::string::npos);
  CHECK(r[1].substr(9) == bytes({0x10, 11, 0x3a, 0x02, 0x08, 0x01}));  // after wall_time
  CHECK(r[2].substr(9, 2) == bytes({0x10, 11}));
  CHECK(r[2].find("step/loss") != std::string::npos);
  CHECK(r[3].substr(9, 2) == bytes({0x10, 12}));
  // The destructor flushed; a second writer in the same second gets a new name.
  auto w2 = TensorBoardWriter::create(dir.string(), 13);
  REQUIRE(w2);
  CHECK(w2->path() != first_path);
  CHECK(records(read_all(first_path)).size() == 4);
  w2.reset();
  fs::remove_all(dir);
}

TEST_CASE("an I/O error warns once and never throws", "[tensorboard]") {
  REQUIRE(fs::exists("/dev/full"));
  // /dev/full accepts open() and fails every write with ENOSPC: a full disk.
  auto w = TensorBoardWriter::create_file("/dev/full", 1);
  CHECK_FALSE(w);  // the header events could not be written
  // A directory that cannot hold the file: no writer, a warning, no exception.
  CHECK_FALSE(TensorBoardWriter::create("/nonexistent_rd_dir/x", 1));
}

TEST_CASE("a write error mid-run disables the writer, training goes on", "[tensorboard]") {
  const fs::path dir = fs::temp_directory_path() / ("rd_tb_fsize_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto w = TensorBoardWriter::create(dir.string(), 1);
  REQUIRE(w);
  const auto header_size = fs::file_size(w->path());
  // A file-size limit just past the header events: the next flush fails with EFBIG
  // (the trainer ignores SIGXFSZ the same way).
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  rlimit lim = old;
  lim.rlim_cur = static_cast<rlim_t>(header_size + 40);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  for (int i = 1; i <= 20; ++i) w->scalars(i, {{"step/loss", 1.0 / i}});
  const bool flushed = w->flush();
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  CHECK_FALSE(flushed);
  CHECK(w->failed());
  // Later calls are no-ops, not errors.
  w->scalars(21, {{"step/loss", 0.0}});
  CHECK_FALSE(w->flush());
  CHECK(fs::file_size(w->path()) <= header_size + 40);
  w.reset();
  fs::remove_all(dir);
}

TEST_CASE("the tensorboard flag is on by default and takes on or off", "[tensorboard]") {
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "resnet_ddp");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return parse_command_line(static_cast<int>(argv.size()), argv.data()).train;
  };
  CHECK(parse({"--data", "d"}).tensorboard);
  CHECK_FALSE(parse({"--data", "d", "--tensorboard", "off"}).tensorboard);
  CHECK(parse({"--data", "d", "--tensorboard=on"}).tensorboard);
  try {
    parse({"--data", "d", "--tensorboard", "yes"});
    FAIL("--tensorboard yes was accepted");
  } catch (const rd::UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--tensorboard") && Catch::Contains("on|off"));
  }
  // Listed with the flags a resume compares (the trainer skips it as not describing the run).
  bool found = false;
  for (const auto& [flag, value] : train_flag_values(parse({"--data", "d", "--tensorboard", "off"})))
    if (flag == "--tensorboard") found = value == "off";
  CHECK(found);
}
