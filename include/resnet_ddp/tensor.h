// Tensor: a typed, shaped view of memory owned by a Backend allocation.
//
// Shapes are always *logical* (N, C, H, W) for 4-D activations and (N, K) for
// matrices; how the elements sit in memory is described by `layout`, which the
// backend chooses (NCHW, NHWC, or oneDNN's channel-blocked nChw16c). Code outside
// a backend never indexes activation memory directly: it goes through the
// backend's copy_to_host_nchw / copy_from_host_nchw.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rd {

enum class DType : uint8_t { F32, BF16, F16, I32, U8 };
enum class DeviceKind : uint8_t { CPU, CUDA };
enum class Layout : uint8_t {
  RowMajor,  // plain C order for any rank (parameters, logits, 1-D vectors)
  NCHW,
  NHWC,
  NCHW16C,  // oneDNN nChw16c: channels padded to a multiple of 16 (AVX-512 kernels)
  NCHW8C,   // oneDNN nChw8c: channels padded to a multiple of 8 (AVX2 kernels)
};

// Channels per block of a channel-blocked layout (1 for the plain ones).
inline int64_t channel_block(Layout l) {
  return l == Layout::NCHW16C ? 16 : l == Layout::NCHW8C ? 8 : 1;
}

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* layout_name(Layout l);
const char* device_name(DeviceKind d);

struct Shape {
  std::array<int64_t, 4> d{0, 0, 0, 0};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape from(const std::vector<int64_t>& dims);

  int64_t operator[](int i) const { return d[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return d[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::vector<int64_t> vec() const;
  std::string str() const;  // "[16, 64, 61, 61]"
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
};

// Number of elements the storage needs for `shape` in `layout` (padding included).
int64_t storage_elems(const Shape& shape, Layout layout);

struct Tensor {
  Shape shape;
  DType dtype = DType::F32;
  DeviceKind device = DeviceKind::CPU;
  Layout layout = Layout::RowMajor;
  void* data = nullptr;
  std::shared_ptr<void> owner;  // keeps the allocation alive; empty for views
  size_t capacity = 0;          // bytes of the owning allocation (0 for views)

  int64_t numel() const { return shape.numel(); }
  int64_t storage_elems() const { return rd::storage_elems(shape, layout); }
  size_t nbytes() const { return static_cast<size_t>(storage_elems()) * dtype_size(dtype); }
  bool defined() const { return data != nullptr || numel() == 0; }

  float* f32() { return static_cast<float*>(data); }
  const float* f32() const { return static_cast<const float*>(data); }
  template <class T> T* as() { return static_cast<T*>(data); }
  template <class T> const T* as() const { return static_cast<const T*>(data); }

  // A non-owning view onto existing memory (e.g. a slice of a flat arena).
  static Tensor view(void* data, Shape shape, DType dtype = DType::F32,
                     DeviceKind device = DeviceKind::CPU, Layout layout = Layout::RowMajor);
  std::string describe() const;  // "f32[16, 64, 61, 61] NHWC cpu"
};

}  // namespace rd
