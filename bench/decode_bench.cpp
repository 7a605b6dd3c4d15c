// Image decoding throughput on one thread (not a test): file read + decode to RGB
// through decode_image_file, the loader's path, for every image under --data;
// best of --passes passes. Compare with PIL through bench/pil_decode_bench.py on
// the same files (docs/data.md, "Decoding throughput").
//   decode_bench --data DIR [--passes 5] [--jpeg-draft S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::string data;
  int passes = 5, draft = 0;
  try {
    rd::FlagSet f("", "decode_bench");
    f.path("--data", &data, "DIR", "folder of images (searched recursively)");
    f.integer("--passes", &passes, 1, "timed passes over all files (the best is reported)", 1000);
    f.integer("--jpeg-draft", &draft, 0, "DCT-domain JPEG downscaling to >= S (0 = full decode)", 65535);
    f.parse_or_help(argc, argv, "Usage: decode_bench --data DIR [flags]\n\nFlags:\n");
    if (data.empty()) throw rd::UsageError("--data DIR is required");
  } catch (const rd::UsageError& e) {
    std::cerr << "decode_bench: " << e.what() << "\n";
    return 2;
  }
  try {
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(data))
      if (e.is_regular_file() && rd::data::has_image_extension(e.path().filename().string()))
        files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw rd::Error(data + ": no image files");
    rd::data::Image img;
    double pixels = 0;
    for (const auto& p : files) {  // warm-up: page cache, buffers
      rd::data::decode_image_file(p, img, 64LL * 1000 * 1000, draft);
      pixels += static_cast<double>(img.width) * img.height;
    }
    double best = 1e30;
    for (int r = 0; r < passes; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& p : files) rd::data::decode_image_file(p, img, 64LL * 1000 * 1000, draft);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double n = static_cast<double>(files.size());
    std::printf("decode_bench: %zu files, 1 thread, best of %d passes: %.1f img/s, %.1f Mpx/s (output)\n",
                files.size(), passes, n / best, pixels / best / 1e6);
    std::printf("RESULT_JSON {\"files\": %zu, \"img_per_s\": %.3f, \"mpx_per_s\": %.3f}\n", files.size(), n / best,
                pixels / best / 1e6);
  } catch (const std::exception& e) {
    std::cerr << "decode_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
