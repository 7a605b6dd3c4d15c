// Helpers shared by the data component's translation units (not a public API).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "resnet_ddp/data/dataset.h"

namespace rd::data {

// The HDF5 library build is not thread-safe: every HDF5 call of the pack reader and
// writer holds this one process-wide mutex (packed.cpp).
std::mutex& hdf5_mutex();

struct ImageHeader {
  int width = 0, height = 0, channels = 0;
};

// Whole file into `out`; throws rd::Error naming the path (missing, unreadable, empty).
void read_file_bytes(const std::string& path, std::vector<uint8_t>& out);
// Header only: format recognised, dimensions within `max_pixels`.
ImageHeader probe_image_memory(const uint8_t* bytes, size_t size, const std::string& what,
                               int64_t max_pixels);

ImageHeader probe_image_file(const std::string& path, int64_t max_pixels);
// Throws rd::Error naming `what` for non-positive sizes or more than max_pixels.
void check_dimensions(const ImageHeader& h, const std::string& what, int64_t max_pixels);

// JPEG through libjpeg-turbo with Pillow's settings (jpeg_io.cpp); errors name `what`.
bool is_jpeg(const uint8_t* bytes, size_t size);  // starts FF D8 FF, as PIL requires
ImageHeader probe_jpeg_memory(const uint8_t* bytes, size_t size, const std::string& what);
ImageHeader probe_jpeg_file(std::FILE* f, const std::string& what);  // reads from f's position
// draft_size > 0: DCT-domain downscale like PIL's draft("RGB", (n, n)), see dataset.h.
void decode_jpeg_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out,
                        int64_t max_pixels, int draft_size);

// TIFF (libtiff) and WebP (libwebp) as PIL decodes them (tiff_webp_io.cpp); errors name `what`.
bool is_tiff(const uint8_t* bytes, size_t size);  // II*\0 or MM\0* (or BigTIFF)
bool is_webp(const uint8_t* bytes, size_t size);  // RIFF....WEBP
ImageHeader probe_tiff_memory(const uint8_t* bytes, size_t size, const std::string& what, int64_t max_pixels);
ImageHeader probe_webp_memory(const uint8_t* bytes, size_t size, const std::string& what);
void decode_tiff_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out, int64_t max_pixels);
void decode_webp_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out, int64_t max_pixels);
// Built without libtiff / libwebp (CMakeLists.txt): "TIFF" or "WebP" for a file name
// with that format's extension, else "". format_not_built: what the error then says.
std::string unsupported_image_format(const std::string& filename);
std::string format_not_built(const std::string& format);

// Runs fn(i) for i in [0, n) on `threads` threads (0 = hardware concurrency).
// The first exception is rethrown after all threads finish.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn);
int resolve_threads(int threads);

// One image of a scanned ImageFolder split.
struct FolderEntry {
  std::string path;      // full path
  std::string relative;  // <class>/<file>, recorded in packed files
  int32_t label = 0;
};

struct FolderScan {
  std::vector<std::string> class_names;
  std::vector<FolderEntry> entries;
  size_t skipped = 0;  // unusable files
  size_t ignored = 0;  // unknown extensions
  std::map<std::string, size_t> ignored_by_extension;  // ".txt" -> count ("" = none)
};

bool packed_has_split(const std::string& path, Split split);

// Scans DIR/<split>/<class>/... with the checks described in dataset.h.
FolderScan scan_folder_split(const std::string& root, Split split, const ScanOptions& opts);

}  // namespace rd::data
