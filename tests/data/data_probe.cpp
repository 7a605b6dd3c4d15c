// Test helper driven by check_vs_torchvision.py: applies this project's
// transforms to PNG files so the script can compare with torchvision. One
// command per stdin line:
//   op <Name> <magnitude> <in.png> <out.png> [bilinear]   one AutoAugment op
//   hflip <in.png> <out.png>                    F.hflip
//   resized_crop <top> <left> <h> <w> <size> <in.png> <out.png>   F.resized_crop
//   eval_preset <R> <C> <in.png> <out.png>      Resize(R) + CenterCrop(C)
//   center_crop <C> <in.png> <out.png>          CenterCrop(C)
//   wide_magnitude <Name> <bin>                 TrivialAugmentWide's table
//   ra_magnitude <Name> <bin> <W> <H>           RandAugment's table
//   rrc_boxes <W> <H> <count> <seed>            RandomResizedCrop boxes of samples 0..count-1
//   erase_boxes <W> <H> <p> <count> <seed>      RandomErasing boxes (h 0 = none)
//   ta_draws <count> <seed> / ra_draws <magnitude> <count> <seed>   op bin negative triples
//   train_preset <N> <hflip_p> <imagenet|ta_wide|ra|none> <ra_mag> <seed> <index> <in> <out>
//       the whole training preset; prints its decisions: box, flip, then the policy's choices
//   resize <W> <H> <in.png> <out.png>           Resize((H, W))
//   magnitude <Name> <bin> <W> <H>              prints the signed-off magnitude
//   randperm <n> <seed>                         prints torch_randperm
//   sampler <n> <world> <rank> <shuffle> <seed> <epoch> <drop_last>
//   decode <in> <out.ppm> [<jpeg_draft>]        our decoder, written as binary PPM
//   jpeg_encode <space> <HxV> <quality> <progressive> <arith> <restart_rows>
//               <w> <h> <in.raw> <out.jpg>      libjpeg encoder, for the JPEG kinds
//       PIL cannot write: space ycc|rgb|gray|cmyk|ycck|cmyk-noadobe, HxV the first
//       component's sampling factors (1x2 = 4:4:0, 4x1 = 4:1:1); in.raw holds
//       w*h*components bytes (3 for ycc/rgb, 1 gray, 4 for the CMYK kinds)
// Replies one line per command ("ok", numbers, or "error: ...").
#include <stb/stb_image_write.h>

#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which uses FILE
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <jpeglib.h>

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
void print_box(const CropBox& b) { std::cout << b.top << ' ' << b.left << ' ' << b.height << ' ' << b.width << ' '; }
void print_choice(const AugChoice& c) { std::cout << aug_op_name(c.op) << ' ' << c.bin << ' ' << c.negative << ' '; }
TransformConfig::Policy policy_by_name(const std::string& name) {
  if (name == "imagenet") return TransformConfig::Policy::ImageNet;
  if (name == "ta_wide") return TransformConfig::Policy::TrivialAugmentWide;
  if (name == "ra") return TransformConfig::Policy::RandAugment;
  if (name == "none") return TransformConfig::Policy::None;
  throw std::runtime_error("unknown policy " + name);
}
void save(const std::string& path, const Image& img) {
  if (!stbi_write_png(path.c_str(), img.width, img.height, 3, img.data(), img.width * 3))
    throw std::runtime_error("cannot write " + path);
}
void save_ppm(const std::string& path, const Image& img) {
  std::ofstream f(path, std::ios::binary);
  f << "P6\n" << img.width << " " << img.height << "\n255\n";
  f.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.bytes()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

struct EncodeError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
};

// Runs body(); false when libjpeg reported an error (it longjmps here).
template <class F>
bool guarded(EncodeError& err, F&& body) {
  if (setjmp(err.jump)) return false;
  body();
  return true;
}

// Writes a JPEG with libjpeg's encoder.
bool encode_jpeg(const std::string& space, int hs, int vs, int quality, int progressive, int arith,
                 int restart_rows, int w, int h, const std::vector<uint8_t>& px, FILE* out) {
  const bool four = space == "cmyk" || space == "ycck" || space == "cmyk-noadobe";
  const int comps = space == "gray" ? 1 : four ? 4 : 3;
  if (w <= 0 || h <= 0 || px.size() != static_cast<size_t>(w) * static_cast<size_t>(h) * comps) return false;
  jpeg_compress_struct c{};
  EncodeError err{};
  c.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = [](j_common_ptr ci) {
    (*ci->err->output_message)(ci);
    std::longjmp(reinterpret_cast<EncodeError*>(ci->err)->jump, 1);
  };
  const bool ok = guarded(err, [&] {
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, out);
    c.image_width = static_cast<JDIMENSION>(w);
    c.image_height = static_cast<JDIMENSION>(h);
    c.input_components = comps;
    c.in_color_space = space == "gray" ? JCS_GRAYSCALE : four ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&c);
    if (space == "rgb") jpeg_set_colorspace(&c, JCS_RGB);    // Adobe marker, transform 0
    if (space == "ycck") jpeg_set_colorspace(&c, JCS_YCCK);  // Adobe marker, transform 2
    if (space == "cmyk-noadobe") c.write_Adobe_marker = FALSE;
    jpeg_set_quality(&c, quality, TRUE);
    c.comp_info[0].h_samp_factor = hs;
    c.comp_info[0].v_samp_factor = vs;
    if (progressive) jpeg_simple_progression(&c);
    c.arith_code = arith ? TRUE : FALSE;
    c.restart_in_rows = restart_rows;
    jpeg_start_compress(&c, TRUE);
    const size_t stride = static_cast<size_t>(w) * static_cast<size_t>(comps);
    while (c.next_scanline < c.image_height) {
      JSAMPROW row = const_cast<uint8_t*>(px.data()) + c.next_scanline * stride;
      jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
  });
  jpeg_destroy_compress(&c);
  return ok;
}
// The decisions train_preset's pipeline takes for sample `index`, replayed from the
// same stream in torchvision's order, so the script can apply them with torchvision.
void print_preset_decisions(const Image& img, const TransformConfig& tc, uint64_t seed, int64_t index) {
  SampleRng rng(seed, 0, index);
  print_box(random_resized_crop_box(img.width, img.height, rng));
  std::cout << (tc.hflip_prob > 0.0 && rng.uniform() < tc.hflip_prob) << ' ';
  switch (tc.auto_augment) {
    case TransformConfig::Policy::TrivialAugmentWide: print_choice(draw_trivial_augment(rng)); break;
    case TransformConfig::Policy::RandAugment:
      for (int i = 0; i < kRandAugmentNumOps; ++i) print_choice(draw_rand_augment_op(rng, tc.ra_magnitude));
      break;
    case TransformConfig::Policy::ImageNet: {
      const int64_t sub = rng.below(25);
      const double p0 = rng.uniform(), p1 = rng.uniform();
      const int64_t s0 = rng.below(2), s1 = rng.below(2);
      std::cout.precision(17);
      std::cout << sub << ' ' << p0 << ' ' << p1 << ' ' << s0 << ' ' << s1;
      break;
    }
    case TransformConfig::Policy::None: break;
  }
}

// The reference presets' commands; false for a command it does not know.
bool preset_command(const std::string& cmd, std::istringstream& in, Image& img, Image& out, Image& scratch) {
  std::string src, dst;
  if (cmd == "hflip") {
    in >> src >> dst;
    decode_image_file(src, img);
    hflip(img);
    save(dst, img);
  } else if (cmd == "resized_crop") {
    CropBox b;
    int size = 0;
    in >> b.top >> b.left >> b.height >> b.width >> size >> src >> dst;
    decode_image_file(src, img);
    out.resize(size, size);
    resized_crop(img, b, size, out.data(), scratch);
    save(dst, out);
  } else if (cmd == "eval_preset" || cmd == "center_crop") {
    TransformConfig tc;
    if (cmd == "eval_preset") in >> tc.val_resize_size;
    in >> tc.val_crop_size >> src >> dst;
    decode_image_file(src, img);
    out.resize(tc.val_crop_size, tc.val_crop_size);
    if (cmd == "center_crop") {
      center_crop(img, tc.val_crop_size, out.data());
    } else {
      TransformScratch ts;
      TransformPipeline(tc, false).apply(img, 0, 0, 0, out.data(), ts);
    }
    save(dst, out);
  } else if (cmd == "wide_magnitude" || cmd == "ra_magnitude") {
    std::string name;
    int bin = 0, w = 0, h = 0;
    in >> name >> bin >> w >> h;
    std::cout.precision(12);
    std::cout << (cmd == "wide_magnitude" ? trivial_wide_magnitude(op_by_name(name), bin)
                                          : rand_augment_magnitude(op_by_name(name), bin, w, h));
  } else if (cmd == "rrc_boxes" || cmd == "erase_boxes") {
    int w = 0, h = 0, count = 0;
    double p = 0;
    uint64_t seed = 0;
    in >> w >> h;
    if (cmd == "erase_boxes") in >> p;
    in >> count >> seed;
    for (int i = 0; i < count; ++i) {
      SampleRng rng(seed, 0, i);
      print_box(cmd == "rrc_boxes" ? random_resized_crop_box(w, h, rng) : random_erasing_box(w, h, p, rng));
    }
  } else if (cmd == "ta_draws" || cmd == "ra_draws") {
    int magnitude = 0, count = 0;
    uint64_t seed = 0;
    if (cmd == "ra_draws") in >> magnitude;
    in >> count >> seed;
    for (int i = 0; i < count; ++i) {
      SampleRng rng(seed, 0, i);
      print_choice(cmd == "ta_draws" ? draw_trivial_augment(rng) : draw_rand_augment_op(rng, magnitude));
    }
  } else if (cmd == "train_preset") {
    TransformConfig tc;
    std::string policy;
    uint64_t seed = 0;
    int64_t index = 0;
    in >> tc.train_crop_size >> tc.hflip_prob >> policy >> tc.ra_magnitude >> seed >> index >> src >> dst;
    tc.auto_augment = policy_by_name(policy);
    decode_image_file(src, img);
    print_preset_decisions(img, tc, seed, index);
    TransformScratch ts;
    out.resize(tc.train_crop_size, tc.train_crop_size);
    TransformPipeline(tc, true).apply(img, seed, 0, index, out.data(), ts);
    save(dst, out);
  } else {
    return false;
  }
  std::cout << (cmd == "hflip" || cmd == "resized_crop" || cmd == "eval_preset" || cmd == "center_crop" ? "ok" : "")
            << "\n";
  return true;
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
      if (preset_command(cmd, in, img, out, scratch)) {
      } else if (cmd == "op") {
        std::string name, src, dst, interpolation;
        float m = 0;
        in >> name >> m >> src >> dst >> interpolation;
        decode_image_file(src, img);
        apply_aug_op(op_by_name(name), m, img, scratch,
                     interpolation == "bilinear" ? Interpolation::Bilinear : Interpolation::Nearest);
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
        std::cout.precision(12);
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
      } else if (cmd == "decode") {
        std::string src, dst;
        int draft = 0;
        in >> src >> dst;
        if (!(in >> draft)) draft = 0;
        decode_image_file(src, img, 64LL * 1000 * 1000, draft);
        save_ppm(dst, img);
        std::cout << "ok " << img.width << " " << img.height << "\n";
      } else if (cmd == "jpeg_encode") {
        std::string space, samp, src, dst;
        int quality = 0, progressive = 0, arith = 0, restart = 0, w = 0, h = 0;
        in >> space >> samp >> quality >> progressive >> arith >> restart >> w >> h >> src >> dst;
        int hs = 1, vs = 1;
        if (std::sscanf(samp.c_str(), "%dx%d", &hs, &vs) != 2) throw std::runtime_error("bad HxV " + samp);
        std::ifstream f(src, std::ios::binary);
        const std::vector<uint8_t> px((std::istreambuf_iterator<char>(f)), {});
        std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(dst.c_str(), "wb"), &std::fclose);
        if (!out) throw std::runtime_error("cannot write " + dst);
        if (!encode_jpeg(space, hs, vs, quality, progressive, arith, restart, w, h, px, out.get()))
          throw std::runtime_error("libjpeg could not encode " + dst);
        std::cout << "ok\n";
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
