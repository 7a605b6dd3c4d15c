// Loader throughput (not a test): img/s and img/s per worker core for a JPEG
// ImageFolder and for its packed .h5, with AutoAugment + Resize(S), optionally
// side by side with torchvision's ImageFolder + DataLoader (same transforms and
// worker count) through bench/torchvision_loader_bench.py.
//   loader_bench [--data DIR] [--workers W] [--images N] [--image-size S]
//                [--batch-size B] [--torchvision]
// Without --data a synthetic JPEG set (synth, 256x256) is generated in /tmp.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>

#include "resnet_ddp/data/commands.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/data/pack.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

using namespace rd::data;
namespace fs = std::filesystem;

namespace {
double measure(const Dataset& ds, const TransformPipeline& tf, int workers, int batch, size_t images) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.seed = 1;
  DistributedSampler s(ds.size(), 1, 0, true, 0);
  std::vector<int64_t> idx;
  while (idx.size() < images) {
    s.set_epoch(static_cast<int64_t>(idx.size()));
    for (auto i : s.indices()) idx.push_back(i);
  }
  idx.resize(images);
  Loader loader(ds, tf, o, idx, 0);
  Batch b;
  const auto t0 = std::chrono::steady_clock::now();
  size_t n = 0;
  while (loader.next(b)) n += static_cast<size_t>(b.n);
  return static_cast<double>(n) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::string data;
  int workers = 1, size = 244, batch = 32;
  int64_t images = 256;
  bool torchvision = false;
  bool generated = false;
  try {
    rd::FlagSet fs("", "loader_bench");
    fs.path("--data", &data, "DIR", "ImageFolder root [default: a generated synthetic set]");
    fs.integer("--workers", &workers, 1, "loader threads", 4096);
    fs.integer("--images", &images, 1, "images per measurement", std::numeric_limits<int64_t>::max());
    fs.integer("--image-size", &size, 8, "Resize target", 4096);
    fs.integer("--batch-size", &batch, 1, "images per batch", 65536);
    fs.boolean("--torchvision", &torchvision, "also time torchvision's loader on the same files");
    fs.parse_or_help(argc, argv, "Usage: loader_bench [flags]\n\nFlags:\n");
  } catch (const rd::UsageError& e) {
    std::cerr << "loader_bench: " << e.what() << "\n";
    return 2;
  }
  try {
    if (data.empty()) {
      data = "/tmp/rd_loader_bench_" + std::to_string(::getpid());
      std::string o = "--out", t = "--train", tn = "600", v = "--val", vn = "50", s = "--size", sv = "256x256", nm = "synth";
      char* args[] = {nm.data(), o.data(), data.data(), t.data(), tn.data(), v.data(), vn.data(), s.data(), sv.data()};
      if (synth_main(9, args) != 0) return 1;
      generated = true;
    }
    const std::string h5 = data + (data.back() == '/' ? "bench.h5" : ".bench.h5");
    PackOptions po;
    po.image_size = size;
    pack_dataset(data, h5, po);
    TransformPipeline tf({size, TransformConfig::Augment::AutoAugment}, true);
    ScanOptions so;
    so.verify = ScanOptions::Verify::Header;
    auto folder = open_dataset(data, Split::Train, so);
    auto packed = open_dataset(h5, Split::Train);
    measure(*folder, tf, workers, batch, std::min<size_t>(images, 64));  // warm the page cache
    const double jpeg = measure(*folder, tf, workers, batch, images);
    const double h5rate = measure(*packed, tf, workers, batch, images);
    std::printf("resnet_ddp loader, AutoAugment + Resize(%d), %d worker(s), %zu images\n", size, workers, static_cast<size_t>(images));
    std::printf("  ImageFolder (%s): %8.1f img/s  %8.1f img/s per core\n", data.c_str(), jpeg, jpeg / workers);
    std::printf("  HDF5 packed      : %8.1f img/s  %8.1f img/s per core\n", h5rate, h5rate / workers);
    double tv_rate = 0;
    if (torchvision) {
      const std::string script = std::string(RD_BENCH_DIR) + "/torchvision_loader_bench.py";
      const std::string cmd = "/usr/bin/python3 " + script + " --data " + data + " --workers " +
                              std::to_string(workers) + " --images " + std::to_string(images) +
                              " --image-size " + std::to_string(size) + " --batch-size " + std::to_string(batch);
      FILE* p = ::popen(cmd.c_str(), "r");
      double tv = 0;
      char line[512];
      while (p && std::fgets(line, sizeof line, p))
        if (std::sscanf(line, "IMG_PER_S %lf", &tv) != 1) std::fputs(line, stdout);
      if (p) ::pclose(p);
      tv_rate = tv;
      if (tv > 0) {
        std::printf("  torchvision      : %8.1f img/s  %8.1f img/s per core\n", tv, tv / workers);
        std::printf("  ratio vs torchvision: JPEG %.2fx, .h5 %.2fx (targets >= 2x, >= 10x)\n", jpeg / tv, h5rate / tv);
      } else {
        std::printf("  torchvision: not measured (python3-torchvision missing?)\n");
      }
    }
    // Machine-readable summary for bench/run_bench.sh (torchvision 0 = not measured).
    std::printf("RESULT_JSON {\"workers\": %d, \"images\": %zu, \"image_size\": %d, \"batch\": %d, "
                "\"jpeg_img_per_s\": %.3f, \"h5_img_per_s\": %.3f, \"torchvision_img_per_s\": %.3f}\n",
                workers, static_cast<size_t>(images), size, batch, jpeg, h5rate, tv_rate);
    std::remove(h5.c_str());
    if (generated) fs::remove_all(data);
  } catch (const std::exception& e) {
    std::cerr << "loader_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
