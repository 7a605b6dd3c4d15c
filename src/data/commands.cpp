// `resnet_ddp synth` and `resnet_ddp pack`: flag parsing and the synthetic
// dataset generator.
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb/stb_image_write.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>

#include "data/internal.h"
#include "resnet_ddp/data/commands.h"
#include "resnet_ddp/data/pack.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

namespace fs = std::filesystem;

namespace rd::data {

namespace {

int run_command(const char* name, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::cerr << "resnet_ddp " << name << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "resnet_ddp " << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

// ---- synthetic images ---------------------------------------------------------------

enum class Shape { Disk, Square, Triangle, Ring, Cross, Ell };
constexpr int kShapes = 6;

bool inside(Shape s, double u, double v) {
  const double r2 = u * u + v * v;
  switch (s) {
    case Shape::Disk: return r2 <= 1.0;
    case Shape::Square: return std::fabs(u) <= 0.75 && std::fabs(v) <= 0.75;
    case Shape::Triangle: return v >= -0.5 && v <= 1.0 - 1.7320508 * std::fabs(u);
    case Shape::Ring: return r2 <= 1.0 && r2 >= 0.45;
    case Shape::Cross:
      return (std::fabs(u) <= 0.28 && std::fabs(v) <= 1.0) || (std::fabs(v) <= 0.28 && std::fabs(u) <= 1.0);
    case Shape::Ell:
      return (u >= -0.8 && u <= -0.3 && std::fabs(v) <= 0.8) || (v >= 0.3 && v <= 0.8 && std::fabs(u) <= 0.8);
  }
  return false;
}

// Class k: shape k % 6 drawn (k / 6 + 1) times, at random place, size, rotation and
// colour, over a noisy two-colour gradient with random clutter strokes. Colours and
// positions carry no class information; only the shape (and count) does.
void render(int klass, int w, int h, SampleRng& rng, std::vector<uint8_t>& px) {
  px.resize(static_cast<size_t>(w) * h * 3);
  double c0[3], c1[3];
  for (int c = 0; c < 3; ++c) {
    c0[c] = rng.uniform() * 255.0;
    c1[c] = rng.uniform() * 255.0;
  }
  const double gangle = rng.uniform() * 6.283185307;
  const double gx = std::cos(gangle), gy = std::sin(gangle);
  const double noise = 8.0 + rng.uniform() * 24.0;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const double t = 0.5 + 0.5 * ((x / double(w) - 0.5) * gx + (y / double(h) - 0.5) * gy);
      for (int c = 0; c < 3; ++c) {
        const double v = c0[c] + (c1[c] - c0[c]) * t + (rng.uniform() - 0.5) * 2.0 * noise;
        px[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  auto paint = [&](int x, int y, const double* col, double alpha) {
    if (x < 0 || y < 0 || x >= w || y >= h) return;
    uint8_t* p = &px[(static_cast<size_t>(y) * w + x) * 3];
    for (int c = 0; c < 3; ++c) p[c] = static_cast<uint8_t>(p[c] + (col[c] - p[c]) * alpha);
  };
  // Clutter: short random strokes of random colours.
  const int strokes = 3 + static_cast<int>(rng.below(6));
  for (int s = 0; s < strokes; ++s) {
    double col[3] = {rng.uniform() * 255, rng.uniform() * 255, rng.uniform() * 255};
    double x = rng.uniform() * w, y = rng.uniform() * h;
    const double a = rng.uniform() * 6.283185307;
    const int len = static_cast<int>((0.1 + 0.3 * rng.uniform()) * std::min(w, h));
    for (int i = 0; i < len; ++i, x += std::cos(a), y += std::sin(a))
      for (int d = -1; d <= 1; ++d) paint(static_cast<int>(x) + d, static_cast<int>(y), col, 0.8);
  }
  const Shape shape = static_cast<Shape>(klass % kShapes);
  const int copies = klass / kShapes + 1;
  for (int k = 0; k < copies; ++k) {
    const double r = (0.14 + 0.16 * rng.uniform()) * std::min(w, h) / std::sqrt(double(copies));
    const double cx = r + rng.uniform() * (w - 2 * r), cy = r + rng.uniform() * (h - 2 * r);
    const double rot = rng.uniform() * 6.283185307, cr = std::cos(rot), sr = std::sin(rot);
    double col[3];
    for (int c = 0; c < 3; ++c) {  // keep the object visible against the background
      const double bg = (c0[c] + c1[c]) / 2;
      col[c] = bg < 128 ? 140 + rng.uniform() * 115 : rng.uniform() * 115;
    }
    const double alpha = 0.7 + 0.3 * rng.uniform();
    for (int y = static_cast<int>(cy - r) - 1; y <= static_cast<int>(cy + r) + 1; ++y)
      for (int x = static_cast<int>(cx - r) - 1; x <= static_cast<int>(cx + r) + 1; ++x) {
        const double dx = (x + 0.5 - cx) / r, dy = (y + 0.5 - cy) / r;
        if (inside(shape, cr * dx + sr * dy, -sr * dx + cr * dy)) paint(x, y, col, alpha);
      }
  }
}

void write_image(const std::string& path, int w, int h, const std::vector<uint8_t>& px, bool png) {
  const int ok = png ? stbi_write_png(path.c_str(), w, h, 3, px.data(), w * 3)
                     : stbi_write_jpg(path.c_str(), w, h, 3, px.data(), 92);
  if (!ok) throw Error(path + ": cannot write image");
}

const char* kSynthHelp =
    "usage: resnet_ddp synth --out DIR [flags]\n"
    "Writes a procedurally generated ImageFolder tree (DIR/Train/<class>, DIR/Validation/<class>;\n"
    "other folder names with --train-split / --val-split).\n"
    "Each class is a shape family (disk, square, triangle, ring, cross, L; more classes repeat\n"
    "shapes in pairs, triples, ...) at random place, size, rotation and colour over noisy\n"
    "gradients with clutter: learnable, but not from colour statistics.\n\nFlags:\n";

// Parses argv[1..] with `fs`; true when --help printed `usage` and the flag table.
bool parse_or_help(FlagSet& fs, int argc, char** argv, const char* usage, std::vector<std::string>* given = nullptr) {
  bool help = false;
  fs.parse(std::vector<std::string>(argv + 1, argv + argc), false, &help, given);
  if (help) std::cout << usage << fs.help() << "  --help                      this text\n";
  return help;
}

}  // namespace

int synth_main(int argc, char** argv) {
  return run_command("synth", [&] {
    std::string out, format = "jpg", class_names, size;
    int64_t n_train = 1322, n_val = 363, classes = 3, seed = 0;
    int threads = 0;
    FlagSet f("synth");
    f.path("--out", &out, "DIR", "output directory (created; must not contain Train/ or Validation/)");
    f.integer("--train", &n_train, 1, "training images", 100000000);
    f.integer("--val", &n_val, 1, "validation images", 100000000);
    f.integer("--classes", &classes, 2, "number of classes, named C0..C<K-1> (unset: C0 C2 C4)", 10000);
    f.text("--class-names", &class_names, "A,B", "explicit class names (overrides --classes)");
    f.text("--size", &size, "WxH", "image size [default: 256x256]");
    f.integer("--seed", &seed, 0, "random seed", LONG_MAX);
    f.choice("--format", &format, {"jpg", "png"}, "file format");
    f.integer("--threads", &threads, 0, "generator threads (0 = all cores)", 1024);
    SplitFolders folders;
    f.text("--train-split", &folders.train, "NAME", "folder of the training images (train: ImageNet-style)");
    f.text("--val-split", &folders.validation, "NAME", "folder of the validation images (val: ImageNet-style)");
    std::vector<std::string> given;
    if (parse_or_help(f, argc, argv, kSynthHelp, &given)) return 0;
    if (out.empty()) throw UsageError("--out DIR is required (see --help)");
    check_split_folder("--train-split", folders.train);
    check_split_folder("--val-split", folders.validation);
    if (folders.train == folders.validation)
      throw UsageError("--val-split " + folders.validation + ": the same folder as --train-split");
    std::vector<std::string> names;
    if (!class_names.empty()) {
      std::stringstream ss(class_names);
      for (std::string n; std::getline(ss, n, ',');) {
        if (n.empty() || n.find('/') != std::string::npos || n == "." || n == "..")
          throw UsageError("--class-names: invalid class name '" + n + "'");
        names.push_back(n);
      }
    } else if (std::find(given.begin(), given.end(), "--classes") != given.end()) {
      for (int64_t i = 0; i < classes; ++i) names.push_back(std::string("C").append(std::to_string(i)));
    } else {
      names = {"C0", "C2", "C4"};
    }
    if (names.size() < 2) throw UsageError("--class-names: need at least 2 classes");
    int w = 256, h = 256;
    if (!size.empty()) {
      const std::string& s = size;
      char x = 0, extra = 0;
      if (std::sscanf(s.c_str(), "%d%c%d%c", &w, &x, &h, &extra) != 3 || (x != 'x' && x != 'X') ||
          w < 8 || h < 8 || w > 8192 || h > 8192)
        throw UsageError("--size " + s + ": expected WxH with 8 <= W, H <= 8192");
    }
    for (const std::string& split : {folders.train, folders.validation})
      if (fs::exists(out + "/" + split))
        throw UsageError("--out " + out + ": already contains " + split + "/ (choose an empty directory)");
    struct Job {
      std::string path;
      int klass;
      int64_t key;
    };
    std::vector<Job> jobs;
    const std::string ext = format == "png" ? ".png" : ".jpg";
    int64_t key = 0;
    for (const auto& [split, count] :
         {std::pair<std::string, int64_t>{folders.train, n_train}, {folders.validation, n_val}}) {
      for (size_t k = 0; k < names.size(); ++k) fs::create_directories(out + "/" + split + "/" + names[k]);
      for (int64_t i = 0; i < count; ++i) {
        const int klass = static_cast<int>(i % static_cast<int64_t>(names.size()));
        char file[64];
        std::snprintf(file, sizeof file, "%s_%06lld", split == folders.train ? "train" : "val",
                      static_cast<long long>(i));
        jobs.push_back({out + "/" + split + "/" + names[static_cast<size_t>(klass)] + "/" + file + ext, klass, key++});
      }
    }
    parallel_for(jobs.size(), threads, [&](size_t i) {
      thread_local std::vector<uint8_t> px;
      SampleRng rng(static_cast<uint64_t>(seed), -1, jobs[i].key);
      render(jobs[i].klass, w, h, rng, px);
      write_image(jobs[i].path, w, h, px, format == "png");
    });
    std::cout << "synth: wrote " << n_train << " train + " << n_val << " validation images (" << w << "x" << h
              << " " << format << ", " << names.size() << " classes) to " << out << "\n";
    return 0;
  });
}

namespace {
const char* kPackHelp =
    "usage: resnet_ddp pack --data DIR --out FILE.h5 [flags]\n"
    "Decodes and resizes every image of an ImageFolder tree once into one HDF5 file\n"
    "(per split: uint8 images N x S x S x 3 chunked per image, int32 labels, source names).\n\nFlags:\n";
}

int pack_main(int argc, char** argv) {
  return run_command("pack", [&] {
    PackOptions opts;
    std::string data, out;
    FlagSet f("pack");
    f.path("--data", &data, "DIR", "ImageFolder root (DIR/Train/<class>/*, DIR/Validation/<class>/*, optional DIR/Test)");
    f.path("--out", &out, "FILE.h5", "output file (written to FILE.h5.partial, renamed when complete)");
    f.integer("--image-size", &opts.image_size, 8, "stored side length after Resize((S, S))", 4096);
    f.integer("--compress", &opts.compress_level, 0, "deflate level 0-9 (0: fastest to read)", 9);
    f.boolean("--strict-data", &opts.scan.strict, "any unusable image is an error instead of a skipped file");
    f.integer("--max-pixels", &opts.scan.max_pixels, 1, "reject images above N pixels", LONG_MAX);
    f.integer("--threads", &opts.threads, 0, "decode threads (0 = all cores)", 1024);
    f.text("--train-split", &opts.scan.folders.train, "NAME",
           "folder of the training split under --data (train: ImageNet-style); stored as Train");
    f.text("--val-split", &opts.scan.folders.validation, "NAME",
           "folder of the validation split under --data (val: ImageNet-style); stored as Validation");
    bool draft = false;
    f.boolean("--jpeg-draft", &draft,
              "decode JPEGs scaled down by 1/2-1/8 in the DCT domain to >= the image size (faster; "
              "pixels differ from PIL's full decode + Resize)");
    if (parse_or_help(f, argc, argv, kPackHelp)) return 0;
    if (draft) opts.scan.jpeg_draft = opts.image_size;
    if (data.empty()) throw UsageError("--data DIR is required (see --help)");
    check_split_folder("--train-split", opts.scan.folders.train);
    check_split_folder("--val-split", opts.scan.folders.validation);
    if (opts.scan.folders.train == opts.scan.folders.validation)
      throw UsageError("--val-split " + opts.scan.folders.validation + ": the same folder as --train-split");
    if (out.empty()) throw UsageError("--out FILE.h5 is required (see --help)");
    opts.scan.log = [](const std::string& line) { std::cerr << line << "\n"; };
    opts.progress = ::isatty(2) != 0;
    if (fs::is_directory(out)) throw UsageError("--out " + out + ": is a directory");
    const PackStats st = pack_dataset(data, out, opts);
    std::cout << "pack: " << out << ": Train " << st.images[0] << ", Validation " << st.images[1]
              << ", Test " << st.images[2] << " images at " << opts.image_size << "x" << opts.image_size
              << " (" << st.skipped << " skipped)\n";
    return 0;
  });
}

}  // namespace rd::data
