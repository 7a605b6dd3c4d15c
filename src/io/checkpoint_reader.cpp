#include "resnet_ddp/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/h5.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "train/checksum.h"
#include "train/latch_driver.h"
#include "train/safetensors.h"

namespace fs = std::filesystem;

namespace rd::train {

using h5::Id;

namespace {

// HDF5's error printing goes off for good (not per scope, as h5::Quiet does): a
// CheckpointReader outlives any one scope, and we print our own messages.
void quiet_hdf5() {
  static const bool once = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0;
  (void)once;
}

// ---- writing ---------------------------------------------------------------------

// The writer's failures all end here; a system call that failed under HDF5 (and was
// reported to it as a success) names itself.
struct Writer {
  Backend& be;
  IoLatch io;
  std::vector<float> staging;  // grows to the largest tensor

  [[noreturn]] void failed(const std::string& what) const {
    if (io.err) throw WriteError(what + ": " + io.op + " failed: " + std::strerror(io.err));
    throw WriteError(what);
  }
  void check(herr_t status, const std::string& what) const {
    if (status < 0) failed(what);
  }
  void check_io(const std::string& what) const {
    if (io.err) failed(what);
  }
  Id id(hid_t id, herr_t (*closer)(hid_t), const std::string& what) const {
    if (id < 0) failed(what);
    return Id(id, closer);
  }

  void str(hid_t obj, const char* name, const std::string& value) {
    Id type = h5::vlen_string_type();
    const char* p = value.c_str();
    if (!h5::write_attr(obj, name, type, type, &p)) failed(std::string("attribute ") + name);
  }
  void i64(hid_t obj, const char* name, int64_t v) {
    if (!h5::write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v)) failed(std::string("attribute ") + name);
  }
  void f64(hid_t obj, const char* name, double v) {
    if (!h5::write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v)) failed(std::string("attribute ") + name);
  }

  // Groups remember creation order, so h5py and h5dump list tensors in state_dict order.
  Id group(hid_t parent, const std::string& name) {
    Id gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
    H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    return id(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose, "group " + name);
  }

  void int64_scalar(hid_t group, const std::string& name, int64_t v) {
    Id space = id(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
    Id d = id(H5Dcreate2(group, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              H5Dclose, "dataset " + name);
    check(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v), "dataset " + name);
    check(H5Dclose(d.release()), "dataset " + name);
    check_io("dataset " + name);
  }

  // Slice `i` of `arena`, its values at `base` (the arena's or a same-layout
  // optimizer state) in backend memory.
  void slice(hid_t group, const Arena& arena, size_t i, const float* base) {
    const ParamSlice& s = arena.slice(i);
    const std::string what = "dataset " + s.name;
    const std::vector<int64_t> shape = s.shape.vec();
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    Id space = id(dims.empty() ? H5Screate(H5S_SCALAR)
                               : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                  H5Sclose, "dataspace " + s.name);
    // Whole-tensor chunks with a Fletcher-32 checksum: a damaged file is detected on read.
    Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (!dims.empty() && s.count > 0) {
      H5Pset_chunk(dcpl, static_cast<int>(dims.size()), dims.data());
      H5Pset_fletcher32(dcpl);
    }
    Id d = id(H5Dcreate2(group, s.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose,
              what);
    if (s.count > 0) {
      if (staging.size() < s.count) staging.resize(s.count);
      be.copy_to_host(staging.data(), base + s.offset, s.count * sizeof(float));
      check(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, staging.data()), what);
    }
    // Small chunks wait in the chunk cache until the dataset closes: written by now.
    check(H5Dclose(d.release()), what);
    check_io(what);
  }
};

std::string bn_prefix_of_bias(const std::string& param_name) {
  static const std::string suffix = ".bias";
  if (param_name.size() > suffix.size() &&
      param_name.compare(param_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return param_name.substr(0, param_name.size() - suffix.size());
  return {};
}

}  // namespace

std::vector<StateEntry> state_dict_order(ResNet& model) {
  const Arena& params = model.params();
  const Arena& buffers = model.buffers();
  std::vector<StateEntry> out;
  std::set<std::string> emitted;
  for (size_t i = 0; i < params.slices().size(); ++i) {
    out.push_back({params.slice(i).name, &params, i});
    const std::string prefix = bn_prefix_of_bias(params.slice(i).name);
    if (prefix.empty()) continue;
    const long rm = buffers.find(prefix + ".running_mean");
    const long rv = buffers.find(prefix + ".running_var");
    if (rm < 0 || rv < 0) continue;
    for (long b : {rm, rv}) {
      out.push_back({buffers.slice(static_cast<size_t>(b)).name, &buffers, static_cast<size_t>(b)});
      emitted.insert(buffers.slice(static_cast<size_t>(b)).name);
    }
    out.push_back({prefix + ".num_batches_tracked", nullptr, 0});
  }
  for (size_t i = 0; i < buffers.slices().size(); ++i)
    if (!emitted.count(buffers.slice(i).name)) out.push_back({buffers.slice(i).name, &buffers, i});
  return out;
}

namespace {

// The one place that fixes what a file holds and in which order.
void write_contents(Writer& w, hid_t f, ResNet& model, const Optimizer* opt, const Scheduler* sched,
                    const CheckpointMeta& m) {
  w.str(f, "format", "resnet_ddp");
  w.i64(f, "format_version", m.format_version);
  w.str(f, "arch", m.arch);
  w.str(f, "head", m.head);
  w.i64(f, "num_classes", m.num_classes);
  w.i64(f, "image_size", m.image_size);
  w.i64(f, "epoch", m.epoch);
  w.i64(f, "step_in_epoch", m.step_in_epoch);
  w.i64(f, "global_step", m.global_step);
  w.f64(f, "best_val_acc", m.best_val_acc);
  w.f64(f, "best_val_loss", m.best_val_loss);
  w.f64(f, "val_acc", m.val_acc);
  w.f64(f, "val_loss", m.val_loss);
  w.i64(f, "world_size", m.world_size);
  w.i64(f, "batch_size", m.batch_size);
  w.i64(f, "accum_steps", m.accum_steps);
  w.i64(f, "seed", m.seed);
  w.str(f, "args", m.args);
  w.str(f, "created_by", m.created_by);
  w.str(f, "normalize", m.normalize);
  if (m.step_in_epoch > 0) {
    w.f64(f, "partial_train_loss_sum", m.partial_train_loss_sum);
    w.i64(f, "partial_train_correct", m.partial_train_correct);
    w.i64(f, "partial_train_count", m.partial_train_count);
  }
  if (!h5::write_strings(f, "class_names", m.class_names)) w.failed("dataset class_names");
  if (!m.args_history.empty() && !h5::write_strings(f, "args_history", m.args_history))
    w.failed("dataset args_history");

  const Arena& params = model.params();
  {
    Id sd = w.group(f, "state_dict");
    for (const StateEntry& e : state_dict_order(model)) {
      if (e.arena) w.slice(sd, *e.arena, e.slice, e.arena->data());
      else w.int64_scalar(sd, e.name, model.num_batches_tracked());
    }
  }
  if (opt) {
    const OptimizerConfig& c = opt->config();
    Id g = w.group(f, "optimizer");
    w.str(g, "type", name_of(optimizer_names(), c.type));
    w.i64(g, "step", opt->steps());
    w.f64(g, "lr", opt->lr());
    w.f64(g, "initial_lr", c.lr);
    w.f64(g, "weight_decay", c.weight_decay);
    if (c.type == OptimizerKind::Adam) {
      w.f64(g, "beta1", c.beta1);
      w.f64(g, "beta2", c.beta2);
      w.f64(g, "eps", c.eps);
    } else {
      w.f64(g, "momentum", c.momentum);
      w.f64(g, "dampening", c.dampening);
      w.i64(g, "nesterov", c.nesterov ? 1 : 0);
    }
    // Before the first step PyTorch has no state at all; we write zeros, which
    // give the same next step for Adam, and skip SGD's buffer (seeded by step 1).
    auto* state_owner = const_cast<Optimizer*>(opt);  // state() hands out a writable pointer
    for (size_t k = 0; k < opt->state_count() && !(c.type == OptimizerKind::Sgd && opt->steps() == 0); ++k) {
      Id sg = w.group(g, opt->state_name(k));
      for (size_t i = 0; i < params.slices().size(); ++i) w.slice(sg, params, i, state_owner->state(k));
    }
  }
  if (sched) {
    Id g = w.group(f, "scheduler");
    w.str(g, "type", sched->type());
    w.i64(g, "last_epoch", sched->last_epoch());
    if (sched->kind() == SchedulerKind::Plateau) {
      const PlateauState& p = sched->plateau;
      w.str(g, "mode", "min");
      w.f64(g, "factor", p.factor);
      w.i64(g, "patience", p.patience);
      w.f64(g, "threshold", p.threshold);
      w.str(g, "threshold_mode", "rel");
      w.i64(g, "cooldown", p.cooldown);
      w.f64(g, "min_lr", p.min_lr);
      w.f64(g, "eps", p.eps);
      w.f64(g, "best", p.best);
      w.i64(g, "num_bad_epochs", p.num_bad_epochs);
      w.i64(g, "cooldown_counter", p.cooldown_counter);
    } else if (sched->kind() == SchedulerKind::Cosine) {
      w.i64(g, "T_max", sched->cosine.t_max);
      w.f64(g, "eta_min", sched->cosine.eta_min);
      w.f64(g, "base_lr", sched->cosine.base_lr);
    }
  }
}

// Writes the HDF5 file straight to `file` through the latching driver: no
// in-memory image, so the only extra memory is HDF5's per-dataset buffers.
void write_hdf5_file(const std::string& file, ResNet& model, const Optimizer* opt, const Scheduler* sched,
                     const CheckpointMeta& meta) {
  model.backend().synchronize();
  Writer w{model.backend(), {}, {}};
  LatchScope scope(w.io);
  Id fapl = w.id(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access list");
  w.check(H5Pset_driver(fapl, latch_driver(), nullptr), "file driver");
  // Closing the file closes whatever is still open in it (on an early throw too).
  w.check(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "file close degree");
  Id fcpl = w.id(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "file creation list");
  H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  // The user block (ignored by HDF5 readers) holds the whole-file checksum.
  w.check(H5Pset_userblock(fcpl, kChecksumBlock), "user block");
  Id f = w.id(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, fcpl, fapl), H5Fclose, "temp file '" + file + "'");
  write_contents(w, f, model, opt, sched, meta);
  // Metadata is written at close: its result is checked, not left to a destructor.
  w.check(H5Fclose(f.release()), "closing temp file '" + file + "'");
  w.check_io("closing temp file '" + file + "'");
  stamp_checksum(file);
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems do not support fsync on directories; the file itself is what matters.
  if (rc != 0 && !(directory && (err == EINVAL || err == EBADF)))
    throw Error("cannot sync '" + path + "': " + std::strerror(err));
}

}  // namespace

// Atomic replace: temp file in the same directory, fsync, rename, fsync of the directory.
void write_checkpoint(const std::string& path, ResNet& model, const Optimizer* opt, const Scheduler* sched,
                      const CheckpointMeta& meta) {
  quiet_hdf5();
  const fs::path final_path(path);
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  // Hidden, same directory: the rename stays atomic.
  const fs::path tmp = dir / ("." + final_path.filename().string() + ".tmp." + std::to_string(getpid()));
  const std::string tmp_s = tmp.string();
  auto fail = [&](const std::string& what) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw Error("cannot write checkpoint '" + path + "': " + what + "; the previous checkpoint (if any) is unchanged");
  };
  try {
    write_hdf5_file(tmp_s, model, opt, sched, meta);
  } catch (const WriteError& e) {
    fail(e.what());
  }
  try {
    fsync_path(tmp_s, false);
  } catch (const Error& e) {
    fail(e.what());
  }
  if (::rename(tmp_s.c_str(), path.c_str()) != 0) fail(std::string("rename failed: ") + std::strerror(errno));
  try {
    fsync_path(dir.string(), true);
  } catch (const Error&) {
    // The file is complete and in place; a directory that cannot be synced only
    // weakens crash durability of the rename, which the next save repeats.
  }
}

// ---- reading -----------------------------------------------------------------------

namespace {

bool is_nbt(const std::string& name) {
  static const std::string suffix = "num_batches_tracked";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool is_head_tensor(const std::string& name) { return name.rfind("fc.", 0) == 0; }

const std::vector<std::string>& optimizer_state_names(OptimizerKind type) {
  static const std::vector<std::string> adam{"exp_avg", "exp_avg_sq"}, sgd{"momentum_buffer"};
  return type == OptimizerKind::Adam ? adam : sgd;
}

// An opened dataset with its element class and shape (rank checked).
struct Dataset {
  Id id;
  H5T_class_t cls = H5T_NO_CLASS;
  hssize_t count = 0;
  std::vector<int64_t> shape;
};

}  // namespace

struct CheckpointReader::Impl {
  std::string path;
  Id file;
  CheckpointMeta meta;
  std::map<std::string, Id> groups;  // opened on first use
  std::optional<safetensors::File> st;  // set for a .safetensors file (no HDF5 then)

  [[noreturn]] void bad(const std::string& what) const { throw UsageError("checkpoint '" + path + "': " + what); }

  std::string str(hid_t obj, const char* name) const {
    std::string v;
    const std::string n(name);
    switch (h5::read_attr(obj, name, v)) {
      case h5::Status::Ok: return v;
      case h5::Status::Missing: bad("missing attribute '" + n + "'");
      case h5::Status::WrongType: bad("attribute '" + n + "' is not a string");
      case h5::Status::NotSingle: bad("attribute '" + n + "' is not a single string");
      default: bad("cannot read attribute '" + n + "'");
    }
  }
  template <class T>
  T num(hid_t obj, const char* name, hid_t mem_type) const {
    T v{};
    const std::string n(name);
    switch (h5::read_attr(obj, name, mem_type, v)) {
      case h5::Status::Ok: return v;
      case h5::Status::Missing: bad("missing attribute '" + n + "'");
      case h5::Status::NotSingle: bad("attribute '" + n + "' is not a scalar");
      default: bad("cannot read attribute '" + n + "' as a number");
    }
  }
  int64_t i64(hid_t obj, const char* name) const { return num<int64_t>(obj, name, H5T_NATIVE_INT64); }
  double f64(hid_t obj, const char* name) const { return num<double>(obj, name, H5T_NATIVE_DOUBLE); }
  int64_t i64_or(hid_t obj, const char* name, int64_t def) const { return h5::has_attr(obj, name) ? i64(obj, name) : def; }
  double f64_or(hid_t obj, const char* name, double def) const { return h5::has_attr(obj, name) ? f64(obj, name) : def; }
  std::string str_or(hid_t obj, const char* name, const std::string& def) const {
    return h5::has_attr(obj, name) ? str(obj, name) : def;
  }

  hid_t group(const std::string& name) {
    auto g = groups.find(name);
    if (g != groups.end()) return g->second;
    Id id(H5Gopen2(file, name.c_str(), H5P_DEFAULT), H5Gclose);
    if (!id.ok()) bad("cannot open group '" + name + "'");
    return groups.emplace(name, std::move(id)).first->second;
  }

  // The names in a group, in creation order when tracked (else by name).
  std::vector<std::string> link_names(const std::string& group_name) {
    const hid_t g = group(group_name);
    std::vector<std::string> out;
    H5G_info_t info{};
    if (H5Gget_info(g, &info) < 0) bad("cannot list group '" + group_name + "'");
    Id gcpl(H5Gget_create_plist(g), H5Pclose);
    unsigned order_flags = 0;
    H5Pget_link_creation_order(gcpl, &order_flags);
    const H5_index_t index = (order_flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t len = H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
      if (len < 0) bad("cannot list group '" + group_name + "'");
      std::string name(static_cast<size_t>(len), '\0');
      H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, name.data(), static_cast<size_t>(len) + 1, H5P_DEFAULT);
      out.push_back(std::move(name));
    }
    return out;
  }

  Dataset dataset(const std::string& group_name, const std::string& name) {
    const std::string where = group_name + "/" + name;
    Dataset ds;
    ds.id = Id(H5Dopen2(group(group_name), name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.id.ok()) bad("cannot open dataset '" + where + "'");
    Id type(H5Dget_type(ds.id), H5Tclose);
    Id space(H5Dget_space(ds.id), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0 || rank > 4) bad("dataset '" + where + "' has an unsupported rank");
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    if (rank) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    for (hsize_t x : dims) ds.shape.push_back(static_cast<int64_t>(x));
    ds.cls = H5Tget_class(type);
    ds.count = H5Sget_simple_extent_npoints(space);
    return ds;
  }
  int64_t int64_scalar(const Dataset& ds, const std::string& where) const {
    if (ds.count != 1) bad("dataset '" + where + "' should be a scalar");
    int64_t v = 0;
    if (H5Dread(ds.id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) < 0)
      bad("cannot read dataset '" + where + "' (file damaged?)");
    return v;
  }
  // out holds ds.count floats.
  void floats(const Dataset& ds, const std::string& where, float* out) const {
    if (ds.cls != H5T_FLOAT) bad("dataset '" + where + "' is not floating point");
    if (ds.count > 0 && H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
      bad("cannot read dataset '" + where + "' (checksum or read error: file damaged?)");
  }
  // Dataset `name` of `group_name` when present and floating point; nullopt when absent.
  std::optional<Dataset> float_dataset(const std::string& group_name, const std::string& name) {
    if (!h5::has_link(group(group_name), name)) return std::nullopt;
    Dataset ds = dataset(group_name, name);
    if (ds.cls != H5T_FLOAT) bad("dataset '" + group_name + "/" + name + "' is not floating point");
    return ds;
  }

  void read_meta(bool weights_only);
  void read_groups();
  void read_safetensors_meta(bool weights_only);
};

// Our export's __metadata__ (strings only, by the format's rule) back into the meta.
// Files from other tools have none or other keys: fine for --init, which needs tensors only.
void CheckpointReader::Impl::read_safetensors_meta(bool weights_only) {
  CheckpointMeta& m = meta;
  m.container = "safetensors";
  const auto& md = st->metadata();
  auto text = [&](const char* k, const std::string& def) {
    auto it = md.find(k);
    return it == md.end() ? def : it->second;
  };
  auto integer = [&](const char* k, int64_t def) -> int64_t {
    auto it = md.find(k);
    if (it == md.end()) return def;
    int64_t v = 0;
    const std::string& t = it->second;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || p != t.data() + t.size()) bad("__metadata__ '" + std::string(k) + "' is not an integer: '" + t + "'");
    return v;
  };
  auto real = [&](const char* k, double def) -> double {
    auto it = md.find(k);
    if (it == md.end()) return def;
    double v = 0;
    const std::string& t = it->second;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || p != t.data() + t.size()) bad("__metadata__ '" + std::string(k) + "' is not a number: '" + t + "'");
    return v;
  };
  // Other writers use "format" too (transformers writes "pt"): only ours is checked.
  const bool ours = text("format", "") == "resnet_ddp";
  if (ours) {
    m.format_version = integer("format_version", 1);
    if (m.format_version > kCheckpointFormatVersion || m.format_version < 1)
      bad("format_version " + std::to_string(m.format_version) + " is not supported (this program reads up to " +
          std::to_string(kCheckpointFormatVersion) + ")");
  }
  m.arch = text("arch", "");
  m.head = text("head", "");
  m.num_classes = integer("num_classes", 0);
  m.image_size = integer("image_size", 0);
  m.normalize = text("normalize", "none");
  m.epoch = integer("epoch", 0);
  m.global_step = integer("global_step", 0);
  m.best_val_acc = real("best_val_acc", -1.0);
  m.best_val_loss = real("best_val_loss", 0.0);
  m.val_acc = real("val_acc", -1.0);
  m.val_loss = real("val_loss", 0.0);
  m.created_by = text("created_by", "");
  if (md.count("class_names")) {
    try {
      m.class_names = safetensors::parse_json_string_array(md.at("class_names"), "__metadata__ 'class_names'");
    } catch (const UsageError& e) {
      bad(e.what());
    }
  }
  if (m.epoch < 0 || m.global_step < 0 || m.num_classes < 0 || m.image_size < 0)
    bad("__metadata__ holds a negative count");
  if (!weights_only) {
    // predict and --resume --eval-only need the model's definition and its classes.
    if (!ours || m.arch.empty() || m.head.empty() || m.num_classes <= 0 || m.image_size <= 0)
      bad("has no resnet_ddp metadata (__metadata__ with format, arch, head, num_classes, class_names, "
          "image_size, as 'resnet_ddp export' writes); use it with --init, which needs the tensors only");
    if (static_cast<int64_t>(m.class_names.size()) != m.num_classes)
      bad("has " + std::to_string(m.class_names.size()) + " class names but num_classes = " +
          std::to_string(m.num_classes));
  }
  if (st->tensors().empty()) bad("holds no tensors");
}

void CheckpointReader::Impl::read_meta(bool weights_only) {
  CheckpointMeta& m = meta;
  const hid_t f = file;
  if (h5::has_attr(f, "format")) {
    const std::string format = str(f, "format");
    if (format != "resnet_ddp") bad("format is '" + format + "', expected 'resnet_ddp'");
    m.format_version = i64(f, "format_version");
    if (m.format_version > kCheckpointFormatVersion || m.format_version < 1)
      bad("format_version " + std::to_string(m.format_version) + " is not supported (this program reads up to " +
          std::to_string(kCheckpointFormatVersion) + ")");
  } else if (!weights_only) {
    bad("not a resnet_ddp checkpoint (no 'format' attribute)");
  }
  // Required in a full checkpoint; a weights-only file (--init) may lack them.
  auto need_str = [&](const char* n) { return weights_only ? str_or(f, n, "") : str(f, n); };
  auto need_i64 = [&](const char* n) { return weights_only ? i64_or(f, n, 0) : i64(f, n); };
  m.arch = need_str("arch");
  m.head = need_str("head");
  m.num_classes = need_i64("num_classes");
  m.image_size = need_i64("image_size");
  m.epoch = need_i64("epoch");
  m.global_step = need_i64("global_step");
  m.best_val_acc = weights_only ? f64_or(f, "best_val_acc", -1.0) : f64(f, "best_val_acc");
  m.world_size = need_i64("world_size");
  m.step_in_epoch = i64_or(f, "step_in_epoch", 0);
  m.best_val_loss = f64_or(f, "best_val_loss", 0.0);
  m.val_acc = f64_or(f, "val_acc", -1.0);
  m.val_loss = f64_or(f, "val_loss", 0.0);
  m.batch_size = i64_or(f, "batch_size", 0);
  m.accum_steps = i64_or(f, "accum_steps", 0);
  m.seed = i64_or(f, "seed", 0);
  m.args = str_or(f, "args", "");
  m.created_by = str_or(f, "created_by", "");
  m.normalize = str_or(f, "normalize", "none");
  m.partial_train_loss_sum = f64_or(f, "partial_train_loss_sum", 0.0);
  m.partial_train_correct = i64_or(f, "partial_train_correct", 0);
  m.partial_train_count = i64_or(f, "partial_train_count", 0);
  switch (h5::read_strings(f, "class_names", m.class_names)) {
    case h5::Status::Ok:
    case h5::Status::Missing: break;
    case h5::Status::OpenFailed: bad("cannot open 'class_names'");
    case h5::Status::WrongType: bad("'class_names' is not a list of strings");
    default: bad("cannot read 'class_names'");
  }
  if (!weights_only && static_cast<int64_t>(m.class_names.size()) != m.num_classes)
    bad("has " + std::to_string(m.class_names.size()) + " class names but num_classes = " +
        std::to_string(m.num_classes));
  // Informational only: a damaged history never blocks a resume.
  if (h5::read_strings(f, "args_history", m.args_history) != h5::Status::Ok) m.args_history.clear();
  if (m.epoch < 0 || m.global_step < 0 || m.step_in_epoch < 0) bad("negative epoch or step counters");
  if (!h5::has_link(f, "state_dict")) bad("no /state_dict group");
  H5G_info_t info{};
  if (H5Gget_info(group("state_dict"), &info) < 0) bad("cannot list group 'state_dict'");
  if (info.nlinks == 0) bad("/state_dict is empty");
}

// The optimizer and scheduler attributes (full checkpoints only).
void CheckpointReader::Impl::read_groups() {
  if (h5::has_link(file, "optimizer")) {
    const hid_t g = group("optimizer");
    OptimizerMeta& o = meta.optimizer;
    OptimizerConfig& c = o.config;
    o.present = true;
    const std::string type = str(g, "type");
    bool known = false;
    for (const auto& [name, kind] : optimizer_names())
      if (name == type) c.type = kind, known = true;
    if (!known) bad("unknown optimizer type '" + type + "'");
    o.step = i64(g, "step");
    o.lr = f64(g, "lr");
    c.lr = f64_or(g, "initial_lr", o.lr);
    c.weight_decay = f64_or(g, "weight_decay", 0.0);
    if (c.type == OptimizerKind::Adam) {
      c.beta1 = f64_or(g, "beta1", 0.9);
      c.beta2 = f64_or(g, "beta2", 0.999);
      c.eps = f64_or(g, "eps", 1e-8);
    } else {
      c.momentum = f64_or(g, "momentum", 0.0);
      c.dampening = f64_or(g, "dampening", 0.0);
      c.nesterov = i64_or(g, "nesterov", 0) != 0;
    }
  }
  if (h5::has_link(file, "scheduler")) {
    const hid_t g = group("scheduler");
    SchedulerMeta& c = meta.scheduler;
    c.present = true;
    c.type = str(g, "type");
    c.last_epoch = i64_or(g, "last_epoch", 0);
    if (c.type == "plateau") {
      PlateauState& p = c.plateau;
      p.factor = f64(g, "factor");
      p.patience = i64(g, "patience");
      p.threshold = f64_or(g, "threshold", 1e-4);
      p.cooldown = i64_or(g, "cooldown", 0);
      p.min_lr = f64(g, "min_lr");
      p.eps = f64_or(g, "eps", 1e-8);
      p.best = f64(g, "best");
      p.num_bad_epochs = i64(g, "num_bad_epochs");
      p.cooldown_counter = i64_or(g, "cooldown_counter", 0);
    } else if (c.type == "cosine") {
      c.cosine.t_max = i64(g, "T_max");
      c.cosine.eta_min = f64_or(g, "eta_min", 0.0);
      c.cosine.base_lr = f64(g, "base_lr");
    } else if (c.type != "none") {
      bad("unknown scheduler type '" + c.type + "'");
    }
  }
}

CheckpointReader::CheckpointReader(const std::string& path, bool weights_only) : impl_(std::make_unique<Impl>()) {
  quiet_hdf5();
  Impl& r = *impl_;
  r.path = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) r.bad("no such file");
  if (fs::is_directory(path, ec)) r.bad("is a directory");
  if (const std::string torch = safetensors::torch_file_problem(path); !torch.empty()) r.bad(torch);
  if (safetensors::sniff(path) == safetensors::Kind::Safetensors) {
    r.st = safetensors::File::open(path);
    r.read_safetensors_meta(weights_only);
    return;
  }
  // Before HDF5 parses anything: a damaged file of ours never reaches HDF5 in this process.
  if (!in_damage_probe())
    if (const std::string problem = checksum_problem(path); !problem.empty()) throw damaged_file_error(path, problem);
  if (H5Fis_hdf5(path.c_str()) <= 0) r.bad("not an HDF5 file (truncated or corrupt?)");
  r.file = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!r.file.ok()) r.bad("cannot be opened as HDF5 (truncated or corrupt?)");
  r.read_meta(weights_only);
  if (!weights_only) r.read_groups();
}
CheckpointReader::~CheckpointReader() = default;

const std::string& CheckpointReader::path() const { return impl_->path; }
const CheckpointMeta& CheckpointReader::meta() const { return impl_->meta; }

std::vector<TensorInfo> CheckpointReader::check_tensors() {
  Impl& r = *impl_;
  std::vector<float> staging;
  std::vector<TensorInfo> state_dict;
  if (r.st) {
    for (const safetensors::Entry& e : r.st->tensors()) {
      TensorInfo t;
      t.name = e.name;
      const bool integer = e.dtype == safetensors::DType::I64 || e.dtype == safetensors::DType::I32;
      if (is_nbt(e.name)) {
        t.is_int64_scalar = true;
        t.int_value = r.st->read_int_scalar(e);
      } else {
        if (integer) r.st->bad_tensor(e.name, "is an integer tensor (only num_batches_tracked may be)");
        t.shape = e.shape;
        if (staging.size() < static_cast<size_t>(e.numel())) staging.resize(static_cast<size_t>(e.numel()));
        r.st->read_f32(e, staging.data());
      }
      state_dict.push_back(std::move(t));
    }
    return state_dict;
  }
  auto read_group = [&](const std::string& group_name, std::vector<TensorInfo>* out) {
    for (const std::string& name : r.link_names(group_name)) {
      const std::string where = group_name + "/" + name;
      const Dataset ds = r.dataset(group_name, name);
      TensorInfo t;
      t.name = name;
      if (ds.cls == H5T_INTEGER && is_nbt(name)) {
        t.is_int64_scalar = true;
        t.int_value = r.int64_scalar(ds, where);
      } else {
        t.shape = ds.shape;
        if (ds.cls == H5T_FLOAT && staging.size() < static_cast<size_t>(ds.count)) staging.resize(static_cast<size_t>(ds.count));
        r.floats(ds, where, staging.data());
      }
      if (out) out->push_back(std::move(t));
    }
  };
  read_group("state_dict", &state_dict);
  if (r.meta.optimizer.present)
    for (const auto& n : optimizer_state_names(r.meta.optimizer.config.type))
      if (h5::has_link(r.group("optimizer"), n)) read_group("optimizer/" + n, nullptr);
  return state_dict;
}

std::vector<std::string> CheckpointReader::load_model(ResNet& model, bool allow_head_mismatch) {
  Impl& r = *impl_;
  Backend& be = model.backend();
  std::vector<float> staging;  // grows to the largest tensor
  std::vector<std::string> skipped;
  auto load_arena = [&](Arena& arena, const char* kind) {
    for (size_t i = 0; i < arena.slices().size(); ++i) {
      const ParamSlice& s = arena.slice(i);
      const bool head = is_head_tensor(s.name);
      std::optional<Dataset> t;
      const safetensors::Entry* e = nullptr;
      std::optional<std::vector<int64_t>> shape;  // the file's, when it has the tensor
      if (r.st) {
        e = r.st->find(s.name);
        if (e && (e->dtype == safetensors::DType::I64 || e->dtype == safetensors::DType::I32))
          r.st->bad_tensor(s.name, std::string("has dtype ") + safetensors::dtype_name(e->dtype) +
                                       ", expected F32, F16 or BF16");
        if (e) shape = e->shape;
      } else {
        t = r.float_dataset("state_dict", s.name);
        if (t) shape = t->shape;
      }
      if (!shape || *shape != s.shape.vec()) {
        if (allow_head_mismatch && head) {
          skipped.push_back(s.name);
          continue;
        }
        if (!shape) r.bad(std::string("missing ") + kind + " '" + s.name + "' (different arch or head?)");
        r.bad("'" + s.name + "' has shape " + Shape::from(*shape).str() + ", the model expects " + s.shape.str());
      }
      if (staging.size() < s.count) staging.resize(s.count);
      if (e) r.st->read_f32(*e, staging.data());
      else r.floats(*t, "state_dict/" + s.name, staging.data());
      for (size_t k = 0; k < s.count; ++k)
        if (!std::isfinite(staging[k])) r.bad("'" + s.name + "' contains NaN or Inf");
      be.copy_from_host(arena.ptr(i), staging.data(), s.count * sizeof(float));
    }
  };
  load_arena(model.params(), "parameter");
  load_arena(model.buffers(), "buffer");
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
  // All BNs count the same batches; torchvision stores one counter per BN.
  int64_t nbt = -1;
  if (r.st) {
    for (const safetensors::Entry& e : r.st->tensors())
      if (is_nbt(e.name)) nbt = std::max(nbt, r.st->read_int_scalar(e));
  }
  for (const std::string& name : r.st ? std::vector<std::string>{} : r.link_names("state_dict")) {
    if (!is_nbt(name)) continue;
    const std::string where = "state_dict/" + name;
    const Dataset ds = r.dataset("state_dict", name);
    if (ds.cls == H5T_INTEGER) nbt = std::max(nbt, r.int64_scalar(ds, where));
    else if (ds.cls != H5T_FLOAT) r.bad("dataset '" + where + "' is not floating point");
  }
  if (nbt >= 0) model.set_num_batches_tracked(nbt);
  be.synchronize();
  return skipped;
}

void CheckpointReader::load_optimizer(ResNet& model, Optimizer& opt) {
  Impl& r = *impl_;
  const OptimizerMeta& o = r.meta.optimizer;
  const OptimizerKind type = o.config.type;
  if (r.st)
    r.bad("holds weights only (a safetensors file has no optimizer state), so training cannot resume from it; "
          "to train from these weights use --init " + r.path);
  if (!o.present)
    r.bad("has no /optimizer state to resume from (a best_model.h5 holds the weights only; its run's optimizer "
          "state is in that run's last.h5): resume from last.h5, or train from these weights with --init " + r.path);
  if (type != opt.config().type)
    r.bad("optimizer state is for --optimizer " + name_of(optimizer_names(), type) +
          ", this run uses --optimizer " + opt.type_name());
  opt.set_steps(o.step);
  opt.set_lr(o.lr);
  Backend& be = model.backend();
  const Arena& params = model.params();
  std::vector<float> staging;
  for (size_t k = 0; k < opt.state_count(); ++k) {
    const std::string name = opt.state_name(k);
    const auto& known = optimizer_state_names(type);
    if (std::find(known.begin(), known.end(), name) == known.end() || !h5::has_link(r.group("optimizer"), name)) {
      // SGD before its first step has no momentum buffer; anything else is damage.
      if (type == OptimizerKind::Sgd && o.step == 0) continue;
      r.bad("missing optimizer state '" + name + "'");
    }
    float* base = opt.state(k);
    for (size_t i = 0; i < params.slices().size(); ++i) {
      const ParamSlice& s = params.slice(i);
      const std::optional<Dataset> t = r.float_dataset("optimizer/" + name, s.name);
      if (!t) r.bad("missing optimizer state " + name + "/" + s.name);
      if (t->shape != s.shape.vec()) r.bad("optimizer state " + name + "/" + s.name + " has the wrong shape");
      if (staging.size() < s.count) staging.resize(s.count);
      r.floats(*t, "optimizer/" + name + "/" + s.name, staging.data());
      be.copy_from_host(base + s.offset, staging.data(), s.count * sizeof(float));
    }
  }
  be.synchronize();
}

// ---- fit ------------------------------------------------------------------------------

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

void restore_scheduler(const SchedulerMeta& c, Scheduler& sched) {
  if (!c.present || c.type != sched.type()) return;  // a changed --scheduler starts fresh
  sched.set_last_epoch(c.last_epoch);
  sched.plateau = c.plateau;
  sched.cosine = c.cosine;
}

}  // namespace rd::train
