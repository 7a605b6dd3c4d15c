// Fuzz target: the packed-dataset reader (open_packed_dataset, load,
// packed_has_split). A real packed file is made once with `resnet_ddp pack`'s
// writer; each input is a list of structural edits (h5_edit.h) applied to a copy:
// attributes retyped or removed, labels / sources / images replaced by datasets
// of other shapes, types, chunking and filters. The reader must refuse with
// rd::Error or read every sample within bounds.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "data/internal.h"
#include "h5_edit.h"
#include "scratch_dir.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/pack.h"
#include "resnet_ddp/errors.h"

namespace fs = std::filesystem;
using namespace rd::data;

namespace {

struct Fixture {
  rd::fuzz::ScratchDir scratch{"rd_fuzz_packed"};  // first: the members below write into it
  const std::string dir = scratch.path;
  std::string seed_path, work_path;
  std::vector<char> seed;
  rd::fuzz::H5Names names;
  Fixture() {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    // Two classes, two splits, 8x8 binary PPMs (written by hand: no encoder needed).
    for (const char* split : {"Train", "Validation"})
      for (int c = 0; c < 2; ++c) {
        const fs::path cls = fs::path(dir) / "images" / split / ("class" + std::to_string(c));
        fs::create_directories(cls);
        for (int i = 0; i < 2; ++i) {
          std::ofstream out(cls / ("img" + std::to_string(i) + ".ppm"), std::ios::binary);
          out << "P6\n8 8\n255\n";
          for (int p = 0; p < 8 * 8 * 3; ++p) out.put(static_cast<char>((p * 7 + c * 50 + i) & 255));
        }
      }
    seed_path = dir + "/seed.h5";
    PackOptions opts;
    opts.image_size = 8;
    opts.threads = 1;
    pack_dataset(dir + "/images", seed_path, opts);
    seed = rd::fuzz::slurp(seed_path);
    names = rd::fuzz::list_names(seed_path);
    work_path = dir + "/work.h5";
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fx;
  FuzzedDataProvider fdp(data, size);
  rd::fuzz::spit(fx.work_path, fx.seed);
  rd::fuzz::apply_edits(fdp, fx.work_path, fx.names);
  for (Split split : {Split::Train, Split::Validation}) {
    try {
      (void)has_split(fx.work_path, split);
      auto ds = open_dataset(fx.work_path, split, ScanOptions{});
      Image img;
      for (size_t i = 0; i < ds->size(); ++i) {
        ds->load(i, img);
        (void)ds->label(i);
        (void)ds->source(i);
      }
      (void)ds->description();
      (void)describe_counts(*ds, split);
    } catch (const rd::Error&) {
    }
  }
  return 0;
}
