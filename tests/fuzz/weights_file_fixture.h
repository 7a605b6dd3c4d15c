// The second half of the weights-file fuzz targets (.pth, .safetensors): the input's
// bytes written to a scratch file and read as --init and predict read it, through
// CheckpointReader (check_tensors, then load_model into a resnet_tiny). rd::Error is a
// clean refusal; anything else (a crash, a sanitizer report, a leak) is a finding.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "h5_edit.h"
#include "scratch_dir.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/nn/resnet.h"

namespace rd::fuzz {

struct WeightsFileFixture {
  ScratchDir scratch;
  const std::string path;
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<ResNet> model;

  // `file_name`'s extension picks the reader CheckpointReader uses.
  WeightsFileFixture(const std::string& prefix, const std::string& file_name)
      : scratch(prefix), path(scratch.path + "/" + file_name) {
    ResNetConfig cfg;
    cfg.arch = "resnet_tiny";
    cfg.num_classes = 3;
    model = std::make_unique<ResNet>(*be, cfg);
  }

  // weights_only: as --init reads it; otherwise as a full checkpoint (predict).
  void read_through_checkpoint_reader(const std::string& bytes, bool weights_only) {
    spit(path, std::vector<char>(bytes.begin(), bytes.end()));
    try {
      io::CheckpointReader r(path, weights_only);
      (void)r.check_tensors();
      (void)r.load_model(*model, true);
    } catch (const Error&) {
    }
  }
};

}  // namespace rd::fuzz
