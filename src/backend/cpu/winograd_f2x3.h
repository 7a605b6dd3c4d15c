// Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution for AVX2 CPUs on nChw8c
// activations: 3x3, stride 1, padding 1, forward, backward-data and backward-weights.
//
// Why it exists: oneDNN 2.6 implements Winograd for AVX-512 only, and its AVX2
// direct kernels already run near the FMA peak, so on AVX2 nodes the 3x3
// stride-1 convolutions (about 95% of a ResNet's arithmetic) can only get faster
// by doing less arithmetic. F(2x2, 3x3) does 16 multiplications per 2x2 output
// tile instead of 36 (2.25x fewer); its transforms use only 0, +-1 and 1/2, so
// its rounding error stays that of a direct convolution of the same depth
// (Lavin & Gray 2016; tools/parity/run_parity.py states the bound).
// F(4x4, 3x3) does 36 multiplications per 4x4 output tile instead of 144 (4x fewer)
// but its transforms multiply by up to 8 and add 6x6 terms: its rounding error is
// about 16x a direct convolution's (the bound, from the matrices' norms, is in
// tools/parity/run_parity.py), and its larger tiles waste more on small images.
// Which one a layer runs is the backend's choice (conv.cpp), by measured speed.
//
// Structure (per chunk of tiles, so the transformed data stays in cache):
//   V[e][t][c] = (B^T d B)[e]    input transform of each 4x4 (6x6) input tile
//   M[e][t][k] = sum_c V[e][t][c] * U[e][c][k]    16 independent GEMMs
//   y tile     = A^T M A         output transform to the 2x2 (4x4) output tile
// with U = G g G^T the transformed weights, refreshed every call. Backward-data is
// the same algorithm on dy with the weights flipped and transposed; backward-weights
// is its adjoint: dU[e][c][k] = sum_t V[e][t][c] * (A dy A^T)[e][t][k], then
// dw = G^T dU G.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rd::cpu::winograd {

// One convolution: n images, c input channels, k output channels, h x w pixels
// (input and output alike: 3x3, stride 1, padding 1).
struct Geometry {
  int64_t n, c, k, h, w;
  int64_t chunk = 0;  // tiles transformed per pass; 0 = sized for the caches (tests set it)
  int64_t tile = 2;   // output tile side: 2 = F(2x2, 3x3), 4 = F(4x4, 3x3)
};

// AVX2 + FMA at run time (every x86-64 node users have, checked anyway).
bool cpu_supported();
// Channel counts the kernels handle: multiples of 16 in and out (the GEMM panels
// are 16 wide, and backward-data swaps the roles of c and k); tile 2 or 4.
bool shape_supported(const Geometry& g);

// Scratch the three calls need with `threads` threads, in bytes (one buffer,
// 64-byte aligned, reused).
size_t workspace_bytes(const Geometry& g, int threads);

// x: n x c x h x w in nChw8c; w: k x c x 3 x 3 (OIHW); y: n x k x h x w in nChw8c.
void forward(const Geometry& g, const float* x, const float* w, float* y, void* workspace, int threads);
// dy: n x k x h x w, dx: n x c x h x w (nChw8c).
void backward_data(const Geometry& g, const float* dy, const float* w, float* dx, void* workspace,
                   int threads);
// dw (OIHW) = the weight gradient, or dw += it when accumulate.
void backward_weights(const Geometry& g, const float* x, const float* dy, float* dw, bool accumulate,
                      void* workspace, int threads);

}  // namespace rd::cpu::winograd
