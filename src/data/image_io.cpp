// Image file decoding: JPEG with libjpeg-turbo as PIL does it (jpeg_io.cpp), TIFF and
// WebP with libtiff / libwebp (tiff_webp_io.cpp), the other formats with stb_image
// (Debian libstb-dev). This is the one translation
// unit that compiles the stb_image implementation; it is static so that it cannot
// clash with another copy linked into the same program.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_NO_JPEG      // never stb's JPEG decoder: its pixels differ from PIL's
#define STBI_NO_HDR       // 8-bit training images only
#define STBI_NO_LINEAR
#define STBI_NO_PSD
#define STBI_NO_PIC
#include <stb/stb_image.h>

#include <algorithm>
#include <cctype>
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
  // torchvision's IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp), and
  // what stb reads besides.
  static const char* const kExtensions[] = {".jpg", ".jpeg", ".png", ".bmp", ".tga", ".gif",
                                            ".ppm", ".pgm", ".tif", ".tiff", ".webp"};
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

// Binary PNM (P5 gray, P6 RGB) is decoded here, not by stb: Debian's stb 2.27
// reads past its buffer converting 16-bit PNM to RGB (stbi__convert_16_to_8 on an
// 8-bit-sized buffer), overflows int on long numbers in the header, and returns
// uninitialised pixels for truncated data. Semantics are stb's: samples are taken
// as stored (no maxval scaling), 16-bit samples are big-endian and keep the high byte.
bool is_binary_pnm(const uint8_t* b, size_t n) { return n >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6'); }

struct PnmHeader {
  ImageHeader h;
  int bytes_per_sample = 1;
  size_t data_offset = 0;
};

// Parses "P5|P6 <ws/comments> W <ws> H <ws> MAXVAL <one ws>"; empty message when fine.
std::string parse_pnm_header(const uint8_t* b, size_t n, PnmHeader& out) {
  size_t i = 2;
  auto skip = [&] {
    while (i < n) {
      if (std::isspace(b[i])) {
        ++i;
      } else if (b[i] == '#') {
        while (i < n && b[i] != '\n' && b[i] != '\r') ++i;
      } else {
        break;
      }
    }
  };
  auto number = [&](int64_t& v) {
    skip();
    if (i >= n || !std::isdigit(b[i])) return false;
    v = 0;
    while (i < n && std::isdigit(b[i])) {
      v = v * 10 + (b[i++] - '0');
      if (v > (1 << 24)) return false;  // far beyond any limit below; stops overflow
    }
    return true;
  };
  int64_t w = 0, h = 0, maxval = 0;
  if (!number(w) || !number(h) || !number(maxval)) return "malformed PNM header";
  if (i >= n || !std::isspace(b[i])) return "malformed PNM header (no whitespace after maxval)";
  ++i;
  if (w <= 0 || h <= 0 || w > (1 << 24) || h > (1 << 24)) return "invalid PNM dimensions";
  if (maxval <= 0 || maxval > 65535) return "PNM maxval " + std::to_string(maxval) + " outside 1..65535";
  out.h.width = static_cast<int>(w);
  out.h.height = static_cast<int>(h);
  out.h.channels = b[1] == '5' ? 1 : 3;
  out.bytes_per_sample = maxval > 255 ? 2 : 1;
  out.data_offset = i;
  return "";
}

PnmHeader pnm_header(const uint8_t* bytes, size_t size, const std::string& what) {
  PnmHeader p;
  const std::string err = parse_pnm_header(bytes, size, p);
  if (!err.empty()) throw Error(what + ": not a decodable image (" + err + ")");
  return p;
}

}  // namespace

void check_dimensions(const ImageHeader& h, const std::string& what, int64_t max_pixels) {
  if (h.width <= 0 || h.height <= 0)
    throw Error(what + ": invalid image dimensions " + std::to_string(h.width) + "x" +
                std::to_string(h.height));
  const int64_t pixels = static_cast<int64_t>(h.width) * h.height;
  if (pixels > max_pixels)
    throw Error(what + ": image is " + std::to_string(h.width) + "x" + std::to_string(h.height) +
                " = " + std::to_string(pixels) + " pixels, above the limit of " +
                std::to_string(max_pixels) + " (decompression-bomb guard)");
}

namespace {
void decode_pnm(const uint8_t* bytes, size_t size, const std::string& what, Image& out, int64_t max_pixels) {
  const PnmHeader p = pnm_header(bytes, size, what);
  check_dimensions(p.h, what, max_pixels);
  const size_t samples = static_cast<size_t>(p.h.width) * p.h.height * p.h.channels;
  const size_t need = samples * p.bytes_per_sample;
  if (size - p.data_offset < need)
    throw Error(what + ": truncated PNM (" + std::to_string(size - p.data_offset) + " of " +
                std::to_string(need) + " pixel bytes)");
  out.resize(p.h.width, p.h.height);
  const uint8_t* src = bytes + p.data_offset;
  uint8_t* dst = out.data();
  const size_t pixels = static_cast<size_t>(p.h.width) * p.h.height;
  for (size_t px = 0; px < pixels; ++px)
    for (int c = 0; c < 3; ++c) {
      const size_t s = px * p.h.channels + (p.h.channels == 1 ? 0 : c);
      dst[px * 3 + c] = src[s * p.bytes_per_sample];  // high byte when 16-bit
    }
}
// stb_image grows its IDAT buffer to the length a chunk claims before reading it, so
// a 100-byte PNG claiming a 3 GB chunk allocates gigabytes (found by fuzz_image).
// Every chunk must fit in the bytes that are there; PIL refuses such a file as well.
bool is_png(const uint8_t* b, size_t n) { return n >= 8 && std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0; }

std::string printable(std::string s) {
  for (char& c : s)
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  return s;
}

void check_png_chunks(const uint8_t* b, size_t n, const std::string& what) {
  size_t i = 8;
  while (i + 8 <= n) {
    const uint32_t length = (uint32_t{b[i]} << 24) | (uint32_t{b[i + 1]} << 16) | (uint32_t{b[i + 2]} << 8) | b[i + 3];
    const std::string type(reinterpret_cast<const char*>(b + i + 4), 4);
    const size_t remaining = n - i - 8;  // after the length and type fields
    if (length > remaining || remaining - length < 4)  // data, then a 4-byte CRC
      throw Error(what + ": truncated PNG (chunk '" + printable(type) + "' claims " + std::to_string(length) +
                  " bytes, " + std::to_string(remaining) + " remain)");
    if (type == "IEND") return;
    i += 12 + static_cast<size_t>(length);
  }
  // Bytes after the last whole chunk: stb refuses the file itself (no IEND).
}

}  // namespace

ImageHeader probe_image_memory(const uint8_t* bytes, size_t size, const std::string& what,
                               int64_t max_pixels) {
  if (size == 0) throw Error(what + ": empty file (0 bytes)");
  if (size > static_cast<size_t>(INT32_MAX)) throw Error(what + ": file larger than 2 GiB");
  ImageHeader h;
  if (is_binary_pnm(bytes, size)) {
    h = pnm_header(bytes, size, what).h;
  } else if (is_jpeg(bytes, size)) {
    h = probe_jpeg_memory(bytes, size, what);
  } else if (is_tiff(bytes, size)) {
    h = probe_tiff_memory(bytes, size, what, max_pixels);
  } else if (is_webp(bytes, size)) {
    h = probe_webp_memory(bytes, size, what);
  } else if (!stbi_info_from_memory(bytes, static_cast<int>(size), &h.width, &h.height, &h.channels)) {
    throw Error(what + ": not a decodable image (" + stbi_failure_reason() + ")");
  }
  check_dimensions(h, what, max_pixels);
  return h;
}

void decode_image_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out,
                         int64_t max_pixels, int jpeg_draft) {
  if (size == 0) throw Error(what + ": empty file (0 bytes)");
  if (size > static_cast<size_t>(INT32_MAX)) throw Error(what + ": file larger than 2 GiB");
  if (is_binary_pnm(bytes, size)) return decode_pnm(bytes, size, what, out, max_pixels);
  if (is_jpeg(bytes, size)) return decode_jpeg_memory(bytes, size, what, out, max_pixels, jpeg_draft);
  if (is_tiff(bytes, size)) return decode_tiff_memory(bytes, size, what, out, max_pixels);
  if (is_webp(bytes, size)) return decode_webp_memory(bytes, size, what, out, max_pixels);
  const ImageHeader h = probe_image_memory(bytes, size, what, max_pixels);
  if (is_png(bytes, size)) check_png_chunks(bytes, size, what);
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

void decode_image_file(const std::string& path, Image& out, int64_t max_pixels, int jpeg_draft) {
  thread_local std::vector<uint8_t> bytes;
  read_file_bytes(path, bytes);
  decode_image_memory(bytes.data(), bytes.size(), path, out, max_pixels, jpeg_draft);
}

ImageHeader probe_image_file(const std::string& path, int64_t max_pixels) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(path + ": cannot access (" + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  if (st.st_size == 0) throw Error(path + ": empty file (0 bytes)");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  // Headers sit in the first few KiB for every supported format; stb and libjpeg
  // read the file as needed.
  ImageHeader h;
  unsigned char magic[12] = {};
  const size_t got = std::fread(magic, 1, sizeof magic, f.get());
  std::rewind(f.get());
  if (is_tiff(magic, got) || is_webp(magic, got)) {
    // A TIFF's directory may sit anywhere in the file: read it whole (WebP's header is
    // at the start, but the file is small next to the decode that follows anyway).
    f.reset();
    std::vector<uint8_t> bytes;
    read_file_bytes(path, bytes);
    return probe_image_memory(bytes.data(), bytes.size(), path, max_pixels);
  }
  if (is_binary_pnm(magic, got)) {
    // Our own PNM parser (see decode_pnm); a header longer than 4 KiB is not a sane PNM.
    std::vector<uint8_t> head(4096);
    head.resize(std::fread(head.data(), 1, head.size(), f.get()));
    h = pnm_header(head.data(), head.size(), path).h;
  } else if (is_jpeg(magic, got)) {
    h = probe_jpeg_file(f.get(), path);
  } else if (!stbi_info_from_file(f.get(), &h.width, &h.height, &h.channels)) {
    throw Error(path + ": not a decodable image (" + stbi_failure_reason() + ")");
  }
  check_dimensions(h, path, max_pixels);
  return h;
}

}  // namespace rd::data
