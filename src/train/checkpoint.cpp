#include "resnet_ddp/train/checkpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <hdf5.h>
#if H5_VERSION_GE(1, 14, 0)
#include <H5FDdevelop.h>  // the file-driver struct is a developer header since 1.13
#endif
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"

namespace fs = std::filesystem;

namespace rd::train {

namespace {

// ---- HDF5 plumbing ---------------------------------------------------------------

// Owns one HDF5 identifier and closes it with the matching H5?close.
class H5Id {
 public:
  H5Id() = default;
  H5Id(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  H5Id& operator=(H5Id&& o) noexcept {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = -1;
    return *this;
  }
  ~H5Id() { reset(); }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  hid_t release() {  // the caller closes it (and checks the result)
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

// HDF5 prints an error stack on every failed call by default; we report our own
// messages instead (and probe for optional objects without noise).
struct QuietHdf5 {
  QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};
void quiet_hdf5() { static QuietHdf5 once; }

struct WriteError : Error {
  using Error::Error;
};

// ---- a file driver that never reports a failed write to HDF5 -----------------------
//
// HDF5 1.10 cannot recover from a failed write: the file then fails to close and
// the library crashes at exit while closing it again. So checkpoints are written
// through this minimal POSIX driver (the sec2 driver's behaviour and file layout):
// the first failing system call is latched here and HDF5 is told the call
// succeeded; the writer checks the latch after every dataset and after the close.

struct IoLatch {
  int err = 0;
  const char* op = "";
  void set(int e, const char* what) {
    if (err == 0) {
      err = e;
      op = what;
    }
  }
};
thread_local IoLatch* t_latch = nullptr;  // the checkpoint being written on this thread

void latch(int e, const char* what) {
  if (t_latch) t_latch->set(e, what);
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

[[noreturn]] void write_failed(const std::string& what) {
  if (t_latch && t_latch->err) throw WriteError(what + ": " + t_latch->op + " failed: " + std::strerror(t_latch->err));
  throw WriteError(what);
}
// A system call under HDF5 failed (and HDF5 was told it succeeded).
void check_latch(const std::string& what) {
  if (t_latch && t_latch->err) write_failed(what);
}
void wcheck(herr_t status, const std::string& what) {
  if (status < 0) write_failed(what);
}
H5Id wid(hid_t id, herr_t (*closer)(hid_t), const std::string& what) {
  if (id < 0) write_failed(what);
  return H5Id(id, closer);
}

H5Id string_type() {
  H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

void attr_string(hid_t obj, const char* name, const std::string& value) {
  H5Id type = string_type();
  H5Id space = wid(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Id a = wid(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
               std::string("attribute ") + name);
  const char* p = value.c_str();
  wcheck(H5Awrite(a, type, &p), std::string("attribute ") + name);
}
void attr_i64(hid_t obj, const char* name, int64_t v) {
  H5Id space = wid(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Id a = wid(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
               std::string("attribute ") + name);
  wcheck(H5Awrite(a, H5T_NATIVE_INT64, &v), std::string("attribute ") + name);
}
void attr_f64(hid_t obj, const char* name, double v) {
  H5Id space = wid(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Id a = wid(H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
               std::string("attribute ") + name);
  wcheck(H5Awrite(a, H5T_NATIVE_DOUBLE, &v), std::string("attribute ") + name);
}

// Groups remember creation order, so h5py and h5dump list tensors in state_dict order.
H5Id make_group(hid_t parent, const std::string& name) {
  H5Id gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  return wid(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose, "group " + name);
}

// One tensor as it is written: either host values (a Snapshot's) or a slice of a
// model arena in the backend's memory, copied out through one staging buffer when
// its turn comes, so saving a model never holds a second full copy of its state.
struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // host memory, or backend memory when OutFile::backend is set
  size_t count = 0;
  bool is_int64_scalar = false;
  int64_t int_value = 0;
};

// Everything a checkpoint file holds, with tensors by reference.
struct OutFile {
  CheckpointMeta meta;
  std::vector<OutTensor> state_dict;
  OptimizerSnapshot optimizer;  // attributes only; its tensors are in optimizer_states
  std::vector<std::pair<std::string, std::vector<OutTensor>>> optimizer_states;
  SchedulerSnapshot scheduler;
  Backend* backend = nullptr;  // set: OutTensor::data points into this backend's memory
};

OutTensor out_tensor(const HostTensor& t) {
  OutTensor o;
  o.name = t.name;
  o.shape = t.shape;
  o.data = t.values.data();
  o.count = t.values.size();
  o.is_int64_scalar = t.is_int64_scalar;
  o.int_value = t.int_value;
  return o;
}

void write_tensor(hid_t group, const OutTensor& t, Backend* backend, std::vector<float>& staging) {
  if (t.is_int64_scalar) {
    H5Id space = wid(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
    H5Id d = wid(H5Dcreate2(group, t.name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT,
                            H5P_DEFAULT),
                 H5Dclose, "dataset " + t.name);
    wcheck(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &t.int_value), "dataset " + t.name);
    wcheck(H5Dclose(d.release()), "dataset " + t.name);
    check_latch("dataset " + t.name);
    return;
  }
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  H5Id space = wid(dims.empty() ? H5Screate(H5S_SCALAR)
                                : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                   H5Sclose, "dataspace " + t.name);
  // Whole-tensor chunks with a Fletcher-32 checksum: a damaged file is detected on read.
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!dims.empty() && t.count > 0) {
    H5Pset_chunk(dcpl, static_cast<int>(dims.size()), dims.data());
    H5Pset_fletcher32(dcpl);
  }
  H5Id d = wid(H5Dcreate2(group, t.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
               H5Dclose, "dataset " + t.name);
  if (t.count > 0) {
    const float* values = t.data;
    if (backend) {
      if (staging.size() < t.count) staging.resize(t.count);
      backend->copy_to_host(staging.data(), t.data, t.count * sizeof(float));
      values = staging.data();
    }
    wcheck(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), "dataset " + t.name);
  }
  // Small chunks wait in the chunk cache until the dataset closes: written by now.
  wcheck(H5Dclose(d.release()), "dataset " + t.name);
  check_latch("dataset " + t.name);
}

void write_string_list(hid_t parent, const char* name, const std::vector<std::string>& items) {
  H5Id type = string_type();
  hsize_t n = items.size();
  H5Id space = wid(H5Screate_simple(1, &n, nullptr), H5Sclose, "H5Screate");
  H5Id d = wid(H5Dcreate2(parent, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
               std::string("dataset ") + name);
  std::vector<const char*> ptrs;
  for (const auto& s : items) ptrs.push_back(s.c_str());
  if (n) wcheck(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), std::string("dataset ") + name);
}

void write_file_contents(hid_t f, const OutFile& s) {
  const CheckpointMeta& m = s.meta;
  std::vector<float> staging;  // grows to the largest tensor when s.backend is set
  attr_string(f, "format", "resnet_ddp");
  attr_i64(f, "format_version", m.format_version);
  attr_string(f, "arch", m.arch);
  attr_string(f, "head", m.head);
  attr_i64(f, "num_classes", m.num_classes);
  attr_i64(f, "image_size", m.image_size);
  attr_i64(f, "epoch", m.epoch);
  attr_i64(f, "step_in_epoch", m.step_in_epoch);
  attr_i64(f, "global_step", m.global_step);
  attr_f64(f, "best_val_acc", m.best_val_acc);
  attr_f64(f, "best_val_loss", m.best_val_loss);
  attr_f64(f, "val_acc", m.val_acc);
  attr_f64(f, "val_loss", m.val_loss);
  attr_i64(f, "world_size", m.world_size);
  attr_i64(f, "batch_size", m.batch_size);
  attr_i64(f, "accum_steps", m.accum_steps);
  attr_i64(f, "seed", m.seed);
  attr_string(f, "args", m.args);
  attr_string(f, "created_by", m.created_by);
  attr_string(f, "normalize", m.normalize);
  if (m.step_in_epoch > 0) {
    attr_f64(f, "partial_train_loss_sum", m.partial_train_loss_sum);
    attr_i64(f, "partial_train_correct", m.partial_train_correct);
    attr_i64(f, "partial_train_count", m.partial_train_count);
  }
  write_string_list(f, "class_names", m.class_names);

  H5Id sd = make_group(f, "state_dict");
  for (const auto& t : s.state_dict) write_tensor(sd, t, s.backend, staging);

  if (s.optimizer.present) {
    const OptimizerSnapshot& o = s.optimizer;
    H5Id g = make_group(f, "optimizer");
    attr_string(g, "type", o.type);
    attr_i64(g, "step", o.step);
    attr_f64(g, "lr", o.lr);
    attr_f64(g, "initial_lr", o.initial_lr);
    attr_f64(g, "weight_decay", o.weight_decay);
    if (o.type == "adam") {
      attr_f64(g, "beta1", o.beta1);
      attr_f64(g, "beta2", o.beta2);
      attr_f64(g, "eps", o.eps);
    } else {
      attr_f64(g, "momentum", o.momentum);
      attr_f64(g, "dampening", o.dampening);
      attr_i64(g, "nesterov", o.nesterov ? 1 : 0);
    }
    for (const auto& [state_name, tensors] : s.optimizer_states) {
      H5Id sg = make_group(g, state_name);
      for (const auto& t : tensors) write_tensor(sg, t, s.backend, staging);
    }
  }
  if (s.scheduler.present) {
    const SchedulerSnapshot& c = s.scheduler;
    H5Id g = make_group(f, "scheduler");
    attr_string(g, "type", c.type);
    attr_i64(g, "last_epoch", c.last_epoch);
    if (c.type == "plateau") {
      const PlateauState& p = c.plateau;
      attr_string(g, "mode", "min");
      attr_f64(g, "factor", p.factor);
      attr_i64(g, "patience", p.patience);
      attr_f64(g, "threshold", p.threshold);
      attr_string(g, "threshold_mode", "rel");
      attr_i64(g, "cooldown", p.cooldown);
      attr_f64(g, "min_lr", p.min_lr);
      attr_f64(g, "eps", p.eps);
      attr_f64(g, "best", p.best);
      attr_i64(g, "num_bad_epochs", p.num_bad_epochs);
      attr_i64(g, "cooldown_counter", p.cooldown_counter);
    } else if (c.type == "cosine") {
      attr_i64(g, "T_max", c.cosine.t_max);
      attr_f64(g, "eta_min", c.cosine.eta_min);
      attr_f64(g, "base_lr", c.cosine.base_lr);
    }
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems do not support fsync on directories; the file itself is what matters.
  if (rc != 0 && !(directory && (err == EINVAL || err == EBADF)))
    throw Error("cannot sync '" + path + "': " + std::strerror(err));
}

// ---- whole-file checksum -----------------------------------------------------------
// HDF5's parser is not hardened against damaged files (a flipped bit in its metadata
// can crash or hang it), so a file we wrote is verified before HDF5 sees it: the
// first kChecksumBlock bytes are an HDF5 user block holding a text header
//   "resnet_ddp checksum v1\nbytes <file size>\ncrc32 <8 hex digits>\n" + NULs
// with the CRC-32 (zlib) of every byte after the block. Files without the header
// (older versions, tools/torch_to_h5.py, h5py) are opened as before.
// See docs/checkpoint_format.md.
constexpr hsize_t kChecksumBlock = 512;
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

// Why `path` fails its checksum header, or "" when it matches or has none.
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

bool g_in_damage_probe = false;  // set only in the child process below

// `path` is known to be damaged. For a message that names what is damaged, HDF5
// reads it in a child process: a crash or hang of HDF5's parser there is
// contained (the child is killed after kProbeTimeoutS) and still ends in a clear error.
std::string probe_damaged_file(const std::string& path, const std::string& problem);

UsageError damaged_file_error(const std::string& path, const std::string& problem) {
  // Several readers open the same file in turn (info tries full, then weights-only):
  // one probe per damaged file. `problem` holds the CRC or size found, so a file
  // damaged differently is probed again.
  static std::mutex mutex;
  static std::string last_key, last_message;
  std::lock_guard<std::mutex> lock(mutex);
  const std::string key = path + '\n' + problem;
  if (key != last_key) {
    last_message = probe_damaged_file(path, problem);
    last_key = key;
  }
  return UsageError(last_message);
}

// The message for a damaged file, from a child process that parses it (see above).
std::string probe_damaged_file(const std::string& path, const std::string& problem) {
  constexpr int kProbeTimeoutS = 120;
  const std::string base = "checkpoint '" + path + "': " + problem + " (file damaged or incompletely copied)";
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return base;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return base;
  }
  if (pid == 0) {  // child: no MPI, no stdio flush at exit (_exit)
    ::close(fds[0]);
    std::string msg;
    try {
      g_in_damage_probe = true;
      (void)read_checkpoint(path, false);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    for (size_t off = 0; off < msg.size();) {
      const ssize_t n = ::write(fds[1], msg.data() + off, msg.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string msg;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kProbeTimeoutS);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    char buf[512];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return base + "; reading it hung (stopped after " + std::to_string(kProbeTimeoutS) + " s)";
  if (WIFSIGNALED(status))
    return base + "; the HDF5 library crashed reading it (signal " + std::to_string(WTERMSIG(status)) +
           ", contained in a child process)";
  if (!msg.empty()) return msg + " [" + problem + "]";
  return base;
}

// ---- reading -------------------------------------------------------------------

struct Reader {
  std::string path;
  hid_t file;

  [[noreturn]] void bad(const std::string& what) const {
    throw UsageError("checkpoint '" + path + "': " + what);
  }
  bool has_attr(hid_t obj, const char* name) const { return H5Aexists(obj, name) > 0; }
  bool has_link(hid_t obj, const std::string& name) const {
    return H5Lexists(obj, name.c_str(), H5P_DEFAULT) > 0;
  }
  std::string attr_string(hid_t obj, const char* name) const {
    if (!has_attr(obj, name)) bad(std::string("missing attribute '") + name + "'");
    H5Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    H5Id type(H5Aget_type(a), H5Tclose);
    if (H5Tget_class(type) != H5T_STRING) bad(std::string("attribute '") + name + "' is not a string");
    {  // H5Aread writes every element: one string only (an array would overflow `s` / `p`)
      H5Id space(H5Aget_space(a), H5Sclose);
      if (H5Sget_simple_extent_npoints(space) != 1) bad(std::string("attribute '") + name + "' is not a single string");
    }
    if (H5Tis_variable_str(type) > 0) {
      H5Id mem = string_type();
      char* p = nullptr;
      if (H5Aread(a, mem, &p) < 0) bad(std::string("cannot read attribute '") + name + "'");
      std::string s = p ? p : "";
      H5Id space(H5Aget_space(a), H5Sclose);
      H5Dvlen_reclaim(mem, space, H5P_DEFAULT, &p);
      return s;
    }
    const size_t n = H5Tget_size(type);
    std::string s(n, '\0');
    H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, n);
    if (H5Aread(a, mem, s.data()) < 0) bad(std::string("cannot read attribute '") + name + "'");
    s.resize(std::strlen(s.c_str()));
    return s;
  }
  template <class T>
  T attr_num(hid_t obj, const char* name, hid_t mem_type) const {
    if (!has_attr(obj, name)) bad(std::string("missing attribute '") + name + "'");
    H5Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    H5Id space(H5Aget_space(a), H5Sclose);
    if (H5Sget_simple_extent_npoints(space) != 1) bad(std::string("attribute '") + name + "' is not a scalar");
    T v{};
    if (H5Aread(a, mem_type, &v) < 0) bad(std::string("cannot read attribute '") + name + "' as a number");
    return v;
  }
  int64_t i64(hid_t obj, const char* name) const { return attr_num<int64_t>(obj, name, H5T_NATIVE_INT64); }
  double f64(hid_t obj, const char* name) const { return attr_num<double>(obj, name, H5T_NATIVE_DOUBLE); }
  int64_t i64_or(hid_t obj, const char* name, int64_t def) const { return has_attr(obj, name) ? i64(obj, name) : def; }
  double f64_or(hid_t obj, const char* name, double def) const { return has_attr(obj, name) ? f64(obj, name) : def; }
  std::string str_or(hid_t obj, const char* name, const std::string& def) const {
    return has_attr(obj, name) ? attr_string(obj, name) : def;
  }

  std::vector<std::string> string_list(const char* name) const {
    std::vector<std::string> out;
    if (!has_link(file, name)) return out;
    H5Id d(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
    if (!d.valid()) bad(std::string("cannot open '") + name + "'");
    H5Id type(H5Dget_type(d), H5Tclose);
    H5Id space(H5Dget_space(d), H5Sclose);
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    if (H5Tget_class(type) != H5T_STRING) bad(std::string("'") + name + "' is not a list of strings");
    if (n <= 0) return out;
    if (H5Tis_variable_str(type) > 0) {
      H5Id mem = string_type();
      std::vector<char*> ptrs(static_cast<size_t>(n), nullptr);
      if (H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0) bad(std::string("cannot read '") + name + "'");
      for (char* p : ptrs) out.emplace_back(p ? p : "");
      H5Dvlen_reclaim(mem, space, H5P_DEFAULT, ptrs.data());
    } else {
      const size_t w = H5Tget_size(type);
      std::vector<char> buf(w * static_cast<size_t>(n) + 1, '\0');
      H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem, w);
      if (H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) bad(std::string("cannot read '") + name + "'");
      for (hssize_t i = 0; i < n; ++i) {
        const char* p = buf.data() + static_cast<size_t>(i) * w;
        out.emplace_back(p, strnlen(p, w));
      }
    }
    return out;
  }

  // The names in a group, in creation order when tracked (else by name).
  std::vector<std::string> link_names(hid_t g, const std::string& group_name) const {
    std::vector<std::string> out;
    H5G_info_t info{};
    if (H5Gget_info(g, &info) < 0) bad("cannot list group '" + group_name + "'");
    H5Id gcpl(H5Gget_create_plist(g), H5Pclose);
    unsigned order_flags = 0;
    H5Pget_link_creation_order(gcpl, &order_flags);
    const H5_index_t index = (order_flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t len = H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
      if (len < 0) bad("cannot list group '" + group_name + "'");
      std::string name(static_cast<size_t>(len), '\0');
      H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, name.data(), static_cast<size_t>(len) + 1, H5P_DEFAULT);
      out.push_back(std::move(name));
    }
    return out;
  }

  H5Id group(hid_t parent, const std::string& name) const {
    H5Id g(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.valid()) bad("cannot open group '" + name + "'");
    return g;
  }

  // Reads every dataset of a group, in creation order when tracked (else by name).
  std::vector<HostTensor> tensors(const std::string& group_name) const {
    std::vector<HostTensor> out;
    H5Id g = group(file, group_name);
    for (const std::string& name : link_names(g, group_name)) out.push_back(tensor(g, group_name, name));
    return out;
  }

  // An opened dataset with its element class and shape (rank checked).
  struct Dataset {
    H5Id id;
    H5T_class_t cls = H5T_NO_CLASS;
    hssize_t count = 0;
    std::vector<int64_t> shape;
  };
  Dataset dataset(hid_t group, const std::string& where, const std::string& name) const {
    Dataset ds;
    ds.id = H5Id(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.id.valid()) bad("cannot open dataset '" + where + "'");
    H5Id type(H5Dget_type(ds.id), H5Tclose);
    H5Id space(H5Dget_space(ds.id), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0 || rank > 4) bad("dataset '" + where + "' has an unsupported rank");
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    if (rank) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    for (hsize_t x : dims) ds.shape.push_back(static_cast<int64_t>(x));
    ds.cls = H5Tget_class(type);
    ds.count = H5Sget_simple_extent_npoints(space);
    return ds;
  }
  static bool is_nbt(const std::string& name) {
    return name.size() >= 19 && name.compare(name.size() - 19, 19, "num_batches_tracked") == 0;
  }
  int64_t int64_scalar(const Dataset& ds, const std::string& where) const {
    if (ds.count != 1) bad("dataset '" + where + "' should be a scalar");
    int64_t v = 0;
    if (H5Dread(ds.id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) < 0)
      bad("cannot read dataset '" + where + "' (file damaged?)");
    return v;
  }
  // out holds ds.count floats.
  void floats(const Dataset& ds, const std::string& where, float* out) const {
    if (ds.cls != H5T_FLOAT) bad("dataset '" + where + "' is not floating point");
    if (ds.count > 0 && H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
      bad("cannot read dataset '" + where + "' (checksum or read error: file damaged?)");
  }

  HostTensor tensor(hid_t group, const std::string& group_name, const std::string& name) const {
    const std::string where = group_name + "/" + name;
    const Dataset ds = dataset(group, where, name);
    HostTensor t;
    t.name = name;
    if (ds.cls == H5T_INTEGER && is_nbt(name)) {
      t.is_int64_scalar = true;
      t.int_value = int64_scalar(ds, where);
      return t;
    }
    t.shape = ds.shape;
    if (ds.cls == H5T_FLOAT) t.values.resize(static_cast<size_t>(ds.count));
    floats(ds, where, t.values.data());
    return t;
  }
};

H5Id open_for_read(const std::string& path) {
  quiet_hdf5();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError("checkpoint '" + path + "': no such file");
  if (fs::is_directory(path, ec)) throw UsageError("checkpoint '" + path + "': is a directory");
  // Before HDF5 parses anything: a damaged file of ours never reaches HDF5 in this process.
  if (!g_in_damage_probe)
    if (const std::string problem = checksum_problem(path); !problem.empty()) throw damaged_file_error(path, problem);
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw UsageError("checkpoint '" + path + "': not an HDF5 file (truncated or corrupt?)");
  H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) throw UsageError("checkpoint '" + path + "': cannot be opened as HDF5 (truncated or corrupt?)");
  return f;
}

CheckpointMeta read_meta(const Reader& r, bool weights_only) {
  CheckpointMeta m;
  const hid_t f = r.file;
  const bool has_format = r.has_attr(f, "format");
  if (has_format) {
    const std::string format = r.attr_string(f, "format");
    if (format != "resnet_ddp") r.bad("format is '" + format + "', expected 'resnet_ddp'");
    m.format_version = r.i64(f, "format_version");
    if (m.format_version > kCheckpointFormatVersion || m.format_version < 1)
      r.bad("format_version " + std::to_string(m.format_version) + " is not supported (this program reads up to " +
            std::to_string(kCheckpointFormatVersion) + ")");
  } else if (!weights_only) {
    r.bad("not a resnet_ddp checkpoint (no 'format' attribute)");
  }
  if (!weights_only) {
    m.arch = r.attr_string(f, "arch");
    m.head = r.attr_string(f, "head");
    m.num_classes = r.i64(f, "num_classes");
    m.image_size = r.i64(f, "image_size");
    m.epoch = r.i64(f, "epoch");
    m.global_step = r.i64(f, "global_step");
    m.best_val_acc = r.f64(f, "best_val_acc");
    m.world_size = r.i64(f, "world_size");
  } else {
    m.arch = r.str_or(f, "arch", "");
    m.head = r.str_or(f, "head", "");
    m.num_classes = r.i64_or(f, "num_classes", 0);
    m.image_size = r.i64_or(f, "image_size", 0);
    m.epoch = r.i64_or(f, "epoch", 0);
    m.global_step = r.i64_or(f, "global_step", 0);
    m.best_val_acc = r.f64_or(f, "best_val_acc", -1.0);
    m.world_size = r.i64_or(f, "world_size", 0);
  }
  m.step_in_epoch = r.i64_or(f, "step_in_epoch", 0);
  m.best_val_loss = r.f64_or(f, "best_val_loss", 0.0);
  m.val_acc = r.f64_or(f, "val_acc", -1.0);
  m.val_loss = r.f64_or(f, "val_loss", 0.0);
  m.batch_size = r.i64_or(f, "batch_size", 0);
  m.accum_steps = r.i64_or(f, "accum_steps", 0);
  m.seed = r.i64_or(f, "seed", 0);
  m.args = r.str_or(f, "args", "");
  m.created_by = r.str_or(f, "created_by", "");
  m.normalize = r.str_or(f, "normalize", "none");
  m.partial_train_loss_sum = r.f64_or(f, "partial_train_loss_sum", 0.0);
  m.partial_train_correct = r.i64_or(f, "partial_train_correct", 0);
  m.partial_train_count = r.i64_or(f, "partial_train_count", 0);
  m.class_names = r.string_list("class_names");
  if (!weights_only && static_cast<int64_t>(m.class_names.size()) != m.num_classes)
    r.bad("has " + std::to_string(m.class_names.size()) + " class names but num_classes = " +
          std::to_string(m.num_classes));
  if (m.epoch < 0 || m.global_step < 0 || m.step_in_epoch < 0) r.bad("negative epoch or step counters");
  return m;
}

}  // namespace

namespace {

// Writes the HDF5 file straight to `file` through the latching driver: no
// in-memory image, so the only extra memory is HDF5's per-dataset buffers.
void write_hdf5_file(const std::string& file, const OutFile& out) {
  IoLatch io;
  struct Scope {
    explicit Scope(IoLatch* l) { t_latch = l; }
    ~Scope() { t_latch = nullptr; }
  } scope(&io);
  H5Id fapl = wid(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access list");
  wcheck(H5Pset_driver(fapl, latch_driver(), nullptr), "file driver");
  // Closing the file closes whatever is still open in it (on an early throw too).
  wcheck(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "file close degree");
  H5Id fcpl = wid(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "file creation list");
  H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  // The user block (ignored by HDF5 readers) holds the whole-file checksum.
  wcheck(H5Pset_userblock(fcpl, kChecksumBlock), "user block");
  H5Id f = wid(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, fcpl, fapl), H5Fclose, "temp file '" + file + "'");
  write_file_contents(f, out);
  // Metadata is written at close: its result is checked, not left to a destructor.
  wcheck(H5Fclose(f.release()), "closing temp file '" + file + "'");
  check_latch("closing temp file '" + file + "'");
  stamp_checksum(file);
}

// Atomic replace: temp file in the same directory, fsync, rename, fsync of the directory.
void write_atomically(const std::string& path, const OutFile& out) {
  quiet_hdf5();
  const fs::path final_path(path);
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  std::string tmp_name = ".";  // hidden, same directory: rename stays atomic
  tmp_name += final_path.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(getpid());
  const fs::path tmp = dir / tmp_name;
  const std::string tmp_s = tmp.string();
  auto fail = [&](const std::string& what) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw Error("cannot write checkpoint '" + path + "': " + what + "; the previous checkpoint (if any) is unchanged");
  };
  try {
    write_hdf5_file(tmp_s, out);
  } catch (const WriteError& e) {
    fail(e.what());
  }
  try {
    fsync_path(tmp_s, false);
  } catch (const Error& e) {
    fail(e.what());
  }
  if (::rename(tmp_s.c_str(), path.c_str()) != 0) fail(std::string("rename failed: ") + std::strerror(errno));
  try {
    fsync_path(dir.string(), true);
  } catch (const Error&) {
    // The file is complete and in place; a directory that cannot be synced only
    // weakens crash durability of the rename, which the next save repeats.
  }
}

OptimizerSnapshot optimizer_attributes(const OptimizerSnapshot& o) {
  OptimizerSnapshot h;
  h.present = o.present;
  h.type = o.type;
  h.step = o.step;
  h.lr = o.lr;
  h.initial_lr = o.initial_lr;
  h.weight_decay = o.weight_decay;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.momentum = o.momentum;
  h.dampening = o.dampening;
  h.nesterov = o.nesterov;
  return h;
}

OutTensor arena_tensor(const Arena& arena, size_t i, const float* base) {
  const ParamSlice& s = arena.slice(i);
  OutTensor t;
  t.name = s.name;
  t.shape = s.shape.vec();
  t.data = base + s.offset;
  t.count = s.count;
  return t;
}

std::string bn_prefix_of_bias(const std::string& param_name) {
  static const std::string suffix = ".bias";
  if (param_name.size() > suffix.size() &&
      param_name.compare(param_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return param_name.substr(0, param_name.size() - suffix.size());
  return {};
}

// A model's checkpoint contents, tensors pointing into its arenas (and the
// optimizer's state buffers). The one place that fixes the order of the file.
OutFile model_contents(ResNet& model, const Optimizer* opt, const Scheduler* sched, const CheckpointMeta& meta) {
  Backend& be = model.backend();
  be.synchronize();
  OutFile s;
  s.meta = meta;
  s.backend = &be;
  Arena& params = model.params();
  Arena& buffers = model.buffers();
  // torchvision's state_dict order: a BN's buffers follow its weight and bias.
  std::set<std::string> emitted_buffers;
  for (size_t i = 0; i < params.slices().size(); ++i) {
    s.state_dict.push_back(arena_tensor(params, i, params.data()));
    const std::string prefix = bn_prefix_of_bias(params.slice(i).name);
    if (prefix.empty()) continue;
    const long rm = buffers.find(prefix + ".running_mean");
    const long rv = buffers.find(prefix + ".running_var");
    if (rm < 0 || rv < 0) continue;
    s.state_dict.push_back(arena_tensor(buffers, static_cast<size_t>(rm), buffers.data()));
    s.state_dict.push_back(arena_tensor(buffers, static_cast<size_t>(rv), buffers.data()));
    emitted_buffers.insert(prefix + ".running_mean");
    emitted_buffers.insert(prefix + ".running_var");
    OutTensor nbt;
    nbt.name = prefix + ".num_batches_tracked";
    nbt.is_int64_scalar = true;
    nbt.int_value = model.num_batches_tracked();
    s.state_dict.push_back(std::move(nbt));
  }
  for (size_t i = 0; i < buffers.slices().size(); ++i)
    if (!emitted_buffers.count(buffers.slice(i).name)) s.state_dict.push_back(arena_tensor(buffers, i, buffers.data()));

  if (opt) {
    OptimizerSnapshot& o = s.optimizer;
    const OptimizerConfig& c = opt->config();
    o.present = true;
    o.type = opt->type_name();
    o.step = opt->steps();
    o.lr = opt->lr();
    o.initial_lr = c.lr;
    o.weight_decay = c.weight_decay;
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.momentum = c.momentum;
    o.dampening = c.dampening;
    o.nesterov = c.nesterov;
    // Before the first step PyTorch has no state at all; we write zeros, which
    // give the same next step for Adam, and skip SGD's buffer (seeded by step 1).
    auto* mutable_opt = const_cast<Optimizer*>(opt);
    for (size_t k = 0; k < opt->state_count(); ++k) {
      if (o.type == "sgd" && opt->steps() == 0) break;
      std::vector<OutTensor> tensors;
      const float* base = mutable_opt->state(k);
      for (size_t i = 0; i < params.slices().size(); ++i) tensors.push_back(arena_tensor(params, i, base));
      s.optimizer_states.emplace_back(opt->state_name(k), std::move(tensors));
    }
  }
  if (sched) {
    SchedulerSnapshot& c = s.scheduler;
    c.present = true;
    c.type = sched->type();
    c.last_epoch = sched->last_epoch();
    c.plateau = sched->plateau;
    c.cosine = sched->cosine;
  }
  return s;
}

}  // namespace

void write_checkpoint(const std::string& path, const Snapshot& snap) {
  OutFile out;
  out.meta = snap.meta;
  for (const auto& t : snap.state_dict) out.state_dict.push_back(out_tensor(t));
  out.optimizer = optimizer_attributes(snap.optimizer);
  if (snap.optimizer.present)
    for (const auto& [name, tensors] : snap.optimizer.states) {
      std::vector<OutTensor> ts;
      for (const auto& t : tensors) ts.push_back(out_tensor(t));
      out.optimizer_states.emplace_back(name, std::move(ts));
    }
  out.scheduler = snap.scheduler;
  write_atomically(path, out);
}

void write_checkpoint(const std::string& path, ResNet& model, const Optimizer* opt, const Scheduler* sched,
                      const CheckpointMeta& meta) {
  write_atomically(path, model_contents(model, opt, sched, meta));
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  H5Id f = open_for_read(path);
  Reader r{path, f};
  return read_meta(r, false);
}

namespace {

const std::vector<std::string>& optimizer_state_names(const std::string& type) {
  static const std::vector<std::string> adam{"exp_avg", "exp_avg_sq"}, sgd{"momentum_buffer"};
  return type == "adam" ? adam : sgd;
}

// Everything read_checkpoint reads except the tensors: metadata, that
// /state_dict is there and not empty, optimizer and scheduler attributes.
Snapshot read_header(const Reader& r, bool weights_only) {
  const hid_t f = r.file;
  Snapshot s;
  s.meta = read_meta(r, weights_only);
  if (!r.has_link(f, "state_dict")) r.bad("no /state_dict group");
  {
    H5Id g = r.group(f, "state_dict");
    H5G_info_t info{};
    if (H5Gget_info(g, &info) < 0) r.bad("cannot list group 'state_dict'");
    if (info.nlinks == 0) r.bad("/state_dict is empty");
  }
  if (weights_only) return s;

  if (r.has_link(f, "optimizer")) {
    H5Id g = r.group(f, "optimizer");
    OptimizerSnapshot& o = s.optimizer;
    o.present = true;
    o.type = r.attr_string(g, "type");
    if (o.type != "adam" && o.type != "sgd") r.bad("unknown optimizer type '" + o.type + "'");
    o.step = r.i64(g, "step");
    o.lr = r.f64(g, "lr");
    o.initial_lr = r.f64_or(g, "initial_lr", o.lr);
    o.weight_decay = r.f64_or(g, "weight_decay", 0.0);
    if (o.type == "adam") {
      o.beta1 = r.f64_or(g, "beta1", 0.9);
      o.beta2 = r.f64_or(g, "beta2", 0.999);
      o.eps = r.f64_or(g, "eps", 1e-8);
    } else {
      o.momentum = r.f64_or(g, "momentum", 0.0);
      o.dampening = r.f64_or(g, "dampening", 0.0);
      o.nesterov = r.i64_or(g, "nesterov", 0) != 0;
    }
  }
  if (r.has_link(f, "scheduler")) {
    H5Id g = r.group(f, "scheduler");
    SchedulerSnapshot& c = s.scheduler;
    c.present = true;
    c.type = r.attr_string(g, "type");
    c.last_epoch = r.i64_or(g, "last_epoch", 0);
    if (c.type == "plateau") {
      PlateauState& p = c.plateau;
      p.factor = r.f64(g, "factor");
      p.patience = r.i64(g, "patience");
      p.threshold = r.f64_or(g, "threshold", 1e-4);
      p.cooldown = r.i64_or(g, "cooldown", 0);
      p.min_lr = r.f64(g, "min_lr");
      p.eps = r.f64_or(g, "eps", 1e-8);
      p.best = r.f64(g, "best");
      p.num_bad_epochs = r.i64(g, "num_bad_epochs");
      p.cooldown_counter = r.i64_or(g, "cooldown_counter", 0);
    } else if (c.type == "cosine") {
      c.cosine.t_max = r.i64(g, "T_max");
      c.cosine.eta_min = r.f64_or(g, "eta_min", 0.0);
      c.cosine.base_lr = r.f64(g, "base_lr");
    } else if (c.type != "none") {
      r.bad("unknown scheduler type '" + c.type + "'");
    }
  }
  return s;
}

bool is_head_tensor(const std::string& name) { return name.rfind("fc.", 0) == 0; }

}  // namespace

Snapshot read_checkpoint(const std::string& path, bool weights_only) {
  H5Id f = open_for_read(path);
  Reader r{path, f};
  Snapshot s = read_header(r, weights_only);
  s.state_dict = r.tensors("state_dict");
  if (s.optimizer.present) {
    H5Id g = r.group(f, "optimizer");
    for (const auto& n : optimizer_state_names(s.optimizer.type))
      if (r.has_link(g, n)) s.optimizer.states.emplace_back(n, r.tensors("optimizer/" + n));
  }
  return s;
}

// ---- state -> model (from the file or from a Snapshot) --------------------------------

namespace {

// A tensor found in a checkpoint: its shape (empty for an int64 scalar, so it never
// matches a parameter) and how to read its values.
struct SourceTensor {
  std::vector<int64_t> shape;
  std::function<void(float*)> read;  // fills the shape's element count
};

// Where restore reads from: the checkpoint file itself (streamed into the arenas) or
// a Snapshot in memory. One set of checks and messages for both.
class StateSource {
 public:
  explicit StateSource(std::string path) : path_(std::move(path)) {}
  virtual ~StateSource() = default;
  // Tensor `name` of the state dict (state == "") or of optimizer state `state`;
  // nullopt when absent.
  virtual std::optional<SourceTensor> find(const std::string& state, const std::string& name) = 0;
  virtual bool has_state(const std::string& type, const std::string& state) = 0;
  virtual int64_t num_batches_tracked() = 0;  // the largest, -1 when none
  [[noreturn]] void bad(const std::string& what) const { throw UsageError("checkpoint '" + path_ + "': " + what); }

 private:
  std::string path_;
};

std::vector<std::string> restore_model_from(StateSource& src, ResNet& model, bool allow_head_mismatch) {
  Backend& be = model.backend();
  std::vector<float> staging;  // grows to the largest tensor
  std::vector<std::string> skipped;
  auto load_arena = [&](Arena& arena, const char* kind) {
    for (size_t i = 0; i < arena.slices().size(); ++i) {
      const ParamSlice& s = arena.slice(i);
      const bool head = is_head_tensor(s.name);
      const std::optional<SourceTensor> t = src.find("", s.name);
      if (!t || t->shape != s.shape.vec()) {
        if (allow_head_mismatch && head) {
          skipped.push_back(s.name);
          continue;
        }
        if (!t) src.bad(std::string("missing ") + kind + " '" + s.name + "' (different arch or head?)");
        src.bad("'" + s.name + "' has shape " + Shape::from(t->shape).str() + ", the model expects " + s.shape.str());
      }
      if (staging.size() < s.count) staging.resize(s.count);
      t->read(staging.data());
      for (size_t k = 0; k < s.count; ++k)
        if (!std::isfinite(staging[k])) src.bad("'" + s.name + "' contains NaN or Inf");
      be.copy_from_host(arena.ptr(i), staging.data(), s.count * sizeof(float));
    }
  };
  load_arena(model.params(), "parameter");
  load_arena(model.buffers(), "buffer");
  // A head left at its fresh init must not keep half of an old head: all or nothing.
  if (!skipped.empty()) {
    const Arena& params = model.params();
    for (size_t i = 0; i < params.slices().size(); ++i) {
      const std::string& n = params.slice(i).name;
      if (is_head_tensor(n) && std::find(skipped.begin(), skipped.end(), n) == skipped.end())
        src.bad("head tensors only partly match ('" + n + "' fits, '" + skipped.front() +
                "' does not); convert the file with a matching head or drop its head");
    }
  }
  const int64_t nbt = src.num_batches_tracked();
  if (nbt >= 0) model.set_num_batches_tracked(nbt);
  be.synchronize();
  return skipped;
}

void restore_optimizer_from(StateSource& src, const OptimizerSnapshot& o, ResNet& model, Optimizer& opt) {
  if (!o.present) src.bad("has no /optimizer state to resume from");
  if (o.type != opt.type_name())
    src.bad("optimizer state is for --optimizer " + o.type + ", this run uses --optimizer " + opt.type_name());
  opt.set_steps(o.step);
  opt.set_lr(o.lr);
  Backend& be = model.backend();
  const Arena& params = model.params();
  std::vector<float> staging;
  for (size_t k = 0; k < opt.state_count(); ++k) {
    const std::string name = opt.state_name(k);
    if (!src.has_state(o.type, name)) {
      // SGD before its first step has no momentum buffer; anything else is damage.
      if (o.type == "sgd" && o.step == 0) continue;
      src.bad("missing optimizer state '" + name + "'");
    }
    float* base = opt.state(k);
    for (size_t i = 0; i < params.slices().size(); ++i) {
      const ParamSlice& s = params.slice(i);
      const std::optional<SourceTensor> t = src.find(name, s.name);
      if (!t) src.bad("missing optimizer state " + name + "/" + s.name);
      if (t->shape != s.shape.vec()) src.bad("optimizer state " + name + "/" + s.name + " has the wrong shape");
      if (staging.size() < s.count) staging.resize(s.count);
      t->read(staging.data());
      be.copy_from_host(base + s.offset, staging.data(), s.count * sizeof(float));
    }
  }
  be.synchronize();
}

class SnapshotSource final : public StateSource {
 public:
  SnapshotSource(const Snapshot& snap, const std::string& path) : StateSource(path), snap_(snap) {
    for (const auto& t : snap.state_dict) tensors_[""][t.name] = &t;
    for (const auto& [state, ts] : snap.optimizer.states)
      for (const auto& t : ts) tensors_[state][t.name] = &t;
  }
  std::optional<SourceTensor> find(const std::string& state, const std::string& name) override {
    auto g = tensors_.find(state);
    if (g == tensors_.end()) return std::nullopt;
    auto it = g->second.find(name);
    if (it == g->second.end()) return std::nullopt;
    const HostTensor& t = *it->second;
    return SourceTensor{t.is_int64_scalar ? std::vector<int64_t>{} : t.shape,
                        [&t](float* out) { std::copy(t.values.begin(), t.values.end(), out); }};
  }
  bool has_state(const std::string&, const std::string& state) override { return tensors_.count(state) > 0; }
  int64_t num_batches_tracked() override {
    int64_t nbt = -1;
    for (const auto& t : snap_.state_dict)
      if (t.is_int64_scalar) nbt = std::max(nbt, t.int_value);
    return nbt;
  }

 private:
  const Snapshot& snap_;
  std::map<std::string, std::map<std::string, const HostTensor*>> tensors_;  // state -> name -> tensor
};

class FileSource final : public StateSource {
 public:
  explicit FileSource(const Reader& r) : StateSource(r.path), r_(r) {}
  std::optional<SourceTensor> find(const std::string& state, const std::string& name) override {
    const std::string group_name = state.empty() ? "state_dict" : "optimizer/" + state;
    auto g = groups_.find(group_name);
    if (g == groups_.end()) g = groups_.emplace(group_name, r_.group(r_.file, group_name)).first;
    if (!r_.has_link(g->second, name)) return std::nullopt;
    const std::string where = group_name + "/" + name;
    auto ds = std::make_shared<Reader::Dataset>(r_.dataset(g->second, where, name));
    if (ds->cls != H5T_FLOAT) r_.bad("dataset '" + where + "' is not floating point");
    return SourceTensor{ds->shape, [this, ds, where](float* out) { r_.floats(*ds, where, out); }};
  }
  bool has_state(const std::string& type, const std::string& state) override {
    const auto& known = optimizer_state_names(type);
    return std::find(known.begin(), known.end(), state) != known.end() &&
           r_.has_link(r_.group(r_.file, "optimizer"), state);
  }
  int64_t num_batches_tracked() override {
    const H5Id g = r_.group(r_.file, "state_dict");
    int64_t nbt = -1;
    for (const std::string& name : r_.link_names(g, "state_dict")) {
      if (!Reader::is_nbt(name)) continue;
      const std::string where = "state_dict/" + name;
      const Reader::Dataset ds = r_.dataset(g, where, name);
      if (ds.cls == H5T_INTEGER) nbt = std::max(nbt, r_.int64_scalar(ds, where));
      else if (ds.cls != H5T_FLOAT) r_.bad("dataset '" + where + "' is not floating point");
    }
    return nbt;
  }

 private:
  Reader r_;
  std::map<std::string, H5Id> groups_;
};

}  // namespace

// ---- file -> model ---------------------------------------------------------------------

struct CheckpointReader::Impl {
  std::string path;
  H5Id file;
  Snapshot header;  // no tensors
  Reader reader() const { return Reader{path, file.get()}; }
};

CheckpointReader::CheckpointReader(const std::string& path, bool weights_only) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->file = open_for_read(path);
  impl_->header = read_header(impl_->reader(), weights_only);
}
CheckpointReader::~CheckpointReader() = default;

const std::string& CheckpointReader::path() const { return impl_->path; }
const CheckpointMeta& CheckpointReader::meta() const { return impl_->header.meta; }
const OptimizerSnapshot& CheckpointReader::optimizer() const { return impl_->header.optimizer; }
const SchedulerSnapshot& CheckpointReader::scheduler() const { return impl_->header.scheduler; }

std::vector<std::string> CheckpointReader::load_model(ResNet& model, bool allow_head_mismatch) {
  FileSource src(impl_->reader());
  return restore_model_from(src, model, allow_head_mismatch);
}

void CheckpointReader::load_optimizer(ResNet& model, Optimizer& opt) {
  FileSource src(impl_->reader());
  restore_optimizer_from(src, impl_->header.optimizer, model, opt);
}

// ---- model <-> snapshot --------------------------------------------------------------

namespace {

HostTensor host_tensor(Backend& be, const OutTensor& o) {
  HostTensor t;
  t.name = o.name;
  t.shape = o.shape;
  t.is_int64_scalar = o.is_int64_scalar;
  t.int_value = o.int_value;
  if (!o.is_int64_scalar) {
    t.values.resize(o.count);
    if (o.count) be.copy_to_host(t.values.data(), o.data, o.count * sizeof(float));
  }
  return t;
}

}  // namespace

Snapshot snapshot_model(ResNet& model, const Optimizer* opt, const Scheduler* sched, const CheckpointMeta& meta) {
  OutFile out = model_contents(model, opt, sched, meta);
  Backend& be = *out.backend;
  Snapshot s;
  s.meta = std::move(out.meta);
  for (const auto& t : out.state_dict) s.state_dict.push_back(host_tensor(be, t));
  s.optimizer = std::move(out.optimizer);
  for (const auto& [name, tensors] : out.optimizer_states) {
    std::vector<HostTensor> ts;
    for (const auto& t : tensors) ts.push_back(host_tensor(be, t));
    s.optimizer.states.emplace_back(name, std::move(ts));
  }
  s.scheduler = out.scheduler;
  return s;
}

void check_compatible(const Snapshot& snap, ResNet& model, const std::vector<std::string>& class_names,
                      const std::string& path) {
  check_compatible(snap.meta, model, class_names, path);
}

void check_compatible(const CheckpointMeta& m, ResNet& model, const std::vector<std::string>& class_names,
                      const std::string& path) {
  const ResNetConfig& cfg = model.config();
  auto bad = [&](const std::string& what) {
    throw UsageError("checkpoint '" + path + "' does not match this run: " + what);
  };
  if (m.arch != cfg.arch) bad("it was trained with --arch " + m.arch + ", this run uses --arch " + cfg.arch);
  if (m.head != head_name(cfg.head))
    bad("it was trained with --head " + m.head + ", this run uses --head " + head_name(cfg.head));
  if (m.num_classes != cfg.num_classes)
    bad("it has " + std::to_string(m.num_classes) + " classes, the dataset has " + std::to_string(cfg.num_classes));
  if (!class_names.empty() && m.class_names != class_names) {
    std::string diff;
    for (size_t i = 0; i < class_names.size() && i < m.class_names.size(); ++i)
      if (class_names[i] != m.class_names[i]) {
        diff = "class " + std::to_string(i) + " is '" + m.class_names[i] + "' there, '" + class_names[i] + "' here";
        break;
      }
    bad("class names differ (" + diff + ")");
  }
}

std::vector<std::string> restore_model(const Snapshot& snap, ResNet& model, bool allow_head_mismatch,
                                       const std::string& path) {
  SnapshotSource src(snap, path);
  return restore_model_from(src, model, allow_head_mismatch);
}

void restore_optimizer(const Snapshot& snap, ResNet& model, Optimizer& opt, const std::string& path) {
  SnapshotSource src(snap, path);
  restore_optimizer_from(src, snap.optimizer, model, opt);
}

void restore_scheduler(const Snapshot& snap, Scheduler& sched) { restore_scheduler(snap.scheduler, sched); }

void restore_scheduler(const SchedulerSnapshot& c, Scheduler& sched) {
  if (!c.present || c.type != sched.type()) return;  // a changed --scheduler starts fresh
  sched.set_last_epoch(c.last_epoch);
  sched.plateau = c.plateau;
  sched.cosine = c.cosine;
}

}  // namespace rd::train
