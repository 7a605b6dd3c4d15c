// The command-line spellings of the backend's options, one table per enumeration,
// shared by every program's FlagSet::enumeration (resnet_ddp train, the benchmarks,
// the parity driver), so a value is spelled the same everywhere.
#pragma once

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/name_table.h"

namespace rd {

inline NameTable<Precision> precision_names() {
  return {{"fp32", Precision::FP32}, {"tf32", Precision::TF32}, {"fp16", Precision::FP16}, {"bf16", Precision::BF16}};
}
inline NameTable<ConvAlgo> conv_algo_names() {
  return {{"auto", ConvAlgo::Auto}, {"direct", ConvAlgo::Direct}, {"winograd", ConvAlgo::Winograd}};
}
inline NameTable<Layout> layout_names() {
  return {{"nchw16c", Layout::NCHW16C}, {"nchw8c", Layout::NCHW8C}, {"nhwc", Layout::NHWC}, {"nchw", Layout::NCHW}};
}

}  // namespace rd
