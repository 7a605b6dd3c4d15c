// `resnet_ddp export --checkpoint FILE --out FILE.safetensors`: a checkpoint's weights
// as safetensors with torchvision's state_dict names, for PyTorch users without h5py
// and for any tool that reads safetensors. The tensors go through a model on the CPU
// backend rather than straight from file to file, so what is written has exactly the
// names, shapes and order the model (and the HDF5 writer) defines, whatever wrote the input.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/checkpoint.h"
#include "resnet_ddp/train/commands.h"
#include "resnet_ddp/train/report.h"
#include "train/safetensors.h"

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

// How to build the matching torchvision model, for a reader of the metadata.
std::string torchvision_recipe(const CheckpointMeta& m, ResNet& model) {
  if (m.arch == "resnet_tiny") return "none (resnet_tiny is a test model)";
  const std::string k = std::to_string(m.num_classes);
  if (m.head == "fc") return "torchvision.models." + m.arch + "(num_classes=" + k + ")";
  // The mlp head's first Linear is (C, C): C is the backbone's width.
  const long first = model.params().find("fc.0.weight");
  const std::string c = first >= 0 ? std::to_string(model.params().slice(static_cast<size_t>(first)).shape.vec()[1]) : "C";
  return "torchvision.models." + m.arch + "(); model.fc = torch.nn.Sequential(torch.nn.Linear(" + c + ", " + c +
         "), torch.nn.ReLU(), torch.nn.Linear(" + c + ", " + k + "))";
}

std::map<std::string, std::string> export_metadata(const CheckpointMeta& m, ResNet& model, const std::string& source) {
  std::map<std::string, std::string> md;
  md["format"] = "resnet_ddp";
  md["format_version"] = std::to_string(kCheckpointFormatVersion);
  md["arch"] = m.arch;
  md["head"] = m.head;
  md["num_classes"] = std::to_string(m.num_classes);
  md["torchvision_model"] = torchvision_recipe(m, model);
  if (!m.class_names.empty()) md["class_names"] = safetensors::json_string_array(m.class_names);
  // Preprocessing as the model was trained (docs/data.md): Resize((S, S)) with PIL's
  // antialiased bilinear, ToTensor to [0, 1], then (x - mean) / std per channel.
  if (m.image_size > 0) md["image_size"] = std::to_string(m.image_size);
  md["normalize"] = m.normalize;
  static const float zero[3] = {0, 0, 0}, one[3] = {1, 1, 1};
  const bool imagenet = m.normalize == "imagenet";
  md["normalize_mean"] = float_array(imagenet ? data::kImagenetMean : zero, 3);
  md["normalize_std"] = float_array(imagenet ? data::kImagenetStd : one, 3);
  if (m.image_size > 0)
    md["preprocessing"] = "Resize((" + std::to_string(m.image_size) + ", " + std::to_string(m.image_size) +
                          "), bilinear, antialias), ToTensor(), Normalize(normalize_mean, normalize_std)";
  if (m.epoch > 0) md["epoch"] = std::to_string(m.epoch);
  if (m.global_step > 0) md["global_step"] = std::to_string(m.global_step);
  if (m.best_val_acc >= 0) {
    md["best_val_acc"] = py_float(m.best_val_acc);
    md["best_val_loss"] = py_float(m.best_val_loss);
  }
  if (m.val_acc >= 0) {
    md["val_acc"] = py_float(m.val_acc);
    md["val_loss"] = py_float(m.val_loss);
  }
  md["created_by"] = std::string("resnet_ddp ") + RESNET_DDP_VERSION + " export";
  md["source"] = fs::path(source).filename().string();
  if (!m.created_by.empty()) md["source_created_by"] = m.created_by;
  return md;
}

void write_all(int fd, const void* data, size_t n, const std::string& tmp) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error("writing '" + tmp + "' failed: " + std::strerror(w < 0 ? errno : EIO));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// The file's bytes, in state_dict order: header, then each tensor from the model.
void write_safetensors(int fd, const std::string& tmp, ResNet& model, const std::map<std::string, std::string>& md) {
  const std::vector<StateEntry> order = state_dict_order(model);
  std::vector<safetensors::Entry> entries;
  uint64_t at = 0;
  for (const StateEntry& s : order) {
    safetensors::Entry e;
    e.name = s.name;
    if (s.arena) {
      e.dtype = safetensors::DType::F32;
      e.shape = s.arena->slice(s.slice).shape.vec();
    } else {
      e.dtype = safetensors::DType::I64;  // torch's num_batches_tracked: int64, shape ()
    }
    e.begin = at;
    e.end = at + static_cast<uint64_t>(e.numel()) * safetensors::dtype_size(e.dtype);
    at = e.end;
    entries.push_back(std::move(e));
  }
  const std::string header = safetensors::make_header(entries, md);
  write_all(fd, header.data(), header.size(), tmp);
  std::vector<float> host;
  for (const StateEntry& s : order) {
    if (!s.arena) {
      const int64_t nbt = model.num_batches_tracked();
      write_all(fd, &nbt, sizeof nbt, tmp);  // little-endian host (static_assert in safetensors.cpp)
      continue;
    }
    const ParamSlice& p = s.arena->slice(s.slice);
    host.resize(p.count);
    model.backend().copy_to_host(host.data(), s.arena->data() + p.offset, p.count * sizeof(float));
    write_all(fd, host.data(), p.count * sizeof(float), tmp);
  }
}

// Temp file in the destination's directory, fsync, rename, fsync of the directory: a
// failure or crash leaves either the old file or the complete new one.
void write_atomically(const std::string& out, ResNet& model, const std::map<std::string, std::string>& md) {
  const fs::path final_path(out);
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  std::string tmp_name = ".";  // built in steps: GCC 12 warns (-Wrestrict) on the one-line form
  tmp_name += final_path.filename().string();
  tmp_name += ".tmp." + std::to_string(getpid());
  const std::string tmp = (dir / tmp_name).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write '" + out + "': cannot create '" + tmp + "': " + std::strerror(errno));
  try {
    write_safetensors(fd, tmp, model, md);
    if (::fsync(fd) != 0) throw Error("fsync of '" + tmp + "' failed: " + std::strerror(errno));
    if (::close(fd) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw Error("closing '" + tmp + "' failed: " + std::strerror(err));
    }
  } catch (const Error& e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + out + "': " + e.what() + "; nothing was written");
  }
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + out + "': rename failed: " + std::strerror(err) + "; nothing was written");
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // durability of the rename only; the file itself is complete
    ::close(dfd);
  }
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
    CheckpointReader ck(o.checkpoint, true);  // full checkpoints and --init files alike
    const CheckpointMeta m = ck.meta();
    if (m.arch.empty() || m.head.empty() || m.num_classes <= 0 || m.num_classes > 1'000'000)
      throw UsageError("checkpoint '" + o.checkpoint +
                       "': no arch, head or valid num_classes in its metadata; export needs them to name the tensors "
                       "(an --init file from tools/torch_to_h5.py has them)");
    BackendOptions bo;
    bo.threads = 1;  // copying tensors needs no parallelism
    std::unique_ptr<Backend> backend = make_cpu_backend(bo);
    ResNetConfig mc;
    mc.arch = m.arch;
    mc.head = parse_head(m.head);
    mc.num_classes = static_cast<int>(m.num_classes);
    ResNet model(*backend, mc);
    ck.load_model(model, false);  // every tensor present, right shape, finite
    const auto md = export_metadata(m, model, o.checkpoint);
    write_atomically(o.out, model, md);
    std::printf("Exported %zu tensors (%s, %s head, %lld classes) from %s to %s\n", state_dict_order(model).size(),
                m.arch.c_str(), m.head.c_str(), static_cast<long long>(m.num_classes), o.checkpoint.c_str(),
                o.out.c_str());
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
