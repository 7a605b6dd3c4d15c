// The command-line spellings of the backend's options, one table per enumeration,
// shared by every program's FlagSet::enumeration (resnet_ddp train, the benchmarks,
// the parity driver), so a value is spelled the same everywhere.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "resnet_ddp/backend/backend.h"

namespace rd {

template <class E>
using NameTable = std::vector<std::pair<std::string, E>>;

inline NameTable<Precision> precision_names() {
  return {{"fp32", Precision::FP32}, {"tf32", Precision::TF32}, {"fp16", Precision::FP16}, {"bf16", Precision::BF16}};
}
inline NameTable<ConvAlgo> conv_algo_names() {
  return {{"auto", ConvAlgo::Auto}, {"direct", ConvAlgo::Direct}, {"winograd", ConvAlgo::Winograd}};
}
inline NameTable<Layout> layout_names() {
  return {{"nchw16c", Layout::NCHW16C}, {"nchw8c", Layout::NCHW8C}, {"nhwc", Layout::NHWC}, {"nchw", Layout::NCHW}};
}

// The spelling of `value` in `table` ("" when absent).
template <class E>
std::string name_of(const NameTable<E>& table, E value) {
  for (const auto& [name, v] : table)
    if (v == value) return name;
  return "";
}

}  // namespace rd
