// JPEG decoding with libjpeg-turbo (Debian libjpeg62-turbo), set up exactly as
// Pillow 9.4 does it for Image.open(path).convert("RGB") (torchvision's ImageFolder
// loader), so the pixels are identical to PIL's:
//  - library defaults: ISLOW integer IDCT, fancy upsampling, no DCT scaling, the
//    colour space libjpeg guesses from JFIF/Adobe markers;
//  - 1 component -> gray replicated to RGB; 3 components -> libjpeg's RGB;
//  - 4 components -> CMYK from libjpeg (YCCK converted by it), read as Adobe-inverted
//    ("CMYK;I", which PIL assumes for every 4-component JPEG), then PIL's cmyk2rgb;
//  - corrupt-data warnings are ignored (Pillow's output_message is a no-op), but a
//    file that ends before the last scanline is an error ("image file is truncated"
//    in PIL); running out of data after the last scanline is accepted, as Pillow
//    accepts a suspended jpeg_finish_decompress.
// libjpeg reports fatal errors through error_exit, which must not return: it
// longjmps back into guarded() below, and the caller throws rd::Error naming the file.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <jerror.h>  // message codes: JWRN_JPEG_EOF, ERREXIT

#include "data/internal.h"
#include "resnet_ddp/errors.h"

#ifndef LIBJPEG_TURBO_VERSION
#error "libjpeg-turbo is required (PIL-identical JPEG pixels): install libjpeg62-turbo-dev"
#endif

namespace rd::data {

namespace {

// Real encoders write about 10 scans; a file with thousands of tiny progressive
// scans costs a full coefficient pass each (a denial of service known from
// libjpeg-turbo's security audit; other decoders cap the scan count too).
constexpr int kMaxScans = 1000;

struct JpegError {
  jpeg_error_mgr mgr;  // first member: libjpeg hands back &mgr as cinfo->err
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
  bool accept_eof;  // set once every scanline is out (see the file comment)
};

[[noreturn]] void on_error(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<JpegError*>(c->err);
  ++c->err->num_warnings;
  if (c->err->msg_code == JWRN_JPEG_EOF && !e->accept_eof) {
    std::snprintf(e->message, sizeof e->message, "truncated JPEG: premature end of data");
    std::longjmp(e->jump, 1);
  }
}

void no_output(j_common_ptr) {}

void count_scans(j_common_ptr c) {
  auto* d = reinterpret_cast<j_decompress_ptr>(c);
  if (d->input_scan_number > kMaxScans) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    std::snprintf(e->message, sizeof e->message, "JPEG with more than %d scans", kMaxScans);
    std::longjmp(e->jump, 1);
  }
}

// One decompressor. Everything libjpeg may longjmp over is plain data; the destructor
// frees libjpeg's memory pools whether or not the decode finished.
struct Session {
  jpeg_decompress_struct cinfo;
  JpegError err;
  jpeg_progress_mgr progress;

  Session() {
    std::memset(&cinfo, 0, sizeof cinfo);
    std::memset(&err, 0, sizeof err);
    std::memset(&progress, 0, sizeof progress);
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = on_error;
    err.mgr.emit_message = on_message;
    err.mgr.output_message = no_output;
    progress.progress_monitor = count_scans;
  }
  ~Session() { jpeg_destroy_decompress(&cinfo); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

// Runs body(); a libjpeg error inside it makes it return false (message in s.err).
// body must hold no object with a destructor while it calls libjpeg (longjmp skips it).
template <class F>
bool guarded(Session& s, F&& body) {
  if (setjmp(s.err.jump)) return false;
  body();
  return true;
}

// jpeg_create_decompress keeps cinfo.err and clears the rest of cinfo.
bool create(Session& s) {
  return guarded(s, [&] {
    jpeg_create_decompress(&s.cinfo);
    s.cinfo.progress = &s.progress;
  });
}

[[noreturn]] void fail(const Session& s, const std::string& what, const char* stage) {
  throw Error(what + ": " + stage + " (" + s.err.message + ")");
}

ImageHeader header_of(const Session& s) {
  ImageHeader h;
  h.width = static_cast<int>(s.cinfo.image_width);
  h.height = static_cast<int>(s.cinfo.image_height);
  h.channels = s.cinfo.num_components;
  return h;
}

void check_components(const Session& s, const std::string& what) {
  const int n = s.cinfo.num_components;
  if (n != 1 && n != 3 && n != 4)  // PIL: "cannot handle N-layer images"
    throw Error(what + ": not a decodable image (JPEG with " + std::to_string(n) +
                " components; 1, 3 or 4 are supported)");
}

// PIL's rounding a*b/255 (ImagingUtils MULDIV255) for its CMYK -> RGB conversion.
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

}  // namespace

// PIL's test (JpegImagePlugin._accept): SOI and the start of the next marker.
bool is_jpeg(const uint8_t* bytes, size_t size) {
  return size >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF;
}

ImageHeader probe_jpeg_memory(const uint8_t* bytes, size_t size, const std::string& what) {
  Session s;
  const bool ok = create(s) && guarded(s, [&] {
    jpeg_mem_src(&s.cinfo, bytes, static_cast<unsigned long>(size));
    jpeg_read_header(&s.cinfo, TRUE);
  });
  if (!ok) fail(s, what, "not a decodable image");
  check_components(s, what);
  return header_of(s);
}

ImageHeader probe_jpeg_file(std::FILE* f, const std::string& what) {
  Session s;
  const bool ok = create(s) && guarded(s, [&] {
    jpeg_stdio_src(&s.cinfo, f);
    jpeg_read_header(&s.cinfo, TRUE);
  });
  if (!ok) fail(s, what, "not a decodable image");
  check_components(s, what);
  return header_of(s);
}

void decode_jpeg_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out,
                        int64_t max_pixels, int draft_size) {
  Session s;
  if (!create(s) || !guarded(s, [&] {
        jpeg_mem_src(&s.cinfo, bytes, static_cast<unsigned long>(size));
        jpeg_read_header(&s.cinfo, TRUE);
      }))
    fail(s, what, "not a decodable image");
  check_components(s, what);
  check_dimensions(header_of(s), what, max_pixels);

  jpeg_decompress_struct& c = s.cinfo;
  const bool cmyk = c.num_components == 4;
  // Pillow's settings, spelled out although they are libjpeg's defaults.
  c.dct_method = JDCT_ISLOW;
  c.do_fancy_upsampling = TRUE;
  c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;  // gray -> RGB replicates the sample
  if (draft_size > 0) {
    // Like PIL's Image.draft("RGB", (n, n)): the largest of 1/8, 1/4, 1/2 that keeps
    // both sides >= n (the IDCT then produces the smaller image directly).
    const unsigned n = static_cast<unsigned>(draft_size);
    const unsigned fit = std::min(c.image_width / n, c.image_height / n);
    c.scale_num = 1;
    c.scale_denom = fit >= 8 ? 8 : fit >= 4 ? 4 : fit >= 2 ? 2 : 1;
  }
  if (!guarded(s, [&] { jpeg_calc_output_dimensions(&c); })) fail(s, what, "decoding failed");
  const int w = static_cast<int>(c.output_width), h = static_cast<int>(c.output_height);
  out.resize(w, h);
  std::vector<uint8_t> row(cmyk ? static_cast<size_t>(w) * 4 : 0);
  uint8_t* const dst = out.data();
  const size_t stride = static_cast<size_t>(w) * 3;
  const bool ok = guarded(s, [&] {
    jpeg_start_decompress(&c);
    if (static_cast<int>(c.output_width) != w || static_cast<int>(c.output_height) != h ||
        c.output_components != (cmyk ? 4 : 3))
      ERREXIT(&c, JERR_NOTIMPL);  // not expected: the sizes were computed above
    while (c.output_scanline < c.output_height) {
      const size_t y = c.output_scanline;
      JSAMPROW line = cmyk ? row.data() : dst + y * stride;
      if (jpeg_read_scanlines(&c, &line, 1) != 1) ERREXIT(&c, JERR_INPUT_EMPTY);
      if (cmyk) {
        // PIL reads libjpeg's CMYK as inverted (Adobe) and converts with
        // RGB = (255 - K) - (255 - K) * C / 255, C and K after the inversion.
        uint8_t* o = dst + y * stride;
        for (int x = 0; x < w; ++x) {
          const uint8_t* p = row.data() + 4 * x;
          const int nk = p[3];  // 255 - (255 - raw K)
          for (int k = 0; k < 3; ++k) o[3 * x + k] = static_cast<uint8_t>(nk - muldiv255(255 - p[k], nk));
        }
      }
    }
    s.err.accept_eof = true;
    jpeg_finish_decompress(&c);
  });
  if (!ok) fail(s, what, "decoding failed");
}

}  // namespace rd::data
