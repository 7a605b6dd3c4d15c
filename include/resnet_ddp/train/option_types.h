// The typed values of resnet_ddp's word-valued options (--device, --arch, --augment,
// --normalize, --progress, --verify-data, --resume's mode), each with the one table
// of its spellings. The flag parser reads the tables (accepted words, --help, error
// messages), so a value is checked once, at parse time, and the code that acts on it
// switches on the enum; name_of / value_of turn it into text and back where it is
// recorded (checkpoints, messages).
#pragma once

#include <string>

#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/name_table.h"

namespace rd::train {

enum class Device { Auto, Cpu, Cuda };  // auto = CUDA when every rank has a GPU
inline NameTable<Device> device_names() {
  return {{"auto", Device::Auto}, {"cpu", Device::Cpu}, {"cuda", Device::Cuda}};
}

// torchvision's model names; resnet_tiny: a miniature model for tests.
enum class Arch { ResNet18, ResNet34, ResNet50, ResNet101, ResNet152, WideResNet50_2, ResNeXt50_32x4d, ResNetTiny };
inline NameTable<Arch> arch_names() {
  return {{"resnet18", Arch::ResNet18},
          {"resnet34", Arch::ResNet34},
          {"resnet50", Arch::ResNet50},
          {"resnet101", Arch::ResNet101},
          {"resnet152", Arch::ResNet152},
          {"wide_resnet50_2", Arch::WideResNet50_2},
          {"resnext50_32x4d", Arch::ResNeXt50_32x4d},
          {"resnet_tiny", Arch::ResNetTiny}};
}

using Augment = data::TransformConfig::Augment;
inline NameTable<Augment> augment_names() {
  return {{"autoaugment", Augment::AutoAugment}, {"flip", Augment::Flip}, {"none", Augment::None}};
}

// --auto-augment, the reference preset's policy (torchvision's spelling; imagenet is the
// policy the tutorial's --augment autoaugment applies).
using AutoAugmentPolicy = data::TransformConfig::Policy;
inline NameTable<AutoAugmentPolicy> auto_augment_names() {
  return {{"none", AutoAugmentPolicy::None},
          {"imagenet", AutoAugmentPolicy::ImageNet},
          {"ta_wide", AutoAugmentPolicy::TrivialAugmentWide},
          {"ra", AutoAugmentPolicy::RandAugment}};
}

enum class Normalize { None, ImageNet };
inline NameTable<Normalize> normalize_names() { return {{"none", Normalize::None}, {"imagenet", Normalize::ImageNet}}; }

enum class ProgressMode { Auto, Bar, Lines, None };  // auto = bar on a terminal, else lines
inline NameTable<ProgressMode> progress_names() {
  return {{"auto", ProgressMode::Auto}, {"bar", ProgressMode::Bar}, {"lines", ProgressMode::Lines},
          {"none", ProgressMode::None}};
}

using VerifyData = data::ScanOptions::Verify;
inline NameTable<VerifyData> verify_data_names() {
  return {{"full", VerifyData::Full}, {"header", VerifyData::Header}};
}

// --resume auto | none | FILE.
enum class ResumeMode { Auto, None, File };

// The value spelled `name` in `table`; an rd::UsageError naming `flag` when none is
// (a checkpoint written by another version may record a value this one lacks).
template <class E>
E value_of(const NameTable<E>& table, const std::string& name, const std::string& flag) {
  std::string words;
  for (const auto& [n, v] : table) {
    if (n == name) return v;
    words += (words.empty() ? "" : "|") + n;
  }
  throw UsageError(flag + ": expected one of " + words + ", got '" + name + "'");
}

}  // namespace rd::train
