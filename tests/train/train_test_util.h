// Helpers shared by the trainer tests (tests/train/test_*.cpp): a scratch directory,
// arena reads and a tiny model with non-initial state.
#pragma once
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/compare.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"

namespace rd::test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("rd_train_test_" + std::to_string(getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline std::vector<float> host(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.copy_to_host(v.data(), p, n * sizeof(float));
  return v;
}

// Slice-by-slice equality (the arena's alignment padding is not state).
inline bool same_slices(Backend& be, const Arena& layout, const float* a, const float* b) {
  for (const auto& s : layout.slices())
    if (host(be, a + s.offset, s.count) != host(be, b + s.offset, s.count)) {
      UNSCOPED_INFO("slice " << s.name << " differs");
      return false;
    }
  return true;
}

// A tiny model that has seen one training batch, so BN buffers and
// num_batches_tracked are not at their initial values.
inline std::unique_ptr<ResNet> trained_tiny(Backend& be, HeadKind head, int classes, uint64_t seed) {
  ResNetConfig cfg;
  cfg.arch = "resnet_tiny";
  cfg.head = head;
  cfg.num_classes = classes;
  auto m = std::make_unique<ResNet>(be, cfg);
  m->init_parameters(seed);
  m->train(true);
  Tensor& in = m->input_buffer(4, 32, 32);
  std::vector<float> x = rd::test::random_floats(static_cast<size_t>(4 * 3 * 32 * 32), seed + 1);
  be.copy_from_host_nchw(x.data(), in);
  m->forward(in);
  return m;
}

inline std::vector<float> eval_logits(ResNet& m, uint64_t seed) {
  Backend& be = m.backend();
  m.train(false);
  Tensor& in = m.input_buffer(2, 32, 32);
  std::vector<float> x = rd::test::random_floats(static_cast<size_t>(2 * 3 * 32 * 32), seed);
  be.copy_from_host_nchw(x.data(), in);
  const Tensor& y = m.forward(in);
  std::vector<float> out(static_cast<size_t>(y.numel()));
  be.copy_to_host(out.data(), y.data, out.size() * sizeof(float));
  return out;
}

inline io::CheckpointMeta tiny_meta(const std::string& head, int classes) {
  io::CheckpointMeta m;
  m.arch = "resnet_tiny";
  m.head = head;
  m.num_classes = classes;
  m.image_size = 32;
  m.epoch = 3;
  m.global_step = 42;
  m.best_val_acc = 0.75;
  m.best_val_loss = 0.5;
  m.val_acc = 0.625;
  m.val_loss = 0.6;
  m.world_size = 2;
  m.batch_size = 4;
  m.seed = 7;
  m.args = "resnet_ddp --data 'a b'";
  m.created_by = "test";
  for (int i = 0; i < classes; ++i) m.class_names.push_back("class_" + std::to_string(i));
  return m;
}

}  // namespace rd::test
