// HDF5 packed datasets (`resnet_ddp pack`). Layout, format version 1:
//   /                      attributes: format = "resnet_ddp-packed-dataset",
//                          format_version = 1 (int32), image_size = S (int32)
//   /class_names           variable-length strings, K (sorted Train folder names)
//   /<Split>/images        uint8 [N, S, S, 3], chunked one image per chunk,
//                          optionally deflate-compressed
//   /<Split>/labels        int32 [N]
//   /<Split>/sources       variable-length strings [N], path relative to the data dir
// for each split present in the directory (Train, Validation, optional Test).
// Images are stored after Resize((S, S)); training applies augmentation to the stored
// pixels, so AutoAugment then runs on S x S images instead of the originals.
#pragma once

#include <cstdint>
#include <string>

#include "resnet_ddp/data/dataset.h"

namespace rd::data {

constexpr const char* kPackFormatName = "resnet_ddp-packed-dataset";
constexpr int kPackFormatVersion = 1;

struct PackOptions {
  int image_size = 244;
  int compress_level = 0;  // 0 = no compression (fastest to read), 1..9 = deflate
  int threads = 0;         // decode/resize threads (0 = hardware concurrency)
  bool progress = false;   // progress bar on stderr
  ScanOptions scan;
};

struct PackStats {
  size_t images[3] = {0, 0, 0};  // per Split
  size_t skipped = 0;
};

// Packs the ImageFolder tree at `data_dir` into `out_path`. Throws rd::UsageError on
// bad input, rd::Error on I/O failure (a partial output file is removed).
PackStats pack_dataset(const std::string& data_dir, const std::string& out_path,
                       const PackOptions& opts);

// Opens one split of a packed file (used by open_dataset); errors name `flag` and the path.
std::unique_ptr<Dataset> open_packed_dataset(const std::string& path, Split split, const std::string& flag = "--data");

}  // namespace rd::data
