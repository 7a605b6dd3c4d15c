// Test helper driven by check_vs_torchvision.py: applies this project's
// transforms to PNG files so the script can compare with torchvision. One
// command per stdin line:
//   op <Name> <magnitude> <in.png> <out.png>    one AutoAugment op
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
