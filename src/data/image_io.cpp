// Image file decoding with stb_image (Debian libstb-dev). This is the one
// translation unit that compiles the stb_image implementation; it is static so
// that it cannot clash with another copy linked into the same program.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_NO_HDR       // 8-bit training images only
#define STBI_NO_LINEAR
#define STBI_NO_PSD
#define STBI_NO_PIC
#include <stb/stb_image.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <sys/stat.h>

#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/errors.h"
#include "data/internal.h"

namespace rd::data {

bool has_image_extension(const std::string& filename) {
  static const char* const kExtensions[] = {".jpg", ".jpeg", ".png", ".bmp",
                                            ".tga", ".gif", ".ppm", ".pgm"};
  const size_t dot = filename.find_last_of('.');
  if (dot == std::string::npos) return false;
  std::string ext = filename.substr(dot);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* e : kExtensions)
    if (ext == e) return true;
  return false;
}

void read_file_bytes(const std::string& path, std::vector<uint8_t>& out) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(path + ": cannot access (" + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) throw Error(path + ": empty file (0 bytes)");
  out.resize(size);
  const size_t got = std::fread(out.data(), 1, size, f.get());
  if (got != size) throw Error(path + ": read failed after " + std::to_string(got) + " of " +
                               std::to_string(size) + " bytes");
}

namespace {
struct StbFree {
  void operator()(stbi_uc* p) const { stbi_image_free(p); }
};
}  // namespace

ImageHeader probe_image_memory(const uint8_t* bytes, size_t size, const std::string& what,
                               int64_t max_pixels) {
  if (size == 0) throw Error(what + ": empty file (0 bytes)");
  if (size > static_cast<size_t>(INT32_MAX)) throw Error(what + ": file larger than 2 GiB");
  ImageHeader h;
  if (!stbi_info_from_memory(bytes, static_cast<int>(size), &h.width, &h.height, &h.channels))
    throw Error(what + ": not a decodable image (" + stbi_failure_reason() + ")");
  if (h.width <= 0 || h.height <= 0)
    throw Error(what + ": invalid image dimensions " + std::to_string(h.width) + "x" +
                std::to_string(h.height));
  const int64_t pixels = static_cast<int64_t>(h.width) * h.height;
  if (pixels > max_pixels)
    throw Error(what + ": image is " + std::to_string(h.width) + "x" + std::to_string(h.height) +
                " = " + std::to_string(pixels) + " pixels, above the limit of " +
                std::to_string(max_pixels) + " (decompression-bomb guard)");
  return h;
}

void decode_image_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out,
                         int64_t max_pixels) {
  const ImageHeader h = probe_image_memory(bytes, size, what, max_pixels);
  int w = 0, hh = 0, channels = 0;
  // Always 3 channels: stb expands gray / drops alpha / reduces 16-bit PNG to 8 bits,
  // matching PIL's convert("RGB") that torchvision's ImageFolder loader applies.
  std::unique_ptr<stbi_uc, StbFree> px(
      stbi_load_from_memory(bytes, static_cast<int>(size), &w, &hh, &channels, 3));
  if (!px) throw Error(what + ": decoding failed (" + stbi_failure_reason() + ")");
  if (w != h.width || hh != h.height)
    throw Error(what + ": decoded size differs from its header");
  out.resize(w, hh);
  std::memcpy(out.data(), px.get(), out.bytes());
}

void decode_image_file(const std::string& path, Image& out, int64_t max_pixels) {
  thread_local std::vector<uint8_t> bytes;
  read_file_bytes(path, bytes);
  decode_image_memory(bytes.data(), bytes.size(), path, out, max_pixels);
}

}  // namespace rd::data

namespace rd::data {

ImageHeader probe_image_file(const std::string& path, int64_t max_pixels) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(path + ": cannot access (" + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  if (st.st_size == 0) throw Error(path + ": empty file (0 bytes)");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  // Headers sit in the first few KiB for every supported format; stb reads as needed.
  ImageHeader h;
  if (!stbi_info_from_file(f.get(), &h.width, &h.height, &h.channels))
    throw Error(path + ": not a decodable image (" + stbi_failure_reason() + ")");
  const int64_t pixels = static_cast<int64_t>(h.width) * h.height;
  if (h.width <= 0 || h.height <= 0) throw Error(path + ": invalid image dimensions");
  if (pixels > max_pixels)
    throw Error(path + ": image is " + std::to_string(h.width) + "x" + std::to_string(h.height) +
                " = " + std::to_string(pixels) + " pixels, above the limit of " +
                std::to_string(max_pixels) + " (decompression-bomb guard)");
  return h;
}

}  // namespace rd::data
