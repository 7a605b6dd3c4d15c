// Flat parameter storage (llm.c style): every trainable parameter is a named
// slice of one contiguous buffer, and its gradient is the slice at the same
// offset of a second buffer. Gradient buckets are therefore plain [begin, end)
// ranges, an all-reduce needs no packing copies, and the optimizer is one pass.
// Non-trainable buffers (BN running stats) live in a third arena.
//
// Names follow torchvision's state_dict ("layer1.0.bn1.weight"), in the order
// the model registers them (the state_dict order), so checkpoints map 1:1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "resnet_ddp/tensor.h"

namespace rd {

class Backend;

struct ParamSlice {
  std::string name;
  Shape shape;
  size_t offset = 0;  // in floats, from the arena start
  size_t count = 0;
};

class Arena {
 public:
  // Registration phase: reserve a named slice; returns its index.
  size_t add(const std::string& name, const Shape& shape);
  // Allocate storage on `backend` (zero-filled). Registration is closed afterwards.
  void allocate(Backend& backend);

  bool allocated() const { return base_ != nullptr; }
  size_t size() const { return total_; }  // floats
  size_t bytes() const { return total_ * sizeof(float); }
  float* data() { return base_; }
  const float* data() const { return base_; }

  const std::vector<ParamSlice>& slices() const { return slices_; }
  const ParamSlice& slice(size_t i) const { return slices_.at(i); }
  // Index of the slice with this name, or -1.
  long find(const std::string& name) const;
  float* ptr(size_t i) { return base_ + slices_.at(i).offset; }
  const float* ptr(size_t i) const { return base_ + slices_.at(i).offset; }
  Tensor tensor(size_t i);  // RowMajor view of slice i

 private:
  std::vector<ParamSlice> slices_;
  std::unordered_map<std::string, size_t> by_name_;
  size_t total_ = 0;
  std::shared_ptr<void> storage_;
  float* base_ = nullptr;
  DeviceKind device_ = DeviceKind::CPU;
};

}  // namespace rd
