// HDF5 packed datasets: the writer behind `resnet_ddp pack` and the reader used
// by open_dataset. The HDF5 library build is not thread-safe, so every HDF5 call
// runs under one process-wide mutex. Uncompressed images are instead read with
// pread() at chunk addresses resolved when the file is opened, so loader threads
// read in parallel without touching HDF5.
#include "resnet_ddp/data/pack.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "resnet_ddp/io/h5.h"
#include "data/internal.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"

namespace rd::data {

namespace {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

using Handle = h5::Id;
using QuietHdf5 = h5::Quiet;

void write_attr_int(hid_t obj, const char* name, int32_t value) {
  if (!h5::write_attr(obj, name, H5T_NATIVE_INT32, H5T_NATIVE_INT32, &value))
    throw Error(std::string("HDF5: cannot write attribute ") + name);
}

// Fixed-length strings, as packs have always been written.
void write_attr_string(hid_t obj, const char* name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.size() + 1);
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  if (!h5::write_attr(obj, name, type, type, value.c_str()))
    throw Error(std::string("HDF5: cannot write attribute ") + name);
}

bool read_attr_int(hid_t obj, const char* name, int32_t& value) {
  return h5::read_attr(obj, name, H5T_NATIVE_INT32, value) == h5::Status::Ok;
}
bool read_attr_string(hid_t obj, const char* name, std::string& value) {
  return h5::read_attr(obj, name, value) == h5::Status::Ok;
}

void write_strings(hid_t parent, const char* name, const std::vector<std::string>& values) {
  if (!h5::write_strings(parent, name, values)) throw Error(std::string("HDF5: cannot write dataset ") + name);
}
bool read_strings(hid_t parent, const char* name, std::vector<std::string>& out) {
  return h5::read_strings(parent, name, out) == h5::Status::Ok;
}

class PackedDataset final : public Dataset {
 public:
  PackedDataset(const std::string& path, Split split, const std::string& flag) : path_(path), split_(split) {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    QuietHdf5 quiet;
    const auto bad = [&](const std::string& why) {
      return UsageError(flag + " " + path + ": " + why);
    };
    file_ = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file_.ok()) throw bad("cannot be opened as HDF5 (truncated or not an HDF5 file)");
    std::string format;
    if (!read_attr_string(file_.get(), "format", format) || format != kPackFormatName)
      throw bad(std::string("not a resnet_ddp packed dataset (root attribute format != \"") +
                kPackFormatName + "\"); create one with `resnet_ddp pack`");
    int32_t version = 0;
    if (!read_attr_int(file_.get(), "format_version", version) || version != kPackFormatVersion)
      throw bad("unsupported format_version " + std::to_string(version) + " (this build reads " +
                std::to_string(kPackFormatVersion) + ")");
    if (!read_attr_int(file_.get(), "image_size", size_) || size_ <= 0)
      throw bad("missing or invalid image_size attribute");
    if (!read_strings(file_.get(), "class_names", classes_) || classes_.empty())
      throw bad("missing class_names");
    const char* group = split_name(split);
    if (H5Lexists(file_.get(), group, H5P_DEFAULT) <= 0)
      throw bad(std::string("has no ") + group + " split");
    Handle g(H5Gopen2(file_.get(), group, H5P_DEFAULT), H5Gclose);
    if (!g.ok()) throw bad(std::string("cannot open group ") + group);
    if (!read_strings(g.get(), "sources", sources_)) throw bad(std::string(group) + "/sources missing or unreadable");
    // labels
    {
      if (H5Lexists(g.get(), "labels", H5P_DEFAULT) <= 0) throw bad(std::string(group) + "/labels missing");
      Handle ds(H5Dopen2(g.get(), "labels", H5P_DEFAULT), H5Dclose);
      Handle space(H5Dget_space(ds.get()), H5Sclose);
      hsize_t n = 0;
      if (!ds.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) throw bad(std::string(group) + "/labels is not 1-D");
      H5Sget_simple_extent_dims(space.get(), &n, nullptr);
      labels_.resize(n);
      if (n > 0 && H5Dread(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels_.data()) < 0)
        throw bad(std::string(group) + "/labels unreadable (truncated file?)");
      for (int32_t l : labels_)
        if (l < 0 || static_cast<size_t>(l) >= classes_.size())
          throw bad(std::string(group) + "/labels holds label " + std::to_string(l) + " outside 0.." +
                    std::to_string(classes_.size() - 1));
    }
    if (sources_.size() != labels_.size()) throw bad(std::string(group) + ": sources and labels differ in length");
    if (labels_.empty()) throw bad(std::string(group) + " split has no images");
    // images
    if (H5Lexists(g.get(), "images", H5P_DEFAULT) <= 0) throw bad(std::string(group) + "/images missing");
    images_ = Handle(H5Dopen2(g.get(), "images", H5P_DEFAULT), H5Dclose);
    Handle space(H5Dget_space(images_.get()), H5Sclose);
    hsize_t dims[4] = {0, 0, 0, 0};
    if (!images_.ok() || H5Sget_simple_extent_ndims(space.get()) != 4) throw bad(std::string(group) + "/images is not 4-D");
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    if (dims[0] != labels_.size() || dims[1] != static_cast<hsize_t>(size_) ||
        dims[2] != static_cast<hsize_t>(size_) || dims[3] != 3)
      throw bad(std::string(group) + "/images has shape [" + std::to_string(dims[0]) + "," +
                std::to_string(dims[1]) + "," + std::to_string(dims[2]) + "," + std::to_string(dims[3]) +
                "], expected [" + std::to_string(labels_.size()) + "," + std::to_string(size_) + "," +
                std::to_string(size_) + ",3]");
    Handle type(H5Dget_type(images_.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1)
      throw bad(std::string(group) + "/images is not uint8");
    resolve_direct_reads(bad);
  }

  ~PackedDataset() override {
    if (fd_ >= 0) ::close(fd_);
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    images_.reset();
    file_.reset();
  }

  size_t size() const override { return labels_.size(); }
  int32_t label(size_t i) const override { return labels_.at(i); }
  const std::vector<std::string>& class_names() const override { return classes_; }
  std::string source(size_t i) const override { return sources_.at(i); }
  std::string description() const override {
    return "HDF5 " + path_ + " (" + split_name(split_) + ", " + std::to_string(size_) + "x" +
           std::to_string(size_) + ")";
  }
  int stored_size() const override { return size_; }

  void load(size_t i, Image& out) const override {
    if (i >= labels_.size()) throw Error(path_ + ": sample " + std::to_string(i) + " out of range");
    out.resize(size_, size_);
    const size_t bytes = out.bytes();
    if (fd_ >= 0) {
      size_t done = 0;
      while (done < bytes) {
        const ssize_t r = ::pread(fd_, out.data() + done, bytes - done, static_cast<off_t>(offsets_[i] + done));
        if (r <= 0) {
          if (r < 0 && errno == EINTR) continue;
          throw Error(path_ + ": reading image " + std::to_string(i) + " failed (" +
                      (r == 0 ? std::string("unexpected end of file") : std::strerror(errno)) + ")");
        }
        done += static_cast<size_t>(r);
      }
      return;
    }
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    QuietHdf5 quiet;
    Handle fspace(H5Dget_space(images_.get()), H5Sclose);
    const hsize_t start[4] = {i, 0, 0, 0};
    const hsize_t count[4] = {1, static_cast<hsize_t>(size_), static_cast<hsize_t>(size_), 3};
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    Handle mspace(H5Screate_simple(4, count, nullptr), H5Sclose);
    if (H5Dread(images_.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT, out.data()) < 0)
      throw Error(path_ + ": reading " + split_name(split_) + "/images[" + std::to_string(i) +
                  "] failed (truncated or corrupt file)");
  }

 private:
  template <class Bad>
  void resolve_direct_reads(const Bad& bad) {
    Handle dcpl(H5Dget_create_plist(images_.get()), H5Pclose);
    if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED || H5Pget_nfilters(dcpl.get()) != 0) return;
    hsize_t chunk[4] = {0, 0, 0, 0};
    H5Pget_chunk(dcpl.get(), 4, chunk);
    if (chunk[0] != 1 || chunk[1] != static_cast<hsize_t>(size_) || chunk[2] != static_cast<hsize_t>(size_) || chunk[3] != 3)
      return;
    struct stat st{};
    if (::stat(path_.c_str(), &st) != 0) return;
    const uint64_t image_bytes = static_cast<uint64_t>(size_) * size_ * 3;
    offsets_.resize(labels_.size());
    for (size_t i = 0; i < labels_.size(); ++i) {
      const hsize_t coord[4] = {i, 0, 0, 0};
      unsigned filter_mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t bytes = 0;
      if (H5Dget_chunk_info_by_coord(images_.get(), coord, &filter_mask, &addr, &bytes) < 0 ||
          addr == HADDR_UNDEF || bytes != image_bytes)
        throw bad(std::string(split_name(split_)) + "/images[" + std::to_string(i) + "] has no stored data (truncated or incomplete file)");
      if (addr + bytes > static_cast<uint64_t>(st.st_size))
        throw bad("truncated: image " + std::to_string(i) + " lies beyond the end of the file");
      offsets_[i] = addr;
    }
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  }

  std::string path_;
  Split split_;
  Handle file_, images_;
  int32_t size_ = 0;
  std::vector<std::string> classes_, sources_;
  std::vector<int32_t> labels_;
  std::vector<uint64_t> offsets_;
  int fd_ = -1;
};

}  // namespace

bool is_hdf5_file(const std::string& path) {
  static const unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return false;
  unsigned char head[8];
  return std::fread(head, 1, 8, f.get()) == 8 && std::memcmp(head, kSignature, 8) == 0;
}

std::unique_ptr<Dataset> open_packed_dataset(const std::string& path, Split split, const std::string& flag) {
  return std::make_unique<PackedDataset>(path, split, flag);
}

bool packed_has_split(const std::string& path, Split split) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  QuietHdf5 quiet;
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  return f.ok() && H5Lexists(f.get(), split_name(split), H5P_DEFAULT) > 0;
}

// ---- writer ---------------------------------------------------------------------------

namespace {

void progress(bool on, const char* split, size_t done, size_t total) {
  if (!on) return;
  const int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\rpack %-10s [%.*s%*s] %zu/%zu", split, filled,
               "##############################", width - filled, "", done, total);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// One split into `file` (group SPLIT with images, labels, sources): decoded and resized
// in parallel blocks, written in order with `lock` (HDF5's) held only while writing.
void pack_split(hid_t file, Split split, const FolderScan& scan, const PackOptions& opts, const std::string& data_dir,
                const std::string& tmp_path, std::unique_lock<std::mutex>& lock, PackStats& stats) {
  const int size = opts.image_size;
  const size_t image_bytes = static_cast<size_t>(size) * size * 3;
  Handle group(H5Gcreate2(file, split_name(split), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  const hsize_t dims0[4] = {0, static_cast<hsize_t>(size), static_cast<hsize_t>(size), 3};
  const hsize_t maxdims[4] = {H5S_UNLIMITED, dims0[1], dims0[2], 3};
  const hsize_t chunk[4] = {1, dims0[1], dims0[2], 3};
  Handle space(H5Screate_simple(4, dims0, maxdims), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), 4, chunk);
  if (opts.compress_level > 0) H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opts.compress_level));
  Handle images(H5Dcreate2(group.get(), "images", H5T_NATIVE_UINT8, space.get(), H5P_DEFAULT,
                           dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!images.ok()) throw Error("HDF5: cannot create " + std::string(split_name(split)) + "/images");

  std::vector<int32_t> labels;
  std::vector<std::string> sources;
  const size_t block = 64;
  std::vector<uint8_t> pixels(block * image_bytes);
  std::vector<std::string> errors(block);
  size_t written = 0;
  progress(opts.progress, split_name(split), 0, scan.entries.size());
  for (size_t begin = 0; begin < scan.entries.size(); begin += block) {
    const size_t n = std::min(block, scan.entries.size() - begin);
    lock.unlock();  // decoding does not touch HDF5
    parallel_for(n, opts.threads, [&](size_t k) {
      thread_local Image img;
      errors[k].clear();
      try {
        decode_image_file(scan.entries[begin + k].path, img, opts.scan.max_pixels, opts.scan.jpeg_draft);
        resize_bilinear_into(img, size, size, pixels.data() + k * image_bytes);
      } catch (const Error& e) {
        errors[k] = e.what();
      }
    });
    lock.lock();
    for (size_t k = 0; k < n; ++k) {
      const FolderEntry& e = scan.entries[begin + k];
      if (!errors[k].empty()) {
        if (opts.scan.strict) throw UsageError("--strict-data: " + errors[k]);
        if (opts.scan.log) opts.scan.log("warning: skipping " + errors[k]);
        ++stats.skipped;
        continue;
      }
      const hsize_t new_dims[4] = {written + 1, dims0[1], dims0[2], 3};
      H5Dset_extent(images.get(), new_dims);
      Handle fspace(H5Dget_space(images.get()), H5Sclose);
      const hsize_t start[4] = {written, 0, 0, 0};
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, chunk, nullptr);
      Handle mspace(H5Screate_simple(4, chunk, nullptr), H5Sclose);
      if (H5Dwrite(images.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT,
                   pixels.data() + k * image_bytes) < 0)
        throw Error("HDF5: writing image " + std::to_string(written) + " to " + tmp_path + " failed (disk full?)");
      labels.push_back(e.label);
      sources.push_back(e.relative);
      ++written;
    }
    progress(opts.progress, split_name(split), begin + n, scan.entries.size());
  }
  if (written == 0) throw UsageError(data_dir + ": no usable image in the " + std::string(split_name(split)) + " split");
  const hsize_t ldims[1] = {labels.size()};
  Handle lspace(H5Screate_simple(1, ldims, nullptr), H5Sclose);
  Handle lds(H5Dcreate2(group.get(), "labels", H5T_NATIVE_INT32, lspace.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (!lds.ok() || H5Dwrite(lds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0)
    throw Error("HDF5: cannot write labels");
  write_strings(group.get(), "sources", sources);
  stats.images[static_cast<int>(split)] = written;
  stats.skipped += scan.skipped;
}

}  // namespace

PackStats pack_dataset(const std::string& data_dir, const std::string& out_path, const PackOptions& opts) {
  if (opts.image_size < 8 || opts.image_size > 4096)
    throw UsageError("--image-size " + std::to_string(opts.image_size) + ": expected 8..4096");
  if (opts.compress_level < 0 || opts.compress_level > 9)
    throw UsageError("--compress " + std::to_string(opts.compress_level) + ": expected 0..9");
  // Scan every split first so that bad input fails before anything is written.
  ScanOptions scan_opts = opts.scan;
  if (!opts.scan.strict) scan_opts.verify = ScanOptions::Verify::Header;  // pack decodes anyway
  std::vector<std::pair<Split, FolderScan>> splits;
  for (Split s : {Split::Train, Split::Validation, Split::Test}) {
    if (s == Split::Test && !has_split(data_dir, s, scan_opts.folders)) continue;
    splits.emplace_back(s, scan_folder_split(data_dir, s, scan_opts));
  }

  const std::string tmp_path = out_path + ".partial";
  PackStats stats;
  try {
    std::unique_lock<std::mutex> lock(hdf5_mutex());
    QuietHdf5 quiet;
    Handle file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) throw UsageError("--out " + out_path + ": cannot create " + tmp_path);
    write_attr_string(file.get(), "format", kPackFormatName);
    write_attr_int(file.get(), "format_version", kPackFormatVersion);
    write_attr_int(file.get(), "image_size", opts.image_size);
    write_strings(file.get(), "class_names", splits.front().second.class_names);

    for (const auto& [split, scan] : splits) pack_split(file.get(), split, scan, opts, data_dir, tmp_path, lock, stats);
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw Error("HDF5: flushing " + tmp_path + " failed");
  } catch (...) {
    std::remove(tmp_path.c_str());
    throw;
  }
  if (std::rename(tmp_path.c_str(), out_path.c_str()) != 0) {
    std::remove(tmp_path.c_str());
    throw Error("--out " + out_path + ": cannot rename " + tmp_path + " (" + std::strerror(errno) + ")");
  }
  return stats;
}

}  // namespace rd::data
