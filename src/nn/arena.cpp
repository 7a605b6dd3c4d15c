#include "resnet_ddp/nn/arena.h"

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"

namespace rd {

// Slices start on 64-byte boundaries so vector loops never straddle two slices;
// the few padding floats stay zero and are harmless in all-reduces.
static constexpr size_t kAlignFloats = 16;

size_t Arena::add(const std::string& name, const Shape& shape) {
  RD_CHECK(!allocated(), "Arena: cannot add '" << name << "' after allocation");
  RD_CHECK(!by_name_.count(name), "Arena: duplicate parameter name '" << name << "'");
  ParamSlice s;
  s.name = name;
  s.shape = shape;
  s.count = static_cast<size_t>(shape.numel());
  s.offset = (total_ + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  total_ = s.offset + s.count;
  by_name_[name] = slices_.size();
  slices_.push_back(s);
  return slices_.size() - 1;
}

void Arena::allocate(Backend& backend) {
  RD_CHECK(!allocated(), "Arena allocated twice");
  total_ = (total_ + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  storage_ = backend.allocate(std::max<size_t>(total_, 1) * sizeof(float));
  base_ = static_cast<float*>(storage_.get());
  device_ = backend.device();
}

long Arena::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<long>(it->second);
}

Tensor Arena::tensor(size_t i) {
  const ParamSlice& s = slices_.at(i);
  return Tensor::view(base_ + s.offset, s.shape, DType::F32, device_, Layout::RowMajor);
}

}  // namespace rd
