// Where a checkpoint's metadata and tensors come from: an HDF5 file (ours, h5py's,
// tools/torch_to_h5.py's), a safetensors file or a PyTorch .pth (torch.save zip). CheckpointReader works over this
// interface only; each source words its own errors (they name the file).
//
// Tensors are addressed by group and name: "state_dict" holds the model's, and an
// HDF5 checkpoint's "optimizer/<state>" groups (exp_avg, ...) hold one tensor per
// parameter. A safetensors or .pth file has the state_dict only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "resnet_ddp/io/checkpoint.h"

namespace rd::io {

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // Everything but the tensors, checked. weights_only: an --init file, which may lack
  // what only resuming, predict and info's full view need.
  virtual CheckpointMeta read_meta(bool weights_only) = 0;
  virtual bool has_group(const std::string& group) = 0;
  // Where `group`'s tensors are, for messages ("/model_ema", "checkpoint['model_ema']").
  virtual std::string origin(const std::string& group) const { return "/" + group; }
  // The tensors of `group`, in file order.
  virtual std::vector<std::string> names(const std::string& group) = 0;
  // A BN's num_batches_tracked stored as an integer: its value; nullopt for any other
  // tensor (a float one is read as floats).
  virtual std::optional<int64_t> counter(const std::string& group, const std::string& name) = 0;
  // The shape of float tensor group/name, nullopt when absent; throws when it is there
  // but not floating point.
  virtual std::optional<std::vector<int64_t>> float_shape(const std::string& group, const std::string& name) = 0;
  // Reads float tensor group/name (as many floats as its shape holds) into `out`.
  virtual void read_floats(const std::string& group, const std::string& name, float* out) = 0;
};

// An HDF5 file, opened without looking at its checksum header (the opener in
// checkpoint_reader.cpp verifies it first). Throws rd::UsageError("checkpoint 'PATH': ...").
std::unique_ptr<TensorSource> open_hdf5_source(const std::string& path);
// A safetensors file (validated when opened).
std::unique_ptr<TensorSource> open_safetensors_source(const std::string& path);
// A torch.save zip archive holding a state_dict (torch_pth.h; validated when opened).
// ema: the training checkpoint's weight EMA instead, as group "model_ema".
std::unique_ptr<TensorSource> open_torch_source(const std::string& path, bool ema = false);

// Names shared by the sources and the reader.
bool is_num_batches_tracked(const std::string& name);
const std::vector<std::string>& optimizer_state_names(OptimizerKind type);

}  // namespace rd::io
