// The whole-file checksum of checkpoints (see checksum.h).
#include "io/checksum.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>


namespace rd::io {

namespace {

constexpr char kChecksumMagic[] = "resnet_ddp checksum v1\n";

// CRC-32 of bytes [from, size) of an open file; false on a read error.
bool crc_of(int fd, uint64_t from, uint64_t size, uint32_t& crc_out) {
  std::vector<unsigned char> buf(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t off = from;
  while (off < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    const ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    off += static_cast<uint64_t>(n);
  }
  crc_out = static_cast<uint32_t>(crc);
  return true;
}

}  // namespace

void stamp_checksum(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw WriteError("temp file '" + file + "': reopen for checksum failed: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  uint32_t crc = 0;
  if (::fstat(fd, &st) != 0 || !crc_of(fd, kChecksumBlock, static_cast<uint64_t>(st.st_size), crc))
    throw WriteError("temp file '" + file + "': reading it back for the checksum failed: " + std::strerror(errno));
  char header[kChecksumBlock] = {};
  std::snprintf(header, sizeof header, "%sbytes %lld\ncrc32 %08x\n", kChecksumMagic,
                static_cast<long long>(st.st_size), crc);
  if (::pwrite(fd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header))
    throw WriteError("temp file '" + file + "': writing the checksum failed: " + std::strerror(errno));
}

std::string checksum_problem(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";  // HDF5's open reports it
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  char header[kChecksumBlock + 1] = {};
  const ssize_t got = ::pread(fd, header, kChecksumBlock, 0);
  const size_t magic_len = sizeof kChecksumMagic - 1;
  if (got < static_cast<ssize_t>(magic_len) || std::memcmp(header, kChecksumMagic, magic_len) != 0) {
    // No header. But an HDF5 superblock right after a user block of our size means a
    // resnet_ddp checkpoint whose header was damaged (h5py and the converters write no
    // user block): refuse it rather than load it unverified.
    static const char kHdf5Signature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
    char sig[8] = {};
    if (::pread(fd, sig, sizeof sig, kChecksumBlock) == static_cast<ssize_t>(sizeof sig) &&
        std::memcmp(sig, kHdf5Signature, sizeof sig) == 0)
      return "checksum header damaged (its first line is not resnet_ddp's)";
    return "";
  }
  if (got != static_cast<ssize_t>(kChecksumBlock)) return "truncated inside its checksum header";
  long long bytes = -1;
  unsigned crc_stored = 0;
  int used = 0;
  if (std::sscanf(header + magic_len, "bytes %lld\ncrc32 %8x\n%n", &bytes, &crc_stored, &used) != 2 || used == 0 ||
      bytes < static_cast<long long>(kChecksumBlock))
    return "checksum header unreadable";
  for (size_t i = magic_len + static_cast<size_t>(used); i < kChecksumBlock; ++i)
    if (header[i] != '\0') return "checksum header unreadable";
  // Byte for byte what the writer prints for these values: sscanf alone would accept a
  // flipped bit that turns a hex digit's case or adds a sign or a space.
  char expect[kChecksumBlock + 1] = {};
  std::snprintf(expect, sizeof expect, "%sbytes %lld\ncrc32 %08x\n", kChecksumMagic, bytes, crc_stored);
  if (std::memcmp(expect, header, magic_len + static_cast<size_t>(used)) != 0) return "checksum header unreadable";
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::string("cannot stat: ") + std::strerror(errno);
  if (st.st_size != bytes)
    return "size is " + std::to_string(st.st_size) + " bytes, its header says " + std::to_string(bytes);
  uint32_t crc = 0;
  if (!crc_of(fd, kChecksumBlock, static_cast<uint64_t>(st.st_size), crc))
    return std::string("read error: ") + std::strerror(errno);
  if (crc == crc_stored) return "";
  char msg[96];
  std::snprintf(msg, sizeof msg, "checksum mismatch (CRC-32 %08x, header says %08x)", crc, crc_stored);
  return msg;
}

}  // namespace rd::io
