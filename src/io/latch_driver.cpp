// The latching HDF5 file driver (see latch_driver.h).
#include "io/latch_driver.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#if H5_VERSION_GE(1, 14, 0)
#include <H5FDdevelop.h>  // the file-driver struct is a developer header since 1.13
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

namespace rd::io {

namespace {

thread_local IoLatch* t_latch = nullptr;  // the checkpoint being written on this thread

void latch(int e, const char* what) {
  if (t_latch && t_latch->err == 0) *t_latch = IoLatch{e, what};
}

struct LatchFile {
  H5FD_t pub;  // first member: HDF5 hands this struct back as an H5FD_t*
  int fd = -1;
  haddr_t eoa = 0, eof = 0;
};
LatchFile* as_file(H5FD_t* f) { return reinterpret_cast<LatchFile*>(f); }
const LatchFile* as_file(const H5FD_t* f) { return reinterpret_cast<const LatchFile*>(f); }

H5FD_t* latch_open(const char* name, unsigned flags, hid_t, haddr_t) {
  int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_CREAT) o |= O_CREAT;
  if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
  if (flags & H5F_ACC_EXCL) o |= O_EXCL;
  const int fd = ::open(name, o | O_CLOEXEC, 0644);
  if (fd < 0) {
    // H5Fcreate first probes without O_CREAT whether the file is open already;
    // only the real create counts.
    if (flags & H5F_ACC_CREAT) latch(errno, "create");
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    latch(errno, "stat");
    ::close(fd);
    return nullptr;
  }
  auto* f = new LatchFile();
  f->fd = fd;
  f->eof = static_cast<haddr_t>(st.st_size);
  return &f->pub;
}
herr_t latch_close(H5FD_t* file) {
  LatchFile* f = as_file(file);
  if (::close(f->fd) != 0) latch(errno, "close");
  delete f;
  return 0;
}
herr_t latch_query(const H5FD_t*, unsigned long* flags) {
  // The sec2 driver's features: the same metadata aggregation, hence the same layout.
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA | H5FD_FEAT_POSIX_COMPAT_HANDLE | H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
  return 0;
}
haddr_t latch_get_eoa(const H5FD_t* file, H5FD_mem_t) { return as_file(file)->eoa; }
herr_t latch_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  as_file(file)->eoa = addr;
  return 0;
}
haddr_t latch_get_eof(const H5FD_t* file, H5FD_mem_t) { return as_file(file)->eof; }
herr_t latch_get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &as_file(file)->fd;
  return 0;
}
herr_t latch_read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  LatchFile* f = as_file(file);
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    const ssize_t n = ::pread(f->fd, p, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) latch(errno, "read");
    if (n <= 0) break;  // past the end of the file (or failed): zeros, as sec2 reads
    p += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<size_t>(n);
  }
  std::memset(p, 0, size);
  return 0;
}
herr_t latch_write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  LatchFile* f = as_file(file);
  if (t_latch && t_latch->err) return 0;  // the file is discarded anyway
  auto* p = static_cast<const char*>(buf);
  while (size > 0) {
    const ssize_t n = ::pwrite(f->fd, p, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      latch(n < 0 ? errno : ENOSPC, "write");
      return 0;
    }
    p += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<size_t>(n);
  }
  f->eof = std::max(f->eof, addr);
  return 0;
}
herr_t latch_truncate(H5FD_t* file, hid_t, hbool_t) {
  LatchFile* f = as_file(file);
  if (f->eoa != f->eof) {
    if (::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0) latch(errno, "truncate");
    f->eof = f->eoa;
  }
  return 0;
}

}  // namespace

LatchScope::LatchScope(IoLatch& latch) { t_latch = &latch; }
LatchScope::~LatchScope() { t_latch = nullptr; }

hid_t latch_driver() {
  static const hid_t id = [] {
    static H5FD_class_t c{};
#if H5_VERSION_GE(1, 14, 0)
    // HDF5 1.14 versions the driver struct and wants a driver value in the user range
    // (written from its H5FDdevelop.h; only 1.10 is built and tested here).
    c.version = H5FD_CLASS_VERSION;
    c.value = static_cast<H5FD_class_value_t>(600);
#endif
    c.name = "resnet_ddp_latch";
    c.maxaddr = (haddr_t{1} << 62);  // < 2^63 (off_t), like sec2's limit
    c.fc_degree = H5F_CLOSE_WEAK;
    c.open = latch_open;
    c.close = latch_close;
    c.query = latch_query;
    c.get_eoa = latch_get_eoa;
    c.set_eoa = latch_set_eoa;
    c.get_eof = latch_get_eof;
    c.get_handle = latch_get_handle;
    c.read = latch_read;
    c.write = latch_write;
    c.truncate = latch_truncate;
    const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
    std::copy(std::begin(map), std::end(map), std::begin(c.fl_map));
    return H5FDregister(&c);
  }();
  return id;
}

}  // namespace rd::io
