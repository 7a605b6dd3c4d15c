// The PyTorch (.pth, torch.save zip) tensor source (see tensor_source.h): a state_dict's
// tensors, no metadata. Errors from the file itself are "PyTorch file 'PATH': ...";
// uses it cannot serve (predict, --resume) are "checkpoint 'PATH': ...".
#include "io/tensor_source.h"
#include "io/torch_pth.h"
#include "resnet_ddp/errors.h"

namespace rd::io {

namespace {

class TorchSource final : public TensorSource {
 public:
  // ema: the tensors are the checkpoint's weight EMA, served as group "model_ema".
  TorchSource(const std::string& p, bool ema)
      : path(p),
        group(ema ? "model_ema" : "state_dict"),
        ar(torch_pth::Archive::open(p, ema ? torch_pth::Archive::Select::Ema : torch_pth::Archive::Select::Model)) {}

  CheckpointMeta read_meta(bool weights_only) override {
    if (!weights_only)
      throw UsageError("checkpoint '" + path + "': is a PyTorch state_dict (torch.save), which holds weights only: "
                       "no arch, head, class names or image size (predict, --eval-only --resume) and no optimizer "
                       "state (--resume). Train from it with --init " + path);
    CheckpointMeta m;
    m.container = "pytorch";
    m.created_by = "torch.save";
    return m;
  }
  bool has_group(const std::string& g) override { return g == group; }
  std::string origin(const std::string&) const override {
    return ar.key().empty() ? "the state_dict" : "checkpoint['" + ar.key() + "']";
  }
  std::vector<std::string> names(const std::string& g) override {
    std::vector<std::string> out;
    if (g == group)
      for (const torch_pth::Tensor& t : ar.tensors()) out.push_back(t.name);  // state_dict order
    return out;
  }
  std::optional<int64_t> counter(const std::string& g, const std::string& name) override {
    const torch_pth::Tensor* t = tensor(g, name);
    if (!t || !is_num_batches_tracked(name)) return std::nullopt;
    return ar.read_int_scalar(*t);
  }
  std::optional<std::vector<int64_t>> float_shape(const std::string& g, const std::string& name) override {
    const torch_pth::Tensor* t = tensor(g, name);
    if (!t) return std::nullopt;
    if (!torch_pth::is_float(t->dtype))
      ar.bad("tensor '" + name + "' has dtype " + torch_pth::dtype_name(t->dtype) +
             ", expected float32, float16, bfloat16 or float64");
    return t->shape;
  }
  void read_floats(const std::string& g, const std::string& name, float* out) override {
    ar.read_f32(*tensor(g, name), out);
  }

 private:
  std::string path;
  std::string group;
  torch_pth::Archive ar;

  const torch_pth::Tensor* tensor(const std::string& g, const std::string& name) const {
    return g == group ? ar.find(name) : nullptr;
  }
};

}  // namespace

std::unique_ptr<TensorSource> open_torch_source(const std::string& path, bool ema) {
  return std::make_unique<TorchSource>(path, ema);
}

}  // namespace rd::io
