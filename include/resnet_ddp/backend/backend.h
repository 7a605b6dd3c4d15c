// Backend: every operation ResNet training needs, behind one interface, so the
// model, DDP, data and checkpoint code are shared by the CPU (oneDNN + OpenMP)
// and CUDA (cuDNN + cuBLAS + kernels/) implementations.
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
#include <string>

#include "resnet_ddp/math/optim.h"
#include "resnet_ddp/tensor.h"

namespace rd {

struct ConvGeometry {
  int kernel = 3;
  int stride = 1;
  int pad = 1;
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
// contract (src/core/backend_contract.cpp: rank, layout, dtype, device, shapes,
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

  // ---- memory -------------------------------------------------------------
  // Zero-initialised device allocation; freed when the last reference drops.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
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

  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(float* dst, float value, size_t count) = 0;
  // Host NCHW float data <-> an activation in this backend's layout.
  void copy_from_host_nchw(const float* src, Tensor& dst);
  void copy_to_host_nchw(const Tensor& src, float* dst);
  // Host uint8 images, N x H x W x 3 (HWC per image, 0..255) -> activation
  // (N, 3, H, W) scaled to [0, 1], i.e. torchvision's ToTensor.
  // mean/std (3 floats each, host) apply torchvision's Normalize afterwards when given.
  void images_u8_to_activation(const uint8_t* src_nhwc, Tensor& dst, const float* mean = nullptr,
                               const float* std = nullptr);
  virtual void synchronize() = 0;

  // ---- convolution (no bias: ResNet convs are followed by batch norm) --------
  // w: RowMajor F32 (O, I, k, k), PyTorch's layout.
  void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g);
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g);
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                               bool accumulate);

  // ---- batch norm (optionally fused with ReLU on the output) -----------------
  // Training mode: normalises with batch statistics (summed over ranks through
  // `a.sync` when given), updates running stats with PyTorch's momentum rule and
  // unbiased variance, fills `saved` for backward.
  void batchnorm_forward_train(const Tensor& x, const BatchNormArgs& a, Tensor& y, BatchNormSaved& saved);
  void batchnorm_forward_eval(const Tensor& x, const BatchNormArgs& a, Tensor& y);
  // `y` is the forward output (its sign gives the ReLU mask when relu is fused).
  // With `a.sync`, dx uses the all-reduced sums, but dgamma/dbeta stay this rank's
  // local sums (DDP averages them with the other gradients).
  void batchnorm_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const BatchNormArgs& a,
                          const BatchNormSaved& saved, Tensor& dx, const BatchNormGrads& grads);

  // ---- elementwise ----------------------------------------------------------
  // x: an activation or a matrix (the MLP head's hidden layer).
  void relu_forward(const Tensor& x, Tensor& y);
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
  // y = relu(a + b) (relu optional); backward gives the gradient both inputs share.
  void add_forward(const Tensor& a, const Tensor& b, bool relu, Tensor& y);
  void add_backward(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum);
  // dst += src (same shape, layout and dtype): gradient of a branch point.
  void accumulate(const Tensor& src, Tensor& dst);

  // ---- pooling --------------------------------------------------------------
  // Max pool (kernel, stride, pad); `indices` is backend-private workspace that
  // forward fills and backward reads: allocate with maxpool_workspace_bytes.
  virtual size_t maxpool_workspace_bytes(const Tensor& y) = 0;
  void maxpool_forward(const Tensor& x, Tensor& y, int kernel, int stride, int pad, void* workspace);
  void maxpool_backward(const Tensor& dy, Tensor& dx, int kernel, int stride, int pad,
                        const void* workspace);
  // Global average pool: activation (N, C, H, W) -> matrix (N, C).
  void global_avgpool_forward(const Tensor& x, Tensor& y);
  void global_avgpool_backward(const Tensor& dy, Tensor& dx);

  // ---- linear: y = x W^T + b, x (N, in), W (out, in) --------------------------
  void linear_forward(const Tensor& x, const Tensor& w, const float* b, Tensor& y);
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       float* db, bool accumulate);

  // ---- loss: mean label-smoothed softmax cross-entropy over the batch ---------
  // logits (N, K) RowMajor, labels on the host. Writes d(mean loss)/d(logits)
  // * grad_scale into dlogits (if non-null), the per-row argmax into
  // predictions (host, may be null); returns the *sum* of row losses.
  double softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing, float grad_scale,
                      Tensor* dlogits, int32_t* predictions);

  // ---- optimizers over a flat arena slice (params, grads, state on device) ----
  void adam_step(float* params, const float* grads, float* m, float* v, size_t count,
                 const math::AdamArgs& a);
  // momentum_buf may be null when h.momentum == 0.
  void sgd_step(float* params, const float* grads, float* momentum_buf, size_t count,
                const math::SgdHyper& h);
  virtual void scale(float* data, float factor, size_t count) = 0;
  // Returns true when every element is finite.
  virtual bool all_finite(const float* data, size_t count) = 0;
  // data *= factor, then true when every element is finite: fp16 loss-scale
  // unscaling plus the overflow check. The default makes two passes; a backend
  // may do both in one.
  virtual bool unscale_and_check(float* data, float factor, size_t count) {
    scale(data, factor, count);
    return all_finite(data, count);
  }

 protected:
  // The implementations, called after the contract holds. Forwarding decorators
  // override these (ForwardingBackend), never the public operations.
  virtual void copy_from_host_nchw_impl(const float* src, Tensor& dst) = 0;
  virtual void copy_to_host_nchw_impl(const Tensor& src, float* dst) = 0;
  virtual void images_u8_to_activation_impl(const uint8_t* src_nhwc, Tensor& dst, const float* mean,
                                            const float* std) = 0;
  virtual void conv2d_forward_impl(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) = 0;
  virtual void conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, Tensor& dx,
                                         const ConvGeometry& g) = 0;
  virtual void conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, Tensor& dw,
                                            const ConvGeometry& g, bool accumulate) = 0;
  virtual void batchnorm_forward_train_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y,
                                            BatchNormSaved& saved) = 0;
  virtual void batchnorm_forward_eval_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y) = 0;
  virtual void batchnorm_backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy,
                                       const BatchNormArgs& a, const BatchNormSaved& saved, Tensor& dx,
                                       const BatchNormGrads& grads) = 0;
  virtual void relu_forward_impl(const Tensor& x, Tensor& y) = 0;
  virtual void relu_backward_impl(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;
  virtual void add_forward_impl(const Tensor& a, const Tensor& b, bool relu, Tensor& y) = 0;
  virtual void add_backward_impl(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum) = 0;
  virtual void accumulate_impl(const Tensor& src, Tensor& dst) = 0;
  virtual void maxpool_forward_impl(const Tensor& x, Tensor& y, int kernel, int stride, int pad,
                                    void* workspace) = 0;
  virtual void maxpool_backward_impl(const Tensor& dy, Tensor& dx, int kernel, int stride, int pad,
                                     const void* workspace) = 0;
  virtual void global_avgpool_forward_impl(const Tensor& x, Tensor& y) = 0;
  virtual void global_avgpool_backward_impl(const Tensor& dy, Tensor& dx) = 0;
  virtual void linear_forward_impl(const Tensor& x, const Tensor& w, const float* b, Tensor& y) = 0;
  virtual void linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                    Tensor& dw, float* db, bool accumulate) = 0;
  virtual double softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                   float grad_scale, Tensor* dlogits, int32_t* predictions) = 0;
  virtual void adam_step_impl(float* params, const float* grads, float* m, float* v, size_t count,
                              const math::AdamArgs& a) = 0;
  virtual void sgd_step_impl(float* params, const float* grads, float* momentum_buf, size_t count,
                             const math::SgdHyper& h) = 0;
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
  // CPU: NCHW16C (what the trainer uses: oneDNN's native blocked format, so no
  // activation is ever reordered around a convolution), NHWC or NCHW. CUDA: NHWC.
  Layout layout = Layout::NHWC;
  int device_index = 0;          // CUDA device
};

// What the CPU backend runs natively on this machine, from the ISA oneDNN reports
// (dnnl::get_effective_cpu_isa(), which honours the DNNL_MAX_CPU_ISA cap). oneDNN 2.6's
// fast kernels differ per ISA, and a layout or algorithm it has no kernel for falls to
// reference code 100x slower (ResNet-34@244 under the AVX2 cap with nChw16c: 3 steps
// > 600 s), so the defaults follow the ISA:
//   AVX-512 (core, VNNI, BF16, AMX): fp32 nChw16c + Winograd 3x3 (no reorders around any
//     convolution). bf16 with AMX: NHWC (oneDNN runs bf16 convolutions on AMX only for
//     NHWC; nChw16c bf16 measured 3.5x slower). bf16 without AMX: nChw16c, and 3x3
//     stride-1 convolutions stay fp32 Winograd (faster than AVX512-BF16 direct).
//   AVX2 and older: nChw8c + direct convolutions (oneDNN's AVX2 kernels are fastest on
//     nChw8c; it has no nChw16c or Winograd kernels there). No bf16 instructions.
struct CpuIsaDefaults {
  std::string isa;         // oneDNN's name for it, e.g. "avx2", "avx512_core_amx"
  bool avx512 = false;     // nChw16c and Winograd run natively
  bool bf16 = false;       // bf16 convolutions run natively (AVX512-BF16 or AMX)
  // bf16 mode keeps fp32 Winograd for 3x3 stride-1 convolutions: true without AMX,
  // where oneDNN's bf16 direct kernels are slower than fp32 Winograd.
  bool winograd_in_bf16 = false;
  Layout fp32_layout = Layout::NHWC;
  Layout bf16_layout = Layout::NHWC;
  Layout layout(Precision p) const { return p == Precision::BF16 ? bf16_layout : fp32_layout; }
};
CpuIsaDefaults cpu_isa_defaults();  // implemented by the CPU backend (needs oneDNN)
// The CPU activation layout the trainer uses for a precision on this CPU.
inline Layout default_cpu_layout(Precision p) { return cpu_isa_defaults().layout(p); }

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
