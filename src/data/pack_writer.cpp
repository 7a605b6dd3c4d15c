// The writer behind `resnet_ddp pack`: an ImageFolder tree, scanned and validated
// first, decoded and resized in parallel, written to a .partial file renamed at the
// end. Every HDF5 call holds hdf5_mutex (packed.cpp), as the reader's do.
#include <hdf5.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "data/internal.h"
#include "resnet_ddp/data/pack.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/h5.h"

namespace rd::data {

namespace {

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

void write_strings(hid_t parent, const char* name, const std::vector<std::string>& values) {
  if (!h5::write_strings(parent, name, values)) throw Error(std::string("HDF5: cannot write dataset ") + name);
}

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
