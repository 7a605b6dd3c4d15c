// Test helper driven by check_vs_torchvision.py: applies this project's
// transforms to PNG files so the script can compare with torchvision. One
// command per stdin line:
//   op <Name> <magnitude> <in.png> <out.png>    one AutoAugment op
//   resize <W> <H> <in.png> <out.png>           Resize((H, W))
//   magnitude <Name> <bin> <W> <H>              prints the signed-off magnitude
//   randperm <n> <seed>                         prints torch_randperm
//   sampler <n> <world> <rank> <shuffle> <seed> <epoch> <drop_last>
// Replies one line per command ("ok", numbers, or "error: ...").
#include <stb/stb_image_write.h>

#include <iostream>
#include <sstream>
#include <string>

#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/data/transforms.h"

using namespace rd::data;

namespace {
AugOp op_by_name(const std::string& name) {
  for (int i = 0; i < kAugOpCount; ++i)
    if (name == aug_op_name(static_cast<AugOp>(i))) return static_cast<AugOp>(i);
  throw std::runtime_error("unknown op " + name);
}
void save(const std::string& path, const Image& img) {
  if (!stbi_write_png(path.c_str(), img.width, img.height, 3, img.data(), img.width * 3))
    throw std::runtime_error("cannot write " + path);
}
}  // namespace

int main() {
  std::string line;
  Image img, out, scratch;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    try {
      if (cmd == "op") {
        std::string name, src, dst;
        float m = 0;
        in >> name >> m >> src >> dst;
        decode_image_file(src, img);
        apply_aug_op(op_by_name(name), m, img, scratch);
        save(dst, img);
        std::cout << "ok\n";
      } else if (cmd == "resize") {
        int w = 0, h = 0;
        std::string src, dst;
        in >> w >> h >> src >> dst;
        decode_image_file(src, img);
        resize_bilinear(img, w, h, out);
        save(dst, out);
        std::cout << "ok\n";
      } else if (cmd == "magnitude") {
        std::string name;
        int bin = 0, w = 0, h = 0;
        in >> name >> bin >> w >> h;
        std::cout.precision(9);
        std::cout << aug_magnitude(op_by_name(name), bin, w, h) << "\n";
      } else if (cmd == "randperm") {
        size_t n = 0;
        uint64_t seed = 0;
        in >> n >> seed;
        for (int64_t v : torch_randperm(n, seed)) std::cout << v << ' ';
        std::cout << "\n";
      } else if (cmd == "sampler") {
        size_t n = 0;
        int world = 1, rank = 0, shuffle = 1, drop = 0;
        uint64_t seed = 0;
        int64_t epoch = 0;
        in >> n >> world >> rank >> shuffle >> seed >> epoch >> drop;
        DistributedSampler s(n, world, rank, shuffle != 0, seed, drop != 0);
        s.set_epoch(epoch);
        for (int64_t v : s.indices()) std::cout << v << ' ';
        std::cout << "\n";
      } else if (!cmd.empty()) {
        std::cout << "error: unknown command " << cmd << "\n";
      }
    } catch (const std::exception& e) {
      std::cout << "error: " << e.what() << "\n";
    }
    std::cout.flush();
  }
  return 0;
}
