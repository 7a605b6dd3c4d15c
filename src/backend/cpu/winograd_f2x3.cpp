// Winograd F(2x2, 3x3) and F(4x4, 3x3) on AVX2 (see winograd_f2x3.h for the algorithm).
// Matrices (Lavin & Gray 2016, "Fast Algorithms for Convolutional Neural Networks"):
// F(2x2, 3x3), interpolation points 0, 1, -1, infinity:
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
//   G   = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
//   A^T = [1 1 1 0; 0 1 -1 -1]
// F(4x4, 3x3), points 0, 1, -1, 2, -2, infinity (the best-conditioned set of five
// finite points: no fractions below 1/2 in A or B, so no large cancellations):
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
//   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
// The two variants share the drivers and the GEMM micro-kernel (templates on the
// variant below); only the transforms differ.
// Only the leaf kernels carry target("avx2,fma"), so this file builds for any
// x86-64 and the caller checks cpu_supported() before using it; the OpenMP drivers
// stay plain functions (an outlined parallel region does not inherit a target).
#include "backend/cpu/winograd_f2x3.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#define RD_AVX2 __attribute__((target("avx2,fma")))

namespace rd::cpu::winograd {

namespace {

constexpr int kBlock = 8;   // nChw8c channel block = one __m256
constexpr int kPanel = 16;  // GEMM output columns per micro-kernel (two __m256)
constexpr int kRows = 6;    // GEMM rows per micro-kernel: 12 accumulators + 3 operands

struct Tiling {
  int64_t th, tw, tiles, chunk;
  // Floats between transformed elements e and e+1 of a chunk with `channels` per
  // tile. The 64-byte skew keeps the 16 elements of a tile, written and read
  // together, off one cache set (a power-of-two stride aliases them all).
  // The rows are rounded up to the micro-kernels' 6 (they read whole row blocks).
  int64_t stride(int64_t channels) const { return (chunk + kRows - 1) / kRows * kRows * channels + 16; }
};

Tiling with_chunk(const Geometry& g, int64_t chunk) {
  Tiling t;
  t.th = (g.h + g.tile - 1) / g.tile;
  t.tw = (g.w + g.tile - 1) / g.tile;
  t.tiles = g.n * t.th * t.tw;
  t.chunk = g.chunk > 0 ? g.chunk : chunk;
  return t;
}

// Forward and backward-data: each thread transforms, multiplies and writes back its
// own chunks (no barrier inside a convolution: on a VM a barrier waits for the
// slowest vCPU). A chunk's transformed input and output, 16 x chunk x (c + k)
// floats, stay near one core's L2 (128-256 tiles measured best).
// F(4x4,3x3) has 36 transformed elements per tile, not 16: the same bytes hold
// 16/36 as many tiles (each covering 4x the outputs).
Tiling private_tiling(const Geometry& g) {
  if (g.tile == 4) return with_chunk(g, std::clamp<int64_t>(16384 / (g.c + g.k), 48, 128));
  return with_chunk(g, std::clamp<int64_t>(32768 / (g.c + g.k), 128, 256));
}

// Equal chunks, as many per thread (at most the cache-sized chunk): with few tiles
// (ResNet's last stage has 64 4x4 tiles per batch of 16) a leftover chunk would
// leave a thread idle for most of the convolution. Tests that set the chunk keep it.
Tiling balanced(const Geometry& g, Tiling t, int threads) {
  if (g.chunk > 0 || t.tiles == 0 || threads <= 1) return t;
  const int64_t rounds = (t.tiles + t.chunk * threads - 1) / (t.chunk * threads);
  const int64_t chunks = rounds * threads;
  t.chunk = std::max<int64_t>(1, (t.tiles + chunks - 1) / chunks);
  return t;
}

// Backward-weights: all threads share a chunk (they split its GEMMs by output
// panel, each accumulating its own slice of dU). Sizes measured on ResNet-34's
// stages (bench/conv_bench): 128-256 tiles; 1024 was 1.7x slower at 64 channels.
Tiling shared_tiling(const Geometry& g) {
  if (g.tile == 4) return with_chunk(g, std::clamp<int64_t>(16384 / std::max(g.c, g.k), 48, 128));
  return with_chunk(g, std::clamp<int64_t>(32768 / std::max(g.c, g.k), 128, 256));
}

// ---- leaf kernels (AVX2) -------------------------------------------------------

// Row y of a tile, columns x0..x0+3 (zeros outside the image: the padding).
RD_AVX2 inline void load_row(const float* plane, int64_t h, int64_t w, int64_t y, int64_t x0, bool interior,
                             __m256 r[4]) {
  if (interior) {
    for (int j = 0; j < 4; ++j) r[j] = _mm256_loadu_ps(plane + (y * w + x0 + j) * kBlock);
    return;
  }
  for (int j = 0; j < 4; ++j) {
    const int64_t x = x0 + j;
    r[j] = (y >= 0 && y < h && x >= 0 && x < w) ? _mm256_loadu_ps(plane + (y * w + x) * kBlock)
                                                 : _mm256_setzero_ps();
  }
}

// V = B^T d B for one 4x4 input tile of 8 channels; element e goes to v[e * estride].
// Row i of B^T d combines two input rows, so each output row is done on its own
// (12 live registers, no spills; the reloads hit L1).
RD_AVX2 void input_tile_f2(const float* plane, int64_t h, int64_t w, int64_t y0, int64_t x0, float* v,
                        int64_t estride) {
  const bool interior = y0 >= 0 && x0 >= 0 && y0 + 4 <= h && x0 + 4 <= w;
  // B^T rows: d0 - d2, d1 + d2, d2 - d1, d1 - d3.
  static constexpr int kA[4] = {0, 1, 2, 1}, kB[4] = {2, 2, 1, 3};
  static constexpr bool kAdd[4] = {false, true, false, false};
  for (int i = 0; i < 4; ++i) {
    __m256 a[4], b[4], t[4];
    load_row(plane, h, w, y0 + kA[i], x0, interior, a);
    load_row(plane, h, w, y0 + kB[i], x0, interior, b);
    for (int j = 0; j < 4; ++j) t[j] = kAdd[i] ? _mm256_add_ps(a[j], b[j]) : _mm256_sub_ps(a[j], b[j]);
    _mm256_storeu_ps(v + (i * 4 + 0) * estride, _mm256_sub_ps(t[0], t[2]));
    _mm256_storeu_ps(v + (i * 4 + 1) * estride, _mm256_add_ps(t[1], t[2]));
    _mm256_storeu_ps(v + (i * 4 + 2) * estride, _mm256_sub_ps(t[2], t[1]));
    _mm256_storeu_ps(v + (i * 4 + 3) * estride, _mm256_sub_ps(t[1], t[3]));
  }
}

// y = A^T M A: the 2x2 output tile of 8 channels (rows/columns past the image dropped).
RD_AVX2 void output_tile_f2(const float* m, int64_t estride, float* plane, int64_t h, int64_t w, int64_t y0,
                         int64_t x0) {
  __m256 r[2][4];
  for (int j = 0; j < 4; ++j) {
    const __m256 m0 = _mm256_loadu_ps(m + (0 * 4 + j) * estride), m1 = _mm256_loadu_ps(m + (1 * 4 + j) * estride);
    const __m256 m2 = _mm256_loadu_ps(m + (2 * 4 + j) * estride), m3 = _mm256_loadu_ps(m + (3 * 4 + j) * estride);
    r[0][j] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
    r[1][j] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
  }
  for (int i = 0; i < 2; ++i) {
    if (y0 + i >= h) break;
    float* row = plane + ((y0 + i) * w + x0) * kBlock;
    _mm256_storeu_ps(row, _mm256_add_ps(_mm256_add_ps(r[i][0], r[i][1]), r[i][2]));
    if (x0 + 1 < w) _mm256_storeu_ps(row + kBlock, _mm256_sub_ps(_mm256_sub_ps(r[i][1], r[i][2]), r[i][3]));
  }
}

// dM = A g A^T for one 2x2 output-gradient tile of 8 channels (the adjoint of
// output_tile; zeros past the image).
RD_AVX2 void grad_tile_f2(const float* plane, int64_t h, int64_t w, int64_t y0, int64_t x0, float* m,
                       int64_t estride) {
  __m256 g[2][2];
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      const int64_t y = y0 + a, x = x0 + b;
      g[a][b] = (y < h && x < w) ? _mm256_loadu_ps(plane + (y * w + x) * kBlock) : _mm256_setzero_ps();
    }
  __m256 p[4][2];  // A g
  for (int b = 0; b < 2; ++b) {
    p[0][b] = g[0][b];
    p[1][b] = _mm256_add_ps(g[0][b], g[1][b]);
    p[2][b] = _mm256_sub_ps(g[0][b], g[1][b]);
    p[3][b] = _mm256_sub_ps(_mm256_setzero_ps(), g[1][b]);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(m + (i * 4 + 0) * estride, p[i][0]);
    _mm256_storeu_ps(m + (i * 4 + 1) * estride, _mm256_add_ps(p[i][0], p[i][1]));
    _mm256_storeu_ps(m + (i * 4 + 2) * estride, _mm256_sub_ps(p[i][0], p[i][1]));
    _mm256_storeu_ps(m + (i * 4 + 3) * estride, _mm256_sub_ps(_mm256_setzero_ps(), p[i][1]));
  }
}

// The GEMM micro-kernel, 6 rows x 16 columns:
//   out[r][0..16) (+)= sum_i a[i * a_step + r * a_rows] * b[i * b_step + 0..16), i < depth.
// Forward / backward-data: rows are tiles, the sum runs over input channels
// (a_rows = lda, a_step = 1, b = a packed 16-wide weight panel). Backward-weights: rows
// are input channels, the sum runs over the chunk's tiles (a_rows = 1, a_step = ldv,
// b = the transformed output gradient), accumulating into dU.
// The 12 accumulators are named registers (GCC keeps an accumulator *array* on the
// stack and stores it every iteration, which halves the speed). The kernel always
// computes 6 rows; `rows` (1..6) says how many are real and are loaded/stored. The
// phantom rows read memory inside the workspace (stride() leaves room) and are dropped.
RD_AVX2 void kernel_6x16(const float* a, int64_t a_rows, int64_t a_step, const float* b, int64_t b_step,
                         int64_t depth, float* out, int64_t ldo, int64_t rows, bool accumulate) {
#define RD_WINO_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define RD_DECL(r)                                                                                       \
  __m256 acc##r##0 = accumulate && (r) < rows ? _mm256_loadu_ps(out + (r) * ldo) : _mm256_setzero_ps(); \
  __m256 acc##r##1 = accumulate && (r) < rows ? _mm256_loadu_ps(out + (r) * ldo + 8) : _mm256_setzero_ps();
  RD_WINO_ROWS(RD_DECL)
#undef RD_DECL
  for (int64_t i = 0; i < depth; ++i) {
    const float* ai = a + i * a_step;
    const __m256 b0 = _mm256_loadu_ps(b + i * b_step), b1 = _mm256_loadu_ps(b + i * b_step + 8);
#define RD_FMA(r)                                              \
  {                                                            \
    const __m256 av = _mm256_broadcast_ss(ai + (r) * a_rows);  \
    acc##r##0 = _mm256_fmadd_ps(av, b0, acc##r##0);            \
    acc##r##1 = _mm256_fmadd_ps(av, b1, acc##r##1);            \
  }
    RD_WINO_ROWS(RD_FMA)
#undef RD_FMA
  }
#define RD_STORE(r)                                   \
  if ((r) < rows) {                                   \
    _mm256_storeu_ps(out + (r) * ldo, acc##r##0);     \
    _mm256_storeu_ps(out + (r) * ldo + 8, acc##r##1); \
  }
  RD_WINO_ROWS(RD_STORE)
#undef RD_STORE
#undef RD_WINO_ROWS
}

// out[t][0..16) = sum_c a[t * lda + c] * panel[c * 16 + 0..16), t < rows.
void gemm_block(const float* a, int64_t lda, const float* panel, int64_t depth, float* out, int64_t ldo,
                int64_t rows) {
  for (int64_t r = 0; r < rows; r += kRows)
    kernel_6x16(a + r * lda, lda, 1, panel, kPanel, depth, out + r * ldo, ldo, std::min<int64_t>(kRows, rows - r),
                false);
}

// du[c][0..16) += sum_t v[t * ldv + c] * dm[t * ldm + 0..16), c < rows.
void reduce_block(const float* v, int64_t ldv, const float* dm, int64_t ldm, int64_t tiles, float* du,
                  int64_t ldu, int64_t rows) {
  for (int64_t r = 0; r < rows; r += kRows)
    kernel_6x16(v + r, 1, ldv, dm, ldm, tiles, du + r * ldu, ldu, std::min<int64_t>(kRows, rows - r), true);
}

// ---- F(4x4, 3x3) transforms (AVX2) ----------------------------------------------
// Each 2-D transform is two passes of the 1-D one (columns, then rows) through a
// small array that lives in L1; the 1-D transforms use the matrices' structure
// (pairs of rows that differ only in sign share their sums).

// r = B^T d for 6 values.
RD_AVX2 inline void bt6(const __m256 d[6], __m256 r[6]) {
  const __m256 four = _mm256_set1_ps(4.f), five = _mm256_set1_ps(5.f), two = _mm256_set1_ps(2.f);
  r[0] = _mm256_fmadd_ps(four, d[0], _mm256_fnmadd_ps(five, d[2], d[4]));
  r[1] = _mm256_fnmadd_ps(four, _mm256_add_ps(d[1], d[2]), _mm256_add_ps(d[3], d[4]));
  r[2] = _mm256_fmadd_ps(four, _mm256_sub_ps(d[1], d[2]), _mm256_sub_ps(d[4], d[3]));
  const __m256 a = _mm256_sub_ps(d[4], d[2]), b = _mm256_sub_ps(d[3], d[1]);
  r[3] = _mm256_fmadd_ps(two, b, a);
  r[4] = _mm256_fnmadd_ps(two, b, a);
  r[5] = _mm256_fmadd_ps(four, d[1], _mm256_fnmadd_ps(five, d[3], d[5]));
}

// o = A^T m for 6 values.
RD_AVX2 inline void at6(const __m256 m[6], __m256 o[4]) {
  const __m256 a = _mm256_add_ps(m[1], m[2]), b = _mm256_sub_ps(m[1], m[2]);
  const __m256 c = _mm256_add_ps(m[3], m[4]), d = _mm256_sub_ps(m[3], m[4]);
  o[0] = _mm256_add_ps(_mm256_add_ps(m[0], a), c);
  o[1] = _mm256_fmadd_ps(_mm256_set1_ps(2.f), d, b);
  o[2] = _mm256_fmadd_ps(_mm256_set1_ps(4.f), c, a);
  o[3] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.f), d, b), m[5]);
}

// m = A g for 4 values (the adjoint of at6).
RD_AVX2 inline void a6(const __m256 g[4], __m256 m[6]) {
  const __m256 p = _mm256_add_ps(g[0], g[2]), q = _mm256_add_ps(g[1], g[3]);
  const __m256 p2 = _mm256_fmadd_ps(_mm256_set1_ps(4.f), g[2], g[0]);
  const __m256 q2 = _mm256_fmadd_ps(_mm256_set1_ps(8.f), g[3], _mm256_add_ps(g[1], g[1]));
  m[0] = g[0];
  m[1] = _mm256_add_ps(p, q);
  m[2] = _mm256_sub_ps(p, q);
  m[3] = _mm256_add_ps(p2, q2);
  m[4] = _mm256_sub_ps(p2, q2);
  m[5] = g[3];
}

// V = B^T d B for one 6x6 input tile of 8 channels; element e goes to v[e * estride].
RD_AVX2 void input_tile_f4(const float* plane, int64_t h, int64_t w, int64_t y0, int64_t x0, float* v,
                           int64_t estride) {
  const bool interior = y0 >= 0 && x0 >= 0 && y0 + 6 <= h && x0 + 6 <= w;
  __m256 t[6][6];  // t[i][j] = (B^T d)[i][j]
  for (int j = 0; j < 6; ++j) {
    __m256 col[6], r[6];
    const int64_t x = x0 + j;
    for (int i = 0; i < 6; ++i) {
      const int64_t y = y0 + i;
      col[i] = interior || (y >= 0 && y < h && x >= 0 && x < w) ? _mm256_loadu_ps(plane + (y * w + x) * kBlock)
                                                                : _mm256_setzero_ps();
    }
    bt6(col, r);
    for (int i = 0; i < 6; ++i) t[i][j] = r[i];
  }
  for (int i = 0; i < 6; ++i) {
    __m256 r[6];
    bt6(t[i], r);
    for (int j = 0; j < 6; ++j) _mm256_storeu_ps(v + (i * 6 + j) * estride, r[j]);
  }
}

// y = A^T M A: the 4x4 output tile of 8 channels (rows/columns past the image dropped).
RD_AVX2 void output_tile_f4(const float* m, int64_t estride, float* plane, int64_t h, int64_t w, int64_t y0,
                            int64_t x0) {
  __m256 t[4][6];  // (A^T M)[i][j]
  for (int j = 0; j < 6; ++j) {
    __m256 col[6], r[4];
    for (int i = 0; i < 6; ++i) col[i] = _mm256_loadu_ps(m + (i * 6 + j) * estride);
    at6(col, r);
    for (int i = 0; i < 4; ++i) t[i][j] = r[i];
  }
  for (int i = 0; i < 4 && y0 + i < h; ++i) {
    __m256 r[4];
    at6(t[i], r);
    float* row = plane + ((y0 + i) * w + x0) * kBlock;
    for (int j = 0; j < 4 && x0 + j < w; ++j) _mm256_storeu_ps(row + j * kBlock, r[j]);
  }
}

// dM = A g A^T for one 4x4 output-gradient tile of 8 channels (zeros past the image).
RD_AVX2 void grad_tile_f4(const float* plane, int64_t h, int64_t w, int64_t y0, int64_t x0, float* m,
                          int64_t estride) {
  __m256 t[6][4];  // (A g)[i][b]
  for (int b = 0; b < 4; ++b) {
    __m256 col[4], r[6];
    const int64_t x = x0 + b;
    for (int a = 0; a < 4; ++a) {
      const int64_t y = y0 + a;
      col[a] = (y < h && x < w) ? _mm256_loadu_ps(plane + (y * w + x) * kBlock) : _mm256_setzero_ps();
    }
    a6(col, r);
    for (int i = 0; i < 6; ++i) t[i][b] = r[i];
  }
  for (int i = 0; i < 6; ++i) {
    __m256 r[6];
    a6(t[i], r);
    for (int j = 0; j < 6; ++j) _mm256_storeu_ps(m + (i * 6 + j) * estride, r[j]);
  }
}

// Weight transforms, 16 filters at a time (one GEMM panel's columns): x[j][l] is
// element j of filter l. Innermost loops of 16 compile to two AVX2 vectors, and the
// transformed panel is written as whole cache lines.
using Col16 = float[kPanel];

// F(2x2, 3x3): u = G g G^T and g = G^T du G.
RD_AVX2 void to_tile16_f2(const Col16* g, Col16* u) {
  Col16 gg[4][3];  // G g
  for (int s = 0; s < 3; ++s)
    for (int l = 0; l < kPanel; ++l) {
      const float a = g[s][l], b = g[3 + s][l], c = g[6 + s][l];
      gg[0][s][l] = a;
      gg[1][s][l] = 0.5f * (a + b + c);
      gg[2][s][l] = 0.5f * (a - b + c);
      gg[3][s][l] = c;
    }
  for (int i = 0; i < 4; ++i)
    for (int l = 0; l < kPanel; ++l) {
      const float a = gg[i][0][l], b = gg[i][1][l], c = gg[i][2][l];
      u[i * 4 + 0][l] = a;
      u[i * 4 + 1][l] = 0.5f * (a + b + c);
      u[i * 4 + 2][l] = 0.5f * (a - b + c);
      u[i * 4 + 3][l] = c;
    }
}
RD_AVX2 void to_filter16_f2(const Col16* du, Col16* g) {
  Col16 t[3][4];  // G^T du
  for (int j = 0; j < 4; ++j)
    for (int l = 0; l < kPanel; ++l) {
      const float u0 = du[0 * 4 + j][l], u1 = du[1 * 4 + j][l], u2 = du[2 * 4 + j][l], u3 = du[3 * 4 + j][l];
      t[0][j][l] = u0 + 0.5f * (u1 + u2);
      t[1][j][l] = 0.5f * (u1 - u2);
      t[2][j][l] = 0.5f * (u1 + u2) + u3;
    }
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < kPanel; ++l) {
      const float t0 = t[r][0][l], t1 = t[r][1][l], t2 = t[r][2][l], t3 = t[r][3][l];
      g[r * 3 + 0][l] = t0 + 0.5f * (t1 + t2);
      g[r * 3 + 1][l] = 0.5f * (t1 - t2);
      g[r * 3 + 2][l] = 0.5f * (t1 + t2) + t3;
    }
}

// F(4x4, 3x3). The sixths and 24ths of G round once more than F(2x2)'s halves; that
// is ~1 ulp of the weights, far below the algorithm's own error.
RD_AVX2 inline void g6(const float* a, const float* b, const float* c, float* const o[6]) {
  for (int l = 0; l < kPanel; ++l) {
    const float s = a[l] + c[l];
    o[0][l] = 0.25f * a[l];
    o[1][l] = -(s + b[l]) * (1.f / 6);
    o[2][l] = -(s - b[l]) * (1.f / 6);
    o[3][l] = a[l] * (1.f / 24) + b[l] * (1.f / 12) + c[l] * (1.f / 6);
    o[4][l] = a[l] * (1.f / 24) - b[l] * (1.f / 12) + c[l] * (1.f / 6);
    o[5][l] = c[l];
  }
}
RD_AVX2 inline void gt6(const float* const x[6], float* o0, float* o1, float* o2) {
  for (int l = 0; l < kPanel; ++l) {
    const float p = x[1][l] + x[2][l], q = x[3][l] + x[4][l];
    o0[l] = 0.25f * x[0][l] - p * (1.f / 6) + q * (1.f / 24);
    o1[l] = (x[2][l] - x[1][l]) * (1.f / 6) + (x[3][l] - x[4][l]) * (1.f / 12);
    o2[l] = (q - p) * (1.f / 6) + x[5][l];
  }
}
RD_AVX2 void to_tile16_f4(const Col16* g, Col16* u) {
  Col16 gg[6][3];  // G g
  for (int s = 0; s < 3; ++s) {
    float* const o[6] = {gg[0][s], gg[1][s], gg[2][s], gg[3][s], gg[4][s], gg[5][s]};
    g6(g[s], g[3 + s], g[6 + s], o);
  }
  for (int i = 0; i < 6; ++i) {
    float* const o[6] = {u[i * 6], u[i * 6 + 1], u[i * 6 + 2], u[i * 6 + 3], u[i * 6 + 4], u[i * 6 + 5]};
    g6(gg[i][0], gg[i][1], gg[i][2], o);
  }
}
RD_AVX2 void to_filter16_f4(const Col16* du, Col16* g) {
  Col16 t[3][6];  // G^T du
  for (int j = 0; j < 6; ++j) {
    const float* const x[6] = {du[j], du[6 + j], du[12 + j], du[18 + j], du[24 + j], du[30 + j]};
    gt6(x, t[0][j], t[1][j], t[2][j]);
  }
  for (int r = 0; r < 3; ++r) {
    const float* const x[6] = {t[r][0], t[r][1], t[r][2], t[r][3], t[r][4], t[r][5]};
    gt6(x, g[r * 3], g[r * 3 + 1], g[r * 3 + 2]);
  }
}

// The two variants, as the drivers see them.
struct F2 {
  static constexpr int kTile = 2, kElems = 16;
  static constexpr auto input = input_tile_f2;
  static constexpr auto output = output_tile_f2;
  static constexpr auto grad = grad_tile_f2;
  static constexpr auto to_tile16 = to_tile16_f2;
  static constexpr auto to_filter16 = to_filter16_f2;
};
struct F4 {
  static constexpr int kTile = 4, kElems = 36;
  static constexpr auto input = input_tile_f4;
  static constexpr auto output = output_tile_f4;
  static constexpr auto grad = grad_tile_f4;
  static constexpr auto to_tile16 = to_tile16_f4;
  static constexpr auto to_filter16 = to_filter16_f4;
};
int64_t elems(const Geometry& g) { return g.tile == 4 ? F4::kElems : F2::kElems; }

// U[e][out/16][in][16] for a convolution with `in` input and `out` output channels.
// Forward: in = c, out = k, filter (o, i) = w[o][i]. Backward-data convolves dy
// (k channels) back to c channels with w[k][c] flipped: in = k, out = c.
template <class T>
void transform_weights(const float* w, int64_t c, int64_t k, bool for_backward_data, float* u, int threads) {
  const int64_t in = for_backward_data ? k : c, out = for_backward_data ? c : k, panels = out / kPanel;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t pi = 0; pi < panels * in; ++pi) {
    const int64_t p = pi / in, i = pi % in;
    alignas(32) Col16 g[9], tile[T::kElems];
    for (int l = 0; l < kPanel; ++l) {  // (o, i) = (p * 16 + l, i), flipped by 180 degrees for backward-data
      const int64_t o = p * kPanel + l;
      const float* filter = for_backward_data ? w + (i * c + o) * 9 : w + (o * c + i) * 9;
      for (int j = 0; j < 9; ++j) g[j][l] = filter[for_backward_data ? 8 - j : j];
    }
    T::to_tile16(g, tile);
    for (int e = 0; e < T::kElems; ++e)
      std::memcpy(u + ((e * panels + p) * in + i) * kPanel, tile[e], sizeof(Col16));
  }
}

// The workspace: transformed weights (or weight gradient) U, then the chunk buffers
// V and M (one pair per thread for the private chunks, one shared pair otherwise).
float* weights_buffer(void* workspace) { return static_cast<float*>(workspace); }
float* chunk_buffers(const Geometry& g, void* workspace) { return weights_buffer(workspace) + elems(g) * g.c * g.k; }
int64_t private_floats(const Geometry& g) { return 2 * elems(g) * private_tiling(g).stride(std::max(g.c, g.k)); }

// One 3x3 convolution of `in` channels to `out` channels with transformed weights u.
template <class T>
void convolve(const Geometry& g, int64_t in, int64_t out, const float* src, const float* u, float* dst,
              float* buffers, int threads) {
  const Tiling t = balanced(g, private_tiling(g), threads);
  const int64_t in_blocks = in / kBlock, out_blocks = out / kBlock, panels = out / kPanel;
  const int64_t tiles_per_image = t.th * t.tw, plane = g.h * g.w * kBlock;
  const int64_t chunks = (t.tiles + t.chunk - 1) / t.chunk;
#pragma omp parallel num_threads(threads)
  {
    float* const v = buffers + omp_get_thread_num() * private_floats(g);
    float* const m = v + T::kElems * t.stride(std::max(in, out));
#pragma omp for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t t0 = chunk * t.chunk, nt = std::min(t.chunk, t.tiles - t0);
      for (int64_t i = 0; i < nt; ++i) {
        const int64_t tile = t0 + i, n = tile / tiles_per_image, ty = tile % tiles_per_image / t.tw, tx = tile % t.tw;
        for (int64_t cb = 0; cb < in_blocks; ++cb)
          T::input(src + (n * in_blocks + cb) * plane, g.h, g.w, T::kTile * ty - 1, T::kTile * tx - 1,
                   v + i * in + cb * kBlock, t.stride(in));
      }
      for (int64_t e = 0; e < T::kElems; ++e)
        for (int64_t p = 0; p < panels; ++p)
          gemm_block(v + e * t.stride(in), in, u + (e * panels + p) * in * kPanel, in,
                     m + e * t.stride(out) + p * kPanel, out, nt);
      for (int64_t i = 0; i < nt; ++i) {
        const int64_t tile = t0 + i, n = tile / tiles_per_image, ty = tile % tiles_per_image / t.tw, tx = tile % t.tw;
        for (int64_t kb = 0; kb < out_blocks; ++kb)
          T::output(m + i * out + kb * kBlock, t.stride(out), dst + (n * out_blocks + kb) * plane, g.h, g.w,
                    T::kTile * ty, T::kTile * tx);
      }
    }
  }
}

template <class T>
void weight_gradient(const Geometry& g, const float* x, const float* dy, float* dw, bool accumulate,
                     void* workspace, int threads) {
  const Tiling t = shared_tiling(g);
  const int64_t c_blocks = g.c / kBlock, k_blocks = g.k / kBlock, panels = g.k / kPanel;
  const int64_t tiles_per_image = t.th * t.tw, plane = g.h * g.w * kBlock;
  float* const du = weights_buffer(workspace);  // [e][c][k]
  float* const v = chunk_buffers(g, workspace);   // [e][tile][c]
  float* const m = v + T::kElems * t.stride(std::max(g.c, g.k));  // [e][tile][k]
  std::memset(du, 0, sizeof(float) * T::kElems * g.c * g.k);
#pragma omp parallel num_threads(threads)
  for (int64_t t0 = 0; t0 < t.tiles; t0 += t.chunk) {
    const int64_t nt = std::min(t.chunk, t.tiles - t0);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nt; ++i) {
      const int64_t tile = t0 + i, n = tile / tiles_per_image, ty = tile % tiles_per_image / t.tw, tx = tile % t.tw;
      for (int64_t cb = 0; cb < c_blocks; ++cb)
        T::input(x + (n * c_blocks + cb) * plane, g.h, g.w, T::kTile * ty - 1, T::kTile * tx - 1,
                 v + i * g.c + cb * kBlock, t.stride(g.c));
      for (int64_t kb = 0; kb < k_blocks; ++kb)
        T::grad(dy + (n * k_blocks + kb) * plane, g.h, g.w, T::kTile * ty, T::kTile * tx, m + i * g.k + kb * kBlock,
                t.stride(g.k));
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < T::kElems * panels; ++i) {
      const int64_t e = i / panels, p = i % panels;
      reduce_block(v + e * t.stride(g.c), g.c, m + e * t.stride(g.k) + p * kPanel, g.k, nt,
                   du + e * g.c * g.k + p * kPanel, g.k, g.c);
    }
  }
  // Input channel outer, 16 output channels inner: dU's reads run along its rows.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t ip = 0; ip < g.c * panels; ++ip) {
    const int64_t i = ip / panels, o0 = ip % panels * kPanel;
    alignas(32) Col16 tile[T::kElems], filter[9];
    for (int e = 0; e < T::kElems; ++e) std::memcpy(tile[e], du + (e * g.c + i) * g.k + o0, sizeof(Col16));
    T::to_filter16(tile, filter);
    for (int l = 0; l < kPanel; ++l) {
      float* d = dw + ((o0 + l) * g.c + i) * 9;
      for (int j = 0; j < 9; ++j) d[j] = accumulate ? d[j] + filter[j][l] : filter[j][l];
    }
  }
}


}  // namespace

bool cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool shape_supported(const Geometry& g) {
  return g.n > 0 && g.h > 0 && g.w > 0 && g.c > 0 && g.k > 0 && g.c % kPanel == 0 && g.k % kPanel == 0 &&
         (g.tile == 2 || g.tile == 4);
}

size_t workspace_bytes(const Geometry& g, int threads) {
  const int64_t shared = 2 * elems(g) * shared_tiling(g).stride(std::max(g.c, g.k));
  const int64_t floats = elems(g) * g.c * g.k + std::max<int64_t>(shared, std::max(threads, 1) * private_floats(g));
  return static_cast<size_t>(floats) * sizeof(float);
}

template <class T>
void forward_t(const Geometry& g, const float* x, const float* w, float* y, void* workspace, int threads) {
  transform_weights<T>(w, g.c, g.k, false, weights_buffer(workspace), threads);
  convolve<T>(g, g.c, g.k, x, weights_buffer(workspace), y, chunk_buffers(g, workspace), threads);
}
void forward(const Geometry& g, const float* x, const float* w, float* y, void* workspace, int threads) {
  g.tile == 4 ? forward_t<F4>(g, x, w, y, workspace, threads) : forward_t<F2>(g, x, w, y, workspace, threads);
}

template <class T>
void backward_data_t(const Geometry& g, const float* dy, const float* w, float* dx, void* workspace, int threads) {
  transform_weights<T>(w, g.c, g.k, true, weights_buffer(workspace), threads);
  convolve<T>(g, g.k, g.c, dy, weights_buffer(workspace), dx, chunk_buffers(g, workspace), threads);
}
void backward_data(const Geometry& g, const float* dy, const float* w, float* dx, void* workspace,
                   int threads) {
  g.tile == 4 ? backward_data_t<F4>(g, dy, w, dx, workspace, threads)
              : backward_data_t<F2>(g, dy, w, dx, workspace, threads);
}

void backward_weights(const Geometry& g, const float* x, const float* dy, float* dw, bool accumulate,
                      void* workspace, int threads) {
  g.tile == 4 ? weight_gradient<F4>(g, x, dy, dw, accumulate, workspace, threads)
              : weight_gradient<F2>(g, x, dy, dw, accumulate, workspace, threads);
}

}  // namespace rd::cpu::winograd
