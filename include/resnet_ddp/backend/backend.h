// Backend: every operation ResNet training needs, behind one interface, so the
// model, DDP, data and checkpoint code are shared by the CPU (oneDNN + OpenMP)
// and CUDA (cuDNN + cuBLAS + kernels/) implementations. The operations
// themselves are listed once, with their documentation, in ops.def.
//
// Conventions
// - Activations are 4-D tensors with logical shape (N, C, H, W) in the layout
//   the backend chose (`activation_layout()`); callers allocate them with
//   `activation(...)` and never index them directly.
// - Parameters and their gradients are RowMajor slices of the flat arenas, in
//   PyTorch's own layouts: conv weight (O, I, kh, kw), linear weight (out, in).
// - Matrices (linear inputs/outputs, logits) are RowMajor (N, K).
// - `accumulate` on a gradient output means "add to what is there" (gradient
//   accumulation, shared weights); otherwise the output is overwritten.
// - All pointers given as `float*` for per-channel vectors live on the
//   backend's device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "resnet_ddp/math/image.h"
#include "resnet_ddp/math/optim.h"
#include "resnet_ddp/tensor.h"

namespace rd {

struct ConvGeometry {
  int kernel = 3;
  int stride = 1;
  int pad = 1;
  // Grouped convolution (ResNeXt): input and output channels split into `groups`
  // equal slices, slice g of the output reading only slice g of the input. The
  // weight stays PyTorch's (O, I / groups, k, k).
  int groups = 1;
};

// Output spatial size of a convolution / pooling window (floor mode, as PyTorch).
inline int64_t conv_out_size(int64_t in, int kernel, int stride, int pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

// SyncBatchNorm seam: a backend calls this in the middle of a batch-norm op to
// sum per-channel statistics over all ranks (in place, the backend's device
// memory). Doubles, so that sums and the element count stay exact (a float
// count is not, beyond 2^24 elements per channel). A device reducer may return
// before the sums are there, ordered before the backend's later work on its
// stream (no host wait per layer).
struct ChannelReducer {
  virtual ~ChannelReducer() = default;
  virtual void allreduce_sum(double* data, size_t count) = 0;
  // How many ranks contribute (1 when not distributed).
  virtual int participants() const = 0;
};

// Saved state of one batch-norm forward in training mode, needed by backward.
struct BatchNormSaved {
  float* mean = nullptr;    // [C] batch mean (global when synchronised)
  float* invstd = nullptr;  // [C] 1 / sqrt(var + eps)
  // Elements per channel behind the statistics (all ranks). The CPU backend
  // reads the exact all-reduced count; the CUDA backend, which must not wait on
  // the host per layer, records local count x participants (equal per-rank
  // batches, as DistributedSampler gives) while its kernels use the exact one.
  double count = 0;
};

enum class Precision : uint8_t { FP32, TF32, FP16, BF16 };

// One batch-norm layer's device vectors and settings, shared by its forward and
// backward ops (instead of eleven positional arguments).
struct BatchNormArgs {
  const float* gamma = nullptr;     // [C]
  const float* beta = nullptr;      // [C]
  float* running_mean = nullptr;    // [C] updated by forward_train, read by forward_eval
  float* running_var = nullptr;     // [C]
  float momentum = 0.1f;            // PyTorch's running-stat momentum
  float eps = 1e-5f;
  bool relu = false;                // ReLU fused on the output
  ChannelReducer* sync = nullptr;   // SyncBatchNorm: statistics summed over ranks
};

// Where batch-norm backward writes the parameter gradients.
struct BatchNormGrads {
  float* dgamma = nullptr;  // [C]
  float* dbeta = nullptr;   // [C]
  bool accumulate = false;  // add to what is there
};

// Backend: every public operation is non-virtual. It first runs the op's
// contract (src/backend/contract.cpp: rank, layout, dtype, device, shapes,
// aliasing), the same code for every backend, then the backend's protected
// `*_impl`. So whatever the CPU tests, the model and the trainer ask of the CPU
// backend is exactly what the CUDA backend is asked to accept.
//
// The contract in brief:
// - an activation is 4-D, in `layout_for_channels(C)`, of `activation_dtype()`;
// - a matrix is 2-D RowMajor F32 (linear inputs/outputs, logits, pooled features);
// - relu takes either (elementwise ops dispatch on the tensor's own dtype);
// - operands of one op live on `device()`; an output either is exactly an input
//   (in place, where the op allows it) or does not overlap any input.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind device() const = 0;
  virtual std::string name() const = 0;  // "cpu (oneDNN 2.6.3, 2 threads)"
  virtual Layout activation_layout() const = 0;

  // A new zero-initialised tensor on this backend's device.
  Tensor tensor(const Shape& shape, Layout layout, DType dtype = DType::F32);
  // Element type of activations: F32, or F16/BF16 when a GPU backend runs mixed
  // precision (parameters, gradients, matrices and BN vectors stay F32).
  virtual DType activation_dtype() const { return DType::F32; }
  // The layout of an activation with `channels` channels: a blocked layout applies
  // only where the channels fill its blocks. The 3-channel input image is plain NCHW
  // then (padded to 16 channels it would cost 5x the memory, and NCHW in, nChw16c out
  // is the stem-convolution case oneDNN's JIT kernels implement; NHWC in is not).
  Layout layout_for_channels(int64_t channels) const {
    const Layout l = activation_layout();
    return channels % channel_block(l) != 0 ? Layout::NCHW : l;
  }
  Tensor activation(int64_t n, int64_t c, int64_t h, int64_t w) {
    return tensor(Shape{n, c, h, w}, layout_for_channels(c), activation_dtype());
  }
  Tensor matrix(int64_t rows, int64_t cols) { return tensor(Shape{rows, cols}, Layout::RowMajor); }

  // Host memory for batches that images_u8_to_activation will read (the loader's
  // slots). CUDA: pinned, so the upload copies straight from it on the copy stream
  // while earlier work computes; nullptr where plain host memory serves as well (CPU).
  virtual std::shared_ptr<void> allocate_upload_source(size_t bytes) {
    (void)bytes;
    return nullptr;
  }
  // Returns once no queued upload reads `host` any more, so it may be overwritten
  // (the loader calls it before refilling a slot). A host wait only when the device
  // is still behind; nothing to wait for on the CPU.
  virtual void wait_upload_source(const void* host) { (void)host; }
  // Prepares the convolution of an input `x` (N, C, H, W) with a weight of shape `w`
  // (O, C / groups, k, k) and geometry `g` ahead of its first run: the forward, and the
  // backward directions asked for. Reads and writes no tensor (weights and BN statistics
  // stay as they are). CUDA: chooses the cuDNN algorithms (cudnnFind), which otherwise
  // runs inside the first step that meets the shape; the CPU has nothing to prepare.
  virtual void plan_convolution(const Shape& x, const Shape& w, const ConvGeometry& g, bool backward_data,
                                bool backward_weights) {
    (void)x, (void)w, (void)g, (void)backward_data, (void)backward_weights;
  }

  // ---- the operations (include/resnet_ddp/backend/ops.def, with their documentation) ----
#define RD_BACKEND_OP(name, ret, params, args, kind) ret name params;
#define RD_BACKEND_VIRTUAL(name, ret, params, args, kind) virtual ret name params = 0;
#include "resnet_ddp/backend/ops.def"

 protected:
  // The implementations, called after the contract holds. Forwarding decorators
  // override these, never the public operations.
#define RD_BACKEND_OP(name, ret, params, args, kind) virtual ret name##_impl params = 0;
#include "resnet_ddp/backend/ops.def"
};

// How the CPU backend computes 3x3 stride-1 convolutions. Winograd does fewer
// multiplications than direct convolution. On AVX-512, oneDNN 2.6's F(4x4, 3x3) (fp32
// training, nChw16c tensors, so the backend reorders around it); Auto uses it where it
// wins: fp32, channels a multiple of 16, output at least 8x8. On AVX2, where oneDNN has
// none, the backend's own F(2x2, 3x3) kernels (src/backend/cpu/winograd_f2x3.h) on
// nChw8c, channels a multiple of 16, output at least 4x4. Winograd where neither
// applies (other layouts, bf16, other shapes) falls back to direct convolution.
// The GPU backend ignores it (cuDNN picks its own algorithms).
enum class ConvAlgo : uint8_t { Auto, Direct, Winograd };

struct BackendOptions {
  int threads = 0;  // 0 = all cores available to this process
  Precision precision = Precision::FP32;
  ConvAlgo conv_algo = ConvAlgo::Auto;
  // Activation layout. Unset: what the backend runs fastest here (CPU:
  // cpu_isa_defaults().layout(precision), i.e. nChw16c on AVX-512, nChw8c on AVX2, so
  // no activation is reordered around a convolution; CUDA: NHWC). Set: CPU nChw16c,
  // nChw8c, NHWC or NCHW; CUDA NHWC or NCHW. NCHW stays a CPU layout because users
  // select it (tools/parity/run_parity.py --layout nchw, the benchmarks' --layout) and
  // the CPU kernels need its paths anyway: the 3-channel input is NCHW under every
  // blocked layout (layout_for_channels).
  std::optional<Layout> layout;
  int device_index = 0;          // CUDA device
  // Bound on the CUDA backend's waits for its streams at teardown, so a stream stuck
  // behind a dead peer's collective cannot hang the exit: the collective deadline
  // (dist::collective_timeout_s(), RD_COLLECTIVE_TIMEOUT_S). Also the NCCL
  // communicator's deadline (make_nccl_comm).
  double collective_timeout_s = 600.0;
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opts = {});
// Throws rd::Error when the CUDA backend was not built or no device is visible.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts = {});
bool cuda_backend_available();  // built in and at least one device visible
int cuda_device_count();        // 0 when not built or no driver
bool cuda_backend_built();      // compiled in (a GPU may still be missing)
// Why no CUDA device is usable here, for messages: "the CUDA backend is not built ..."
// or "no CUDA device visible (<the runtime's reason>)". Empty when one is.
std::string cuda_unavailable_reason();

// The CUDA device index a rank uses: local_rank % visible. Under Slurm's
// --gpus-per-task=1 (or --gpu-bind=single:1) every rank sees exactly one GPU,
// index 0; with all of a node's GPUs visible, local rank i takes GPU i. Returns
// -1 when several GPUs are visible but fewer than the node's ranks (ranks would
// share a GPU, which NCCL refuses), or when none is visible.
inline int cuda_device_for_rank(int local_rank, int local_world, int visible) {
  if (visible <= 0 || local_rank < 0) return -1;
  if (visible > 1 && local_world > visible) return -1;
  return local_rank % visible;
}

}  // namespace rd
