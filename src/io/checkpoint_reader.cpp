// The checkpoint reader (see checkpoint.h): the opener, which picks the tensor source
// and refuses damaged files, and the reads every command shares, over any source.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>

#include "io/checksum.h"
#include "io/contained.h"
#include "io/tensor_source.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/io/safetensors.h"
#include "resnet_ddp/nn/resnet.h"

namespace fs = std::filesystem;

namespace rd::io {

bool is_num_batches_tracked(const std::string& name) {
  static const std::string suffix = "num_batches_tracked";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::vector<std::string>& optimizer_state_names(OptimizerKind type) {
  static const std::vector<std::string> adam{"exp_avg", "exp_avg_sq"}, sgd{"momentum_buffer"},
      rmsprop{"square_avg", "momentum_buffer"};
  if (type == OptimizerKind::RmsProp) return rmsprop;
  return uses_adam_moments(type) ? adam : sgd;
}

namespace {

bool is_head_tensor(const std::string& name) { return name.rfind("fc.", 0) == 0; }

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw UsageError("checkpoint '" + path + "': " + what);
}

// Reads every tensor of the state_dict and of the optimizer groups `meta` names (so a
// damaged one shows); returns the state_dict's.
std::vector<TensorInfo> read_all_tensors(TensorSource& src, const CheckpointMeta& meta) {
  std::vector<float> staging;  // grows to the largest tensor
  auto read_group = [&](const std::string& group, std::vector<TensorInfo>* out) {
    for (const std::string& name : src.names(group)) {
      TensorInfo t;
      t.name = name;
      if (const std::optional<int64_t> c = src.counter(group, name)) {
        t.is_int64_scalar = true;
        t.int_value = *c;
      } else {
        t.shape = src.float_shape(group, name).value_or(std::vector<int64_t>{});
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        if (staging.size() < static_cast<size_t>(n)) staging.resize(static_cast<size_t>(n));
        src.read_floats(group, name, staging.data());
      }
      if (out) out->push_back(std::move(t));
    }
  };
  std::vector<TensorInfo> state_dict;
  read_group("state_dict", &state_dict);
  if (meta.optimizer.present)
    for (const std::string& n : optimizer_state_names(meta.optimizer.config.type))
      if (src.has_group("optimizer/" + n)) read_group("optimizer/" + n, nullptr);
  return state_dict;
}

// The message for an HDF5 file that failed its checksum. To say what is damaged, HDF5
// reads it, in a child process (contained.h says why); the child opens the HDF5 source
// directly, so nothing here runs twice.
std::string describe_damage(const std::string& path, const std::string& problem) {
  constexpr int kProbeTimeoutS = 120;
  const std::string base = "checkpoint '" + path + "': " + problem + " (file damaged or incompletely copied)";
  const ContainedResult r = run_contained(
      [&]() -> std::string {
        try {
          std::unique_ptr<TensorSource> src = open_hdf5_source(path);
          (void)read_all_tensors(*src, src->read_meta(false));
        } catch (const std::exception& e) {
          return e.what();
        }
        return "";
      },
      kProbeTimeoutS);
  switch (r.outcome) {
    case ContainedResult::TimedOut:
      return base + "; reading it hung (stopped after " + std::to_string(kProbeTimeoutS) + " s)";
    case ContainedResult::Crashed:
      return base + "; the HDF5 library crashed reading it (signal " + std::to_string(r.signal) +
             ", contained in a child process)";
    case ContainedResult::Returned:
      if (!r.message.empty()) return r.message + " [" + problem + "]";
      return base;
    default: return base;
  }
}

// The opener: which source reads `path`, after refusing what must not be parsed
// (a legacy PyTorch pickle; an HDF5 file of ours that fails its checksum).
std::unique_ptr<TensorSource> open_source(const std::string& path, bool ema) {
  std::error_code ec;
  if (!fs::exists(path, ec)) bad_file(path, "no such file");
  if (fs::is_directory(path, ec)) bad_file(path, "is a directory");
  if (const std::string torch = safetensors::torch_file_problem(path); !torch.empty()) bad_file(path, torch);
  const safetensors::Kind kind = safetensors::sniff(path);
  if (kind == safetensors::Kind::Safetensors) return open_safetensors_source(path);
  if (kind == safetensors::Kind::TorchZip) return open_torch_source(path, ema);
  // Before HDF5 parses anything: a damaged file of ours never reaches HDF5 in this process.
  if (const std::string problem = checksum_problem(path); !problem.empty()) {
    // Several readers open the same file in turn (info tries full, then weights-only):
    // one probe per damaged file. `problem` holds the CRC or size found, so a file
    // damaged differently is probed again.
    static std::mutex mutex;
    static std::string last_key, last_message;
    std::lock_guard<std::mutex> lock(mutex);
    if (const std::string key = path + '\n' + problem; key != last_key) {
      last_message = describe_damage(path, problem);
      last_key = key;
    }
    throw UsageError(last_message);
  }
  return open_hdf5_source(path);
}

}  // namespace

struct CheckpointReader::Impl {
  std::string path;
  std::unique_ptr<TensorSource> src;
  CheckpointMeta meta;
  std::string weights = "state_dict";  // the group load_model reads: "state_dict" or "model_ema"
  std::string origin;

  [[noreturn]] void bad(const std::string& what) const { bad_file(path, what); }
  void load_arena(Arena& arena, const char* kind, bool allow_head_mismatch, Backend& be,
                  std::vector<std::string>& skipped);
  int64_t num_batches_tracked();
};

CheckpointReader::CheckpointReader(const std::string& path, bool weights_only, Weights weights)
    : impl_(std::make_unique<Impl>()) {
  Impl& r = *impl_;
  r.path = path;
  const bool ema = weights == Weights::Ema;
  r.src = open_source(path, ema);
  r.meta = r.src->read_meta(weights_only);
  if (ema) {
    r.weights = "model_ema";
    if (r.meta.container == "safetensors")
      r.bad("a safetensors file holds one set of weights and no weight EMA (a file from export --ema holds the EMA "
            "as its weights: read it without --ema / --init-ema)");
    if (r.meta.container == "hdf5" && (!r.meta.ema.present || !r.src->has_group("model_ema")))
      r.bad("has no weight EMA (/model_ema): only a run with --model-ema writes one, in its last.h5 (best_model.h5 "
            "holds the model's weights only)");
  }
  r.origin = r.src->origin(r.weights);
}
CheckpointReader::~CheckpointReader() = default;

const std::string& CheckpointReader::path() const { return impl_->path; }
const CheckpointMeta& CheckpointReader::meta() const { return impl_->meta; }
const std::string& CheckpointReader::weights_origin() const { return impl_->origin; }

std::vector<TensorInfo> CheckpointReader::check_tensors() { return read_all_tensors(*impl_->src, impl_->meta); }

// Each slice of `arena` from the state_dict tensor of its name, shape checked, finite.
void CheckpointReader::Impl::load_arena(Arena& arena, const char* kind, bool allow_head_mismatch, Backend& be,
                                        std::vector<std::string>& skipped) {
  std::vector<float> staging;  // grows to the largest tensor
  for (size_t i = 0; i < arena.slices().size(); ++i) {
    const ParamSlice& s = arena.slice(i);
    const std::optional<std::vector<int64_t>> shape = src->float_shape(weights, s.name);
    if (!shape || *shape != s.shape.vec()) {
      if (allow_head_mismatch && is_head_tensor(s.name)) {
        skipped.push_back(s.name);
        continue;
      }
      const std::string in = weights == "state_dict" ? "" : " in " + origin;
      if (!shape) bad(std::string("missing ") + kind + " '" + s.name + "'" + in + " (different arch or head?)");
      bad("'" + s.name + "'" + in + " has shape " + Shape::from(*shape).str() + ", the model expects " + s.shape.str());
    }
    if (staging.size() < s.count) staging.resize(s.count);
    src->read_floats(weights, s.name, staging.data());
    for (size_t k = 0; k < s.count; ++k)
      if (!std::isfinite(staging[k])) bad("'" + s.name + "' contains NaN or Inf");
    be.copy_from_host(arena.ptr(i), staging.data(), s.count * sizeof(float));
  }
}

// All BNs count the same batches; torchvision stores one counter per BN. -1 when none.
int64_t CheckpointReader::Impl::num_batches_tracked() {
  // Our /model_ema keeps the average's counter as an attribute (meta.ema).
  if (weights == "model_ema" && meta.container == "hdf5") return meta.ema.num_batches_tracked;
  int64_t nbt = -1;
  for (const std::string& name : src->names(weights)) {
    if (!is_num_batches_tracked(name)) continue;
    if (const std::optional<int64_t> c = src->counter(weights, name)) nbt = std::max(nbt, *c);
    else (void)src->float_shape(weights, name);  // a float counter is fine; anything else is refused
  }
  return nbt;
}

std::vector<std::string> CheckpointReader::load_model(ResNet& model, bool allow_head_mismatch) {
  Impl& r = *impl_;
  Backend& be = model.backend();
  std::vector<std::string> skipped;
  r.load_arena(model.params(), "parameter", allow_head_mismatch, be, skipped);
  r.load_arena(model.buffers(), "buffer", allow_head_mismatch, be, skipped);
  // A head left at its fresh init must not keep half of an old head: all or nothing.
  if (!skipped.empty()) {
    const Arena& params = model.params();
    for (size_t i = 0; i < params.slices().size(); ++i) {
      const std::string& n = params.slice(i).name;
      if (is_head_tensor(n) && std::find(skipped.begin(), skipped.end(), n) == skipped.end())
        r.bad("head tensors only partly match ('" + n + "' fits, '" + skipped.front() +
              "' does not); convert the file with a matching head or drop its head");
    }
  }
  if (const int64_t nbt = r.num_batches_tracked(); nbt >= 0) model.set_num_batches_tracked(nbt);
  be.synchronize();
  return skipped;
}

void CheckpointReader::load_optimizer(ResNet& model, const OptimizerState& into) {
  Impl& r = *impl_;
  const OptimizerState& o = r.meta.optimizer;
  const OptimizerKind type = o.config.type;
  if (r.meta.container == "safetensors")
    r.bad("holds weights only (a safetensors file has no optimizer state), so training cannot resume from it; "
          "to train from these weights use --init " + r.path);
  if (!o.present)
    r.bad("has no /optimizer state to resume from (a best_model.h5 holds the weights only; its run's optimizer "
          "state is in that run's last.h5): resume from last.h5, or train from these weights with --init " + r.path);
  if (type != into.config.type)
    r.bad("optimizer state is for --optimizer " + name_of(optimizer_names(), type) + ", this run uses --optimizer " +
          name_of(optimizer_names(), into.config.type));
  Backend& be = model.backend();
  const Arena& params = model.params();
  std::vector<float> staging;
  for (const StateTensor& t : into.tensors) {
    const std::string group = "optimizer/" + t.name;
    const auto& known = optimizer_state_names(type);
    if (std::find(known.begin(), known.end(), t.name) == known.end() || !r.src->has_group(group)) {
      // SGD before its first step has no momentum buffer; anything else is damage.
      if (momentum_seeded_by_first_step(type) && o.step == 0) continue;
      r.bad("missing optimizer state '" + t.name + "'");
    }
    for (size_t i = 0; i < params.slices().size(); ++i) {
      const ParamSlice& s = params.slice(i);
      const std::optional<std::vector<int64_t>> shape = r.src->float_shape(group, s.name);
      if (!shape) r.bad("missing optimizer state " + t.name + "/" + s.name);
      if (*shape != s.shape.vec()) r.bad("optimizer state " + t.name + "/" + s.name + " has the wrong shape");
      if (staging.size() < s.count) staging.resize(s.count);
      r.src->read_floats(group, s.name, staging.data());
      be.copy_from_host(t.data + s.offset, staging.data(), s.count * sizeof(float));
    }
  }
  be.synchronize();
}

void CheckpointReader::load_ema(ResNet& model, const EmaState& into) {
  Impl& r = *impl_;
  if (!r.meta.ema.present || !r.src->has_group("model_ema")) r.bad("has no /model_ema (the weight EMA) to resume from");
  Backend& be = model.backend();
  std::vector<float> staging;
  for (const StateEntry& e : state_dict_order(model)) {
    if (!e.arena) continue;  // num_batches_tracked: an attribute of the group (meta.ema)
    const ParamSlice& s = e.arena->slice(e.slice);
    const std::optional<std::vector<int64_t>> shape = r.src->float_shape("model_ema", e.name);
    if (!shape) r.bad("missing model_ema/" + e.name);
    if (*shape != s.shape.vec()) r.bad("model_ema/" + e.name + " has the wrong shape");
    if (staging.size() < s.count) staging.resize(s.count);
    r.src->read_floats("model_ema", e.name, staging.data());
    float* base = e.arena == &model.params() ? into.params : into.buffers;
    be.copy_from_host(base + s.offset, staging.data(), s.count * sizeof(float));
  }
  be.synchronize();
}

// ---- fit ------------------------------------------------------------------------------

ResNetConfig model_config(const CheckpointMeta& m) {
  ResNetConfig mc;
  mc.arch = m.arch;
  mc.head = parse_head(m.head);
  mc.num_classes = static_cast<int>(m.num_classes);
  return mc;
}

void check_compatible(const CheckpointMeta& m, ResNet& model, const std::vector<std::string>& class_names,
                      const std::string& path) {
  const ResNetConfig& cfg = model.config();
  auto bad = [&](const std::string& what) {
    throw UsageError("checkpoint '" + path + "' does not match this run: " + what);
  };
  if (m.arch != cfg.arch) bad("it was trained with --arch " + m.arch + ", this run uses --arch " + cfg.arch);
  if (m.head != head_name(cfg.head))
    bad("it was trained with --head " + m.head + ", this run uses --head " + head_name(cfg.head));
  if (m.num_classes != cfg.num_classes)
    bad("it has " + std::to_string(m.num_classes) + " classes, the dataset has " + std::to_string(cfg.num_classes));
  if (!class_names.empty() && m.class_names != class_names) {
    std::string diff;
    for (size_t i = 0; i < class_names.size() && i < m.class_names.size(); ++i)
      if (class_names[i] != m.class_names[i]) {
        diff = "class " + std::to_string(i) + " is '" + m.class_names[i] + "' there, '" + class_names[i] + "' here";
        break;
      }
    bad("class names differ (" + diff + ")");
  }
}

}  // namespace rd::io
