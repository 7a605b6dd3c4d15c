// HDF5 packed datasets: the reader used by open_dataset (the writer behind
// `resnet_ddp pack` is pack_writer.cpp). The HDF5 library build is not thread-safe,
// so every HDF5 call runs under one process-wide mutex (hdf5_mutex). Uncompressed images are instead read with
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

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

namespace {

using Handle = h5::Id;
using QuietHdf5 = h5::Quiet;

bool read_attr_int(hid_t obj, const char* name, int32_t& value) {
  return h5::read_attr(obj, name, H5T_NATIVE_INT32, value) == h5::Status::Ok;
}
bool read_attr_string(hid_t obj, const char* name, std::string& value) {
  return h5::read_attr(obj, name, value) == h5::Status::Ok;
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

}  // namespace rd::data
