// The HDF5 checkpoint writer (see checkpoint.h).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <type_traits>

#include "io/checksum.h"
#include "io/latch_driver.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/io/h5.h"
#include "resnet_ddp/nn/resnet.h"

namespace fs = std::filesystem;

namespace rd::io {

using h5::Id;

namespace {

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

// The root attributes and the string lists.
void write_attributes(Writer& w, hid_t f, const CheckpointMeta& m) {
  w.str(f, "format", "resnet_ddp");
  w.i64(f, meta_key::format_version, m.format_version);
  w.str(f, meta_key::arch, m.arch);
  w.str(f, meta_key::head, m.head);
  w.i64(f, meta_key::num_classes, m.num_classes);
  w.i64(f, meta_key::image_size, m.image_size);
  w.i64(f, meta_key::val_resize_size, m.val_resize_size);
  w.i64(f, meta_key::val_crop_size, m.val_crop_size);
  // The partial-epoch sums only in a preemption checkpoint.
  for_each_position_field(static_cast<const RunPosition&>(m), [&](const PositionField& field, auto value) {
    if (field.preemption_only && m.step_in_epoch <= 0) return;
    if constexpr (std::is_same_v<decltype(value), double>)
      w.f64(f, field.name, value);
    else
      w.i64(f, field.name, value);
  });
  w.f64(f, meta_key::val_acc, m.val_acc);
  w.f64(f, meta_key::val_loss, m.val_loss);
  w.i64(f, meta_key::world_size, m.world_size);
  w.i64(f, meta_key::batch_size, m.batch_size);
  w.i64(f, meta_key::accum_steps, m.accum_steps);
  w.i64(f, meta_key::seed, m.seed);
  w.str(f, meta_key::args, m.args);
  w.str(f, meta_key::created_by, m.created_by);
  w.str(f, meta_key::normalize, m.normalize);
  if (!m.slurm_job_id.empty()) {
    w.str(f, meta_key::slurm_job_id, m.slurm_job_id);
    w.str(f, meta_key::slurm_step_id, m.slurm_step_id);
    w.i64(f, meta_key::slurm_restart_count, m.slurm_restart_count);
  }
  if (!h5::write_strings(f, meta_key::class_names, m.class_names)) w.failed("dataset class_names");
  if (!m.args_history.empty() && !h5::write_strings(f, meta_key::args_history, m.args_history))
    w.failed("dataset args_history");

}

// Issue #27's hyperparameters: param-group decays (when set), RMSprop, LARS, LAMB.
void write_optimizer_extras(Writer& w, hid_t g, const OptimizerConfig& c) {
  if (c.norm_weight_decay >= 0) w.f64(g, "norm_weight_decay", c.norm_weight_decay);
  if (c.bias_weight_decay >= 0) w.f64(g, "bias_weight_decay", c.bias_weight_decay);
  if (c.type == OptimizerKind::RmsProp) w.f64(g, "alpha", c.alpha), w.f64(g, "eps", c.eps);
  if (c.type == OptimizerKind::Lars) w.f64(g, "trust_coeff", c.trust_coeff), w.f64(g, "eps", c.eps);
  if (c.type == OptimizerKind::Lamb) w.f64(g, "max_grad_norm", c.max_grad_norm);
}

// The /optimizer group: hyperparameters and the state tensors.
void write_optimizer(Writer& w, hid_t f, const Arena& params, const OptimizerState& s) {
  const OptimizerConfig& c = s.config;
  Id g = w.group(f, "optimizer");
  w.str(g, "type", name_of(optimizer_names(), c.type));
  w.i64(g, "step", s.step);
  w.f64(g, "lr", s.lr);
  w.f64(g, "initial_lr", c.lr);
  w.f64(g, "weight_decay", c.weight_decay);
  if (uses_adam_moments(c.type)) {
    w.f64(g, "beta1", c.beta1);
    w.f64(g, "beta2", c.beta2);
    w.f64(g, "eps", c.eps);
  } else {
    w.f64(g, "momentum", c.momentum);
    w.f64(g, "dampening", c.dampening);
    w.i64(g, "nesterov", c.nesterov ? 1 : 0);
  }
  write_optimizer_extras(w, g, c);
  // Before the first step PyTorch has no state at all; we write zeros, which
  // give the same next step for Adam, and skip SGD's buffer (seeded by step 1).
  if (momentum_seeded_by_first_step(c.type) && s.step == 0) return;
  for (const StateTensor& t : s.tensors) {
    Id sg = w.group(g, t.name);
    for (size_t i = 0; i < params.slices().size(); ++i) w.slice(sg, params, i, t.data);
  }
}

// The /scheduler group.
void write_scheduler(Writer& w, hid_t f, const SchedulerState& s) {
  Id g = w.group(f, "scheduler");
  w.str(g, "type", s.type);
  w.i64(g, "last_epoch", s.last_epoch);
  if (s.type == "plateau") {
    const PlateauState& p = s.plateau;
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
  } else if (s.type == "cosine") {
    w.i64(g, "T_max", s.cosine.t_max);
    w.f64(g, "eta_min", s.cosine.eta_min);
    w.f64(g, "base_lr", s.cosine.base_lr);
  }
}

// The one place that fixes what a file holds and in which order.
// The /model_ema group: the average's state_dict in the model's order, and its counters.
void write_ema(Writer& w, hid_t f, ResNet& model, const EmaState& s) {
  Id g = w.group(f, "model_ema");
  w.f64(g, "decay", s.decay);
  w.i64(g, "n_averaged", s.n_averaged);
  w.i64(g, "num_batches_tracked", s.num_batches_tracked);
  for (const StateEntry& e : state_dict_order(model)) {
    if (!e.arena)
      w.int64_scalar(g, e.name, s.num_batches_tracked);
    else
      w.slice(g, *e.arena, e.slice, e.arena == &model.params() ? s.params : s.buffers);
  }
}

void write_contents(Writer& w, hid_t f, ResNet& model, const OptimizerState* opt, const SchedulerState* sched,
                    const CheckpointMeta& m, const EmaState* ema) {
  write_attributes(w, f, m);
  {
    Id sd = w.group(f, "state_dict");
    for (const StateEntry& e : state_dict_order(model)) {
      if (e.arena) w.slice(sd, *e.arena, e.slice, e.arena->data());
      else w.int64_scalar(sd, e.name, model.num_batches_tracked());
    }
  }
  if (opt) write_optimizer(w, f, model.params(), *opt);
  if (sched) write_scheduler(w, f, *sched);
  if (ema) write_ema(w, f, model, *ema);
}

// Writes the HDF5 file straight to `file` through the latching driver: no
// in-memory image, so the only extra memory is HDF5's per-dataset buffers.
void write_hdf5_file(const std::string& file, ResNet& model, const OptimizerState* opt, const SchedulerState* sched,
                     const CheckpointMeta& meta, const EmaState* ema) {
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
  write_contents(w, f, model, opt, sched, meta, ema);
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
void write_checkpoint(const std::string& path, ResNet& model, const OptimizerState* opt, const SchedulerState* sched,
                      const CheckpointMeta& meta, const EmaState* ema) {
  h5::quiet_for_good();
  const fs::path final_path(path);
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  // Hidden, same directory: the rename stays atomic.
  std::string tmp_name = ".";  // built in steps: GCC 12 warns (-Wrestrict) on the one-line form
  tmp_name += final_path.filename().string();
  tmp_name += ".tmp." + std::to_string(getpid());
  const fs::path tmp = dir / tmp_name;
  const std::string tmp_s = tmp.string();
  auto fail = [&](const std::string& what) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw Error("cannot write checkpoint '" + path + "': " + what + "; the previous checkpoint (if any) is unchanged");
  };
  try {
    write_hdf5_file(tmp_s, model, opt, sched, meta, ema);
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

}  // namespace rd::io
