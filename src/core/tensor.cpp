#include "resnet_ddp/tensor.h"

#include <sstream>

#include "resnet_ddp/errors.h"

namespace rd {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
  }
  return "?";
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::RowMajor: return "rowmajor";
    case Layout::NCHW: return "NCHW";
    case Layout::NHWC: return "NHWC";
    case Layout::NCHW16C: return "nChw16c";
    case Layout::NCHW8C: return "nChw8c";
  }
  return "?";
}

const char* device_name(DeviceKind d) { return d == DeviceKind::CPU ? "cpu" : "cuda"; }

Shape::Shape(std::initializer_list<int64_t> dims) {
  RD_CHECK(dims.size() <= 4, "Shape supports at most 4 dimensions, got " << dims.size());
  rank = static_cast<int>(dims.size());
  int i = 0;
  for (int64_t v : dims) d[static_cast<size_t>(i++)] = v;
}

Shape Shape::from(const std::vector<int64_t>& dims) {
  RD_CHECK(dims.size() <= 4, "Shape supports at most 4 dimensions, got " << dims.size());
  Shape s;
  s.rank = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) s.d[i] = dims[i];
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= d[static_cast<size_t>(i)];
  return n;
}

std::vector<int64_t> Shape::vec() const { return std::vector<int64_t>(d.begin(), d.begin() + rank); }

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << d[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (d[static_cast<size_t>(i)] != o.d[static_cast<size_t>(i)]) return false;
  return true;
}

int64_t storage_elems(const Shape& s, Layout layout) {
  const int64_t b = channel_block(layout);
  if (b > 1 && s.rank == 4) return s[0] * ((s[1] + b - 1) / b * b) * s[2] * s[3];
  return s.numel();
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, DeviceKind device, Layout layout) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  t.device = device;
  t.layout = layout;
  t.data = data;
  return t;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << shape.str() << " " << layout_name(layout) << " " << device_name(device);
  return os.str();
}

}  // namespace rd
