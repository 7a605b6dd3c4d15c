// `resnet_ddp export --checkpoint FILE --out FILE.safetensors`: a checkpoint's weights
// as safetensors with torchvision's state_dict names, for PyTorch users without h5py
// and for any tool that reads safetensors. The tensors go through a model on the CPU
// backend rather than straight from file to file, so what is written has exactly the
// names, shapes and order the model (and the HDF5 writer) defines, whatever wrote the input.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <type_traits>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/io/safetensors.h"
#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/train/report.h"

namespace fs = std::filesystem;

namespace rd::train {

namespace {

// Shortest text that reads back as the same float32 (0.485f -> "0.485").
std::string float_text(float x) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string float_array(const float* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += float_text(v[i]);
  }
  return s + "]";
}

// How to build the matching torchvision model, for a reader of the metadata: Python
// that runs as it stands (tests/e2e/check_safetensors.py executes it) and leaves
// the model in `model`.
std::string torchvision_recipe(const io::CheckpointMeta& m, ResNet& model) {
  if (m.arch == "resnet_tiny") return "none (resnet_tiny is a test model)";
  const std::string k = std::to_string(m.num_classes);
  const std::string make = "import torch, torchvision; model = torchvision.models." + m.arch;
  if (m.head == "fc") return make + "(num_classes=" + k + ")";
  // The mlp head's first Linear is (C, C): C is the backbone's width.
  const long first = model.params().find("fc.0.weight");
  const std::string c = first >= 0 ? std::to_string(model.params().slice(static_cast<size_t>(first)).shape.vec()[1]) : "C";
  return make + "(); model.fc = torch.nn.Sequential(torch.nn.Linear(" + c + ", " + c +
         "), torch.nn.ReLU(), torch.nn.Linear(" + c + ", " + k + "))";
}

std::map<std::string, std::string> export_metadata(const io::CheckpointMeta& m, ResNet& model, const std::string& source,
                                                   const io::CheckpointReader& ck, bool ema) {
  std::map<std::string, std::string> md;
  md["format"] = "resnet_ddp";
  md[io::meta_key::format_version] = std::to_string(io::kCheckpointFormatVersion);
  md[io::meta_key::arch] = m.arch;
  md[io::meta_key::head] = m.head;
  md[io::meta_key::num_classes] = std::to_string(m.num_classes);
  md["torchvision_model"] = torchvision_recipe(m, model);
  if (!m.class_names.empty()) md[io::meta_key::class_names] = io::safetensors::json_string_array(m.class_names);
  // Preprocessing as the model was trained (docs/data.md): Resize((S, S)) with PIL's
  // antialiased bilinear, ToTensor to [0, 1], then (x - mean) / std per channel.
  if (m.image_size > 0) md[io::meta_key::image_size] = std::to_string(m.image_size);
  md[io::meta_key::normalize] = m.normalize;
  static const float zero[3] = {0, 0, 0}, one[3] = {1, 1, 1};
  const bool imagenet = m.normalize == "imagenet";
  md["normalize_mean"] = float_array(imagenet ? data::kImagenetMean : zero, 3);
  md["normalize_std"] = float_array(imagenet ? data::kImagenetStd : one, 3);
  if (m.val_crop_size > 0) {  // torchvision's eval preset
    md[io::meta_key::val_resize_size] = std::to_string(m.val_resize_size);
    md[io::meta_key::val_crop_size] = std::to_string(m.val_crop_size);
    md["preprocessing"] = "Resize(" + std::to_string(m.val_resize_size) + ", bilinear, antialias), CenterCrop(" +
                          std::to_string(m.val_crop_size) + "), ToTensor(), Normalize(normalize_mean, normalize_std)";
  } else if (m.image_size > 0) {
    md["preprocessing"] = "Resize((" + std::to_string(m.image_size) + ", " + std::to_string(m.image_size) +
                          "), bilinear, antialias), ToTensor(), Normalize(normalize_mean, normalize_std)";
  }
  io::for_each_position_field(static_cast<const io::RunPosition&>(m), [&](const io::PositionField& field, auto value) {
    if (!io::exported(field, m, value)) return;
    if constexpr (std::is_same_v<decltype(value), double>)
      md[field.name] = py_float(value);
    else
      md[field.name] = std::to_string(value);
  });
  if (m.val_acc >= 0) {
    md[io::meta_key::val_acc] = py_float(m.val_acc);
    md[io::meta_key::val_loss] = py_float(m.val_loss);
  }
  md[io::meta_key::created_by] = std::string("resnet_ddp ") + RESNET_DDP_VERSION + " export";
  md["source"] = fs::path(source).filename().string();
  // Which of the source's weights these are: its model's, or its weight EMA's.
  md["weights"] = ema ? "model_ema" : "model";
  md["weights_origin"] = ck.weights_origin();
  if (!m.created_by.empty()) md["source_created_by"] = m.created_by;
  return md;
}

void check_export_paths(const ExportOptions& o) {
  std::error_code ec;
  if (!fs::exists(o.checkpoint, ec)) throw UsageError("--checkpoint: no such file: '" + o.checkpoint + "'");
  if (fs::is_directory(o.checkpoint, ec))
    throw UsageError("--checkpoint: '" + o.checkpoint + "' is a directory, expected a checkpoint file");
  if (fs::path(o.out).extension() != ".safetensors")
    throw UsageError("--out: '" + o.out +
                     "' should end in .safetensors (export writes only that format; for a .pth use "
                     "tools/h5_to_torch.py)");
  if (fs::is_directory(o.out, ec)) throw UsageError("--out: '" + o.out + "' is a directory");
  if (fs::exists(o.out, ec) && fs::equivalent(o.checkpoint, o.out, ec))
    throw UsageError("--out: '" + o.out + "' is the input checkpoint itself; choose another file");
  const fs::path parent = fs::path(o.out).has_parent_path() ? fs::path(o.out).parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    throw UsageError("--out: directory '" + parent.string() + "' does not exist");
}

}  // namespace

int export_main(const ExportOptions& o) {
  try {
    check_export_paths(o);
    // Full checkpoints and --init files alike.
    io::CheckpointReader ck(o.checkpoint, true,
                            o.ema ? io::CheckpointReader::Weights::Ema : io::CheckpointReader::Weights::Model);
    const io::CheckpointMeta m = ck.meta();
    if (m.arch.empty() || m.head.empty() || m.num_classes <= 0 || m.num_classes > 1'000'000)
      throw UsageError("checkpoint '" + o.checkpoint +
                       "': no arch, head or valid num_classes in its metadata; export needs them to name the tensors "
                       "(an --init file from tools/torch_to_h5.py has them)");
    BackendOptions bo;
    bo.threads = 1;  // copying tensors needs no parallelism
    std::unique_ptr<Backend> backend = make_cpu_backend(bo);
    ResNet model(*backend, io::model_config(m));
    ck.load_model(model, false);  // every tensor present, right shape, finite
    const auto md = export_metadata(m, model, o.checkpoint, ck, o.ema);
    io::safetensors::write_model(o.out, model, md);
    const std::string what = o.ema ? " (its weight EMA, " + ck.weights_origin() + ")" : "";
    std::printf("Exported %zu tensors (%s, %s head, %lld classes) from %s%s to %s\n", io::state_dict_order(model).size(),
                m.arch.c_str(), m.head.c_str(), static_cast<long long>(m.num_classes), o.checkpoint.c_str(),
                what.c_str(), o.out.c_str());
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace rd::train
