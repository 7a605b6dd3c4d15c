// TIFF (libtiff) and WebP (libwebp) decoding with the pixels of PIL's
// Image.open(path).convert("RGB"), the loader of torchvision's ImageFolder, which
// accepts .tif, .tiff and .webp. Every variant that is decoded is compared with PIL in
// tests/data/check_tiff_webp_vs_pil.py; the others are refused with the reason (a
// skipped file, or an error under --strict-data), never guessed. A build without libtiff
// or libwebp (RESNET_DDP_HAVE_TIFF / _WEBP unset: CMakeLists.txt) refuses those files,
// saying how to rebuild.
#ifdef RESNET_DDP_HAVE_TIFF
#include <tiffio.h>
#endif
#ifdef RESNET_DDP_HAVE_WEBP
#include <webp/decode.h>
#endif

#include <cctype>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data/internal.h"
#include "resnet_ddp/errors.h"

namespace rd::data {

bool is_tiff(const uint8_t* b, size_t n) {
  return n >= 4 && ((b[0] == 'I' && b[1] == 'I' && (b[2] == 42 || b[2] == 43) && b[3] == 0) ||
                    (b[0] == 'M' && b[1] == 'M' && b[2] == 0 && (b[3] == 42 || b[3] == 43)));
}

bool is_webp(const uint8_t* b, size_t n) {
  return n >= 12 && std::memcmp(b, "RIFF", 4) == 0 && std::memcmp(b + 8, "WEBP", 4) == 0;
}

namespace {

#ifdef RESNET_DDP_HAVE_TIFF
// ---- TIFF -------------------------------------------------------------------------

// libtiff reads through these from the bytes in memory; its messages are collected per
// handle (TIFFOpenOptions, libtiff >= 4.5), so threads do not share a global handler.
struct MemFile {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  std::string error;
};

tmsize_t mem_read(thandle_t h, void* buf, tmsize_t n) {
  auto* m = static_cast<MemFile*>(h);
  if (n <= 0 || m->pos >= m->size) return 0;
  const size_t k = std::min(static_cast<size_t>(n), m->size - m->pos);
  std::memcpy(buf, m->data + m->pos, k);
  m->pos += k;
  return static_cast<tmsize_t>(k);
}
tmsize_t mem_write(thandle_t, void*, tmsize_t) { return 0; }
toff_t mem_seek(thandle_t h, toff_t off, int whence) {
  auto* m = static_cast<MemFile*>(h);
  const uint64_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->size;
  const uint64_t to = base + off;  // toff_t is unsigned: a negative offset wraps past size
  if (to > m->size) return static_cast<toff_t>(-1);
  m->pos = static_cast<size_t>(to);
  return to;
}
int mem_close(thandle_t) { return 0; }
toff_t mem_size(thandle_t h) { return static_cast<MemFile*>(h)->size; }
int mem_map(thandle_t, void**, toff_t*) { return 0; }
void mem_unmap(thandle_t, void*, toff_t) {}

int on_error(TIFF*, void* user, const char*, const char* fmt, va_list ap) {
  auto* m = static_cast<MemFile*>(user);
  if (m->error.empty()) {
    char buf[512];
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    m->error = buf;
  }
  return 1;  // handled: nothing on stderr
}
int on_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

struct TiffClose {
  void operator()(TIFF* t) const { TIFFClose(t); }
};

// The open file and what decoding needs, checked to be a variant decoded like PIL.
struct Tiff {
  MemFile mem;
  std::unique_ptr<TIFF, TiffClose> tif;
  uint32_t width = 0, height = 0;
  uint16_t bps = 1, spp = 1, photometric = 0, planar = PLANARCONFIG_CONTIG;
};

void open_tiff(const uint8_t* bytes, size_t size, const std::string& what, int64_t max_pixels, Tiff& t) {
  t.mem.data = bytes;
  t.mem.size = size;
  std::unique_ptr<TIFFOpenOptions, void (*)(TIFFOpenOptions*)> opts(TIFFOpenOptionsAlloc(), TIFFOpenOptionsFree);
  TIFFOpenOptionsSetErrorHandlerExtR(opts.get(), on_error, &t.mem);
  TIFFOpenOptionsSetWarningHandlerExtR(opts.get(), on_warning, &t.mem);
  // A decompression bomb fails in libtiff's allocation instead of filling memory.
  TIFFOpenOptionsSetMaxSingleMemAlloc(opts.get(), static_cast<tmsize_t>(max_pixels) * 8 + (1 << 20));
  t.tif.reset(TIFFClientOpenExt(what.c_str(), "rm", &t.mem, mem_read, mem_write, mem_seek, mem_close, mem_size,
                                mem_map, mem_unmap, opts.get()));
  auto fail = [&](const std::string& why) {
    throw Error(what + ": not a decodable TIFF (" + (t.mem.error.empty() ? why : t.mem.error) + ")");
  };
  if (!t.tif) fail("cannot read its header");
  TIFF* tif = t.tif.get();
  if (!TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &t.width) || !TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &t.height))
    fail("no image size");
  TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &t.bps);
  TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &t.spp);
  TIFFGetFieldDefaulted(tif, TIFFTAG_PLANARCONFIG, &t.planar);
  if (!TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &t.photometric)) fail("no PhotometricInterpretation tag");
  ImageHeader h;
  h.width = t.width > static_cast<uint32_t>(INT32_MAX) ? -1 : static_cast<int>(t.width);
  h.height = t.height > static_cast<uint32_t>(INT32_MAX) ? -1 : static_cast<int>(t.height);
  h.channels = 3;
  check_dimensions(h, what, max_pixels);
  // The variants below are the ones compared with PIL; anything else is named.
  const auto unsupported = [&](const std::string& why) {
    throw Error(what + ": unsupported TIFF variant (" + why + "; photometric " + std::to_string(t.photometric) + ", " +
                std::to_string(t.bps) + " bit(s) x " + std::to_string(t.spp) + " sample(s))");
  };
  if (t.planar != PLANARCONFIG_CONTIG) unsupported("separate colour planes");
  uint16_t extra_count = 0;
  uint16_t* extra = nullptr;
  TIFFGetField(tif, TIFFTAG_EXTRASAMPLES, &extra_count, &extra);
  if (extra_count > 0 && extra && extra[0] == EXTRASAMPLE_ASSOCALPHA) unsupported("premultiplied alpha");
  switch (t.photometric) {
    case PHOTOMETRIC_MINISBLACK:
    case PHOTOMETRIC_MINISWHITE:
      if (!((t.bps == 8 && (t.spp == 1 || t.spp == 2)) || (t.bps == 1 && t.spp == 1))) unsupported("grey levels");
      if (t.bps == 1 && TIFFIsTiled(tif)) unsupported("tiled bilevel");
      break;
    case PHOTOMETRIC_RGB:
      if (t.bps != 8 || (t.spp != 3 && t.spp != 4)) unsupported("RGB samples");
      break;
    case PHOTOMETRIC_PALETTE:
      if (t.bps != 8 || t.spp != 1) unsupported("palette indices");
      break;
    default:
      unsupported("colour space");
  }
}

// The raw samples, row after row (scanline bytes each), from strips or tiles.
std::vector<uint8_t> read_raster(Tiff& t, const std::string& what, size_t row_bytes) {
  TIFF* tif = t.tif.get();
  std::vector<uint8_t> raster(row_bytes * t.height);
  auto fail = [&](const std::string& why) {
    throw Error(what + ": TIFF data cannot be decoded (" + (t.mem.error.empty() ? why : t.mem.error) + ")");
  };
  if (!TIFFIsTiled(tif)) {
    uint32_t rows_per_strip = t.height;
    TIFFGetFieldDefaulted(tif, TIFFTAG_ROWSPERSTRIP, &rows_per_strip);
    if (rows_per_strip == 0) rows_per_strip = t.height;
    const tmsize_t strip_size = TIFFStripSize(tif);
    if (strip_size <= 0) fail("no strip size");
    std::vector<uint8_t> strip(static_cast<size_t>(strip_size));
    for (uint32_t row = 0; row < t.height; row += rows_per_strip) {
      const uint32_t rows = std::min(rows_per_strip, t.height - row);
      const tmsize_t got = TIFFReadEncodedStrip(tif, TIFFComputeStrip(tif, row, 0), strip.data(), strip_size);
      if (got < static_cast<tmsize_t>(rows * row_bytes)) fail("a strip is short or corrupt");
      std::memcpy(raster.data() + row * row_bytes, strip.data(), rows * row_bytes);
    }
    return raster;
  }
  uint32_t tw = 0, th = 0;
  TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tw);
  TIFFGetField(tif, TIFFTAG_TILELENGTH, &th);
  if (tw == 0 || th == 0) fail("no tile size");
  const tmsize_t tile_size = TIFFTileSize(tif);
  if (tile_size <= 0) fail("no tile size");
  // Tiles need not fit the image: a 100-byte file may claim 65536 x 65536 tiles.
  if (tw > 4 * static_cast<uint64_t>(t.width) + 256 || th > 4 * static_cast<uint64_t>(t.height) + 256)
    fail("tiles of " + std::to_string(tw) + "x" + std::to_string(th) + " for a " + std::to_string(t.width) + "x" +
         std::to_string(t.height) + " image");
  const size_t pixel_bytes = row_bytes / t.width;  // 8-bit samples only (bilevel tiles refused)
  const size_t tile_row = static_cast<size_t>(tw) * pixel_bytes;
  std::vector<uint8_t> tile(static_cast<size_t>(tile_size));
  for (uint32_t y = 0; y < t.height; y += th)
    for (uint32_t x = 0; x < t.width; x += tw) {
      if (TIFFReadTile(tif, tile.data(), x, y, 0, 0) < tile_size) fail("a tile is short or corrupt");
      const uint32_t rows = std::min(th, t.height - y), cols = std::min(tw, t.width - x);
      for (uint32_t r = 0; r < rows; ++r)
        std::memcpy(raster.data() + (y + r) * row_bytes + x * pixel_bytes, tile.data() + r * tile_row,
                    cols * pixel_bytes);
    }
  return raster;
}

void decode_tiff(const uint8_t* bytes, size_t size, const std::string& what, Image& out, int64_t max_pixels) {
  Tiff t;
  open_tiff(bytes, size, what, max_pixels, t);
  const size_t row_bytes = t.bps == 1 ? (t.width + 7) / 8 : static_cast<size_t>(t.width) * t.spp;
  if (static_cast<size_t>(TIFFScanlineSize64(t.tif.get())) != row_bytes)
    throw Error(what + ": unsupported TIFF variant (unexpected scanline size)");
  const std::vector<uint8_t> raster = read_raster(t, what, row_bytes);
  out.resize(static_cast<int>(t.width), static_cast<int>(t.height));
  uint8_t* dst = out.data();
  const bool invert = t.photometric == PHOTOMETRIC_MINISWHITE;
  uint16_t *red = nullptr, *green = nullptr, *blue = nullptr;
  if (t.photometric == PHOTOMETRIC_PALETTE && !TIFFGetField(t.tif.get(), TIFFTAG_COLORMAP, &red, &green, &blue))
    throw Error(what + ": not a decodable TIFF (palette image without a colour map)");
  for (uint32_t y = 0; y < t.height; ++y) {
    const uint8_t* row = raster.data() + y * row_bytes;
    for (uint32_t x = 0; x < t.width; ++x, dst += 3) {
      if (t.bps == 1) {  // PIL's "1" mode: set bits are white (black when MinIsWhite)
        const bool bit = (row[x / 8] >> (7 - x % 8)) & 1;
        dst[0] = dst[1] = dst[2] = (bit != invert) ? 255 : 0;
      } else if (t.photometric == PHOTOMETRIC_PALETTE) {
        // PIL keeps the high byte of each 16-bit colour map entry.
        const uint8_t i = row[x];
        dst[0] = static_cast<uint8_t>(red[i] >> 8);
        dst[1] = static_cast<uint8_t>(green[i] >> 8);
        dst[2] = static_cast<uint8_t>(blue[i] >> 8);
      } else if (t.photometric == PHOTOMETRIC_RGB) {  // alpha, if any, is dropped as convert("RGB") does
        std::memcpy(dst, row + x * t.spp, 3);
      } else {
        const uint8_t g = row[x * t.spp];
        dst[0] = dst[1] = dst[2] = invert ? static_cast<uint8_t>(255 - g) : g;
      }
    }
  }
}

#endif  // RESNET_DDP_HAVE_TIFF

#ifdef RESNET_DDP_HAVE_WEBP
// ---- WebP -------------------------------------------------------------------------

ImageHeader webp_header(const uint8_t* bytes, size_t size, const std::string& what, WebPBitstreamFeatures& f) {
  const VP8StatusCode st = WebPGetFeatures(bytes, size, &f);
  if (st != VP8_STATUS_OK)
    throw Error(what + ": not a decodable WebP (" +
                (st == VP8_STATUS_NOT_ENOUGH_DATA ? std::string("truncated") : "status " + std::to_string(st)) + ")");
  if (f.has_animation) throw Error(what + ": unsupported WebP variant (animation)");
  ImageHeader h;
  h.width = f.width;
  h.height = f.height;
  h.channels = f.has_alpha ? 4 : 3;
  return h;
}

void decode_webp(const uint8_t* bytes, size_t size, const std::string& what, Image& out, int64_t max_pixels) {
  WebPBitstreamFeatures f{};
  const ImageHeader h = webp_header(bytes, size, what, f);
  check_dimensions(h, what, max_pixels);
  // PIL decodes to RGBA (straight alpha) and convert("RGB") drops the alpha; decoding
  // to RGB directly gives the same colour samples.
  out.resize(h.width, h.height);
  if (!WebPDecodeRGBInto(bytes, size, out.data(), out.bytes(), h.width * 3))
    throw Error(what + ": WebP data cannot be decoded (truncated or corrupt)");
}
#endif  // RESNET_DDP_HAVE_WEBP

}  // namespace

#ifdef RESNET_DDP_HAVE_TIFF
ImageHeader probe_tiff_memory(const uint8_t* bytes, size_t size, const std::string& what, int64_t max_pixels) {
  Tiff t;
  open_tiff(bytes, size, what, max_pixels, t);
  ImageHeader h;
  h.width = static_cast<int>(t.width);
  h.height = static_cast<int>(t.height);
  h.channels = 3;
  return h;
}

void decode_tiff_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out, int64_t max_pixels) {
  decode_tiff(bytes, size, what, out, max_pixels);
}
#else
ImageHeader probe_tiff_memory(const uint8_t*, size_t, const std::string& what, int64_t) {
  throw Error(what + ": a TIFF image: " + format_not_built("TIFF"));
}
void decode_tiff_memory(const uint8_t*, size_t, const std::string& what, Image&, int64_t) {
  throw Error(what + ": a TIFF image: " + format_not_built("TIFF"));
}
#endif

#ifdef RESNET_DDP_HAVE_WEBP
ImageHeader probe_webp_memory(const uint8_t* bytes, size_t size, const std::string& what) {
  WebPBitstreamFeatures f{};
  return webp_header(bytes, size, what, f);
}

void decode_webp_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out, int64_t max_pixels) {
  decode_webp(bytes, size, what, out, max_pixels);
}
#else
ImageHeader probe_webp_memory(const uint8_t*, size_t, const std::string& what) {
  throw Error(what + ": a WebP image: " + format_not_built("WebP"));
}
void decode_webp_memory(const uint8_t*, size_t, const std::string& what, Image&, int64_t) {
  throw Error(what + ": a WebP image: " + format_not_built("WebP"));
}
#endif

std::string format_not_built(const std::string& format) {
  const std::string library = format == "TIFF" ? "libtiff >= 4.5" : "libwebp";
  return "this build of resnet_ddp has no " + format + " support: rebuild with " + library +
         " found (docs/hpc.md), or convert the images (e.g. to PNG)";
}

std::string unsupported_image_format(const std::string& filename) {
  const size_t dot = filename.find_last_of('.');
  std::string ext = dot == std::string::npos ? "" : filename.substr(dot);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
#ifndef RESNET_DDP_HAVE_TIFF
  if (ext == ".tif" || ext == ".tiff") return "TIFF";
#endif
#ifndef RESNET_DDP_HAVE_WEBP
  if (ext == ".webp") return "WebP";
#endif
  return "";
}

}  // namespace rd::data
