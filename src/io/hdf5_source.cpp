// The HDF5 tensor source (see tensor_source.h): a checkpoint's attributes, groups and
// datasets through h5.h, every failure worded as "checkpoint 'PATH': ...".
#include <algorithm>
#include <map>
#include <type_traits>

#include "io/tensor_source.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/h5.h"

namespace rd::io {

using h5::Id;

namespace {

// An opened dataset with its element class and shape (rank checked).
struct Dataset {
  Id id;
  H5T_class_t cls = H5T_NO_CLASS;
  hssize_t count = 0;
  std::vector<int64_t> shape;
};

class Hdf5Source final : public TensorSource {
 public:
  explicit Hdf5Source(const std::string& p) : path(p) {
    h5::quiet_for_good();
    if (H5Fis_hdf5(path.c_str()) <= 0) bad("not an HDF5 file (truncated or corrupt?)");
    file = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) bad("cannot be opened as HDF5 (truncated or corrupt?)");
  }

  CheckpointMeta read_meta(bool weights_only) override;
  bool has_group(const std::string& g) override {
    const size_t slash = g.find('/');
    if (slash == std::string::npos) return h5::has_link(file, g);
    return h5::has_link(group(g.substr(0, slash)), g.substr(slash + 1));
  }
  std::vector<std::string> names(const std::string& g) override { return link_names(g); }
  std::optional<int64_t> counter(const std::string& g, const std::string& name) override {
    if (!is_num_batches_tracked(name)) return std::nullopt;
    const Dataset ds = dataset(g, name);
    if (ds.cls != H5T_INTEGER) return std::nullopt;
    return int64_scalar(ds, g + "/" + name);
  }
  std::optional<std::vector<int64_t>> float_shape(const std::string& g, const std::string& name) override {
    if (!h5::has_link(group(g), name)) return std::nullopt;
    return float_dataset(g, name).shape;
  }
  void read_floats(const std::string& g, const std::string& name, float* out) override {
    floats(float_dataset(g, name), g + "/" + name, out);
  }

 private:
  std::string path;
  Id file;
  std::map<std::string, Id> groups;  // opened on first use

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
  // Dataset `name` of `group_name`, which must be floating point.
  Dataset float_dataset(const std::string& group_name, const std::string& name) {
    Dataset ds = dataset(group_name, name);
    if (ds.cls != H5T_FLOAT) bad("dataset '" + group_name + "/" + name + "' is not floating point");
    return ds;
  }

  void read_optimizer(OptimizerState& o);
  void read_scheduler(SchedulerState& c);
};

CheckpointMeta Hdf5Source::read_meta(bool weights_only) {
  CheckpointMeta m;
  const hid_t f = file;
  if (h5::has_attr(f, "format")) {
    const std::string format = str(f, "format");
    if (format != "resnet_ddp") bad("format is '" + format + "', expected 'resnet_ddp'");
    m.format_version = i64(f, meta_key::format_version);
    if (m.format_version > kCheckpointFormatVersion || m.format_version < 1)
      bad("format_version " + std::to_string(m.format_version) + " is not supported (this program reads up to " +
          std::to_string(kCheckpointFormatVersion) + ")");
  } else if (!weights_only) {
    bad("not a resnet_ddp checkpoint (no 'format' attribute)");
  }
  // Required in a full checkpoint; a weights-only file (--init) may lack them.
  auto need_str = [&](const char* n) { return weights_only ? str_or(f, n, "") : str(f, n); };
  auto need_i64 = [&](const char* n) { return weights_only ? i64_or(f, n, 0) : i64(f, n); };
  m.arch = need_str(meta_key::arch);
  m.head = need_str(meta_key::head);
  m.num_classes = need_i64(meta_key::num_classes);
  m.image_size = need_i64(meta_key::image_size);
  m.val_resize_size = i64_or(f, meta_key::val_resize_size, 0);
  m.val_crop_size = i64_or(f, meta_key::val_crop_size, 0);
  for_each_position_field(static_cast<RunPosition&>(m), [&](const PositionField& field, auto& value) {
    const bool need = field.required && !weights_only;
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, double>)
      value = need ? f64(f, field.name) : f64_or(f, field.name, value);
    else
      value = need ? i64(f, field.name) : i64_or(f, field.name, value);
  });
  m.world_size = need_i64(meta_key::world_size);
  m.val_acc = f64_or(f, meta_key::val_acc, -1.0);
  m.val_loss = f64_or(f, meta_key::val_loss, 0.0);
  m.batch_size = i64_or(f, meta_key::batch_size, 0);
  m.accum_steps = i64_or(f, meta_key::accum_steps, 0);
  m.seed = i64_or(f, meta_key::seed, 0);
  m.args = str_or(f, meta_key::args, "");
  m.created_by = str_or(f, meta_key::created_by, "");
  m.normalize = str_or(f, meta_key::normalize, "none");
  m.slurm_job_id = str_or(f, meta_key::slurm_job_id, "");
  m.slurm_step_id = str_or(f, meta_key::slurm_step_id, "");
  m.slurm_restart_count = i64_or(f, meta_key::slurm_restart_count, 0);
  switch (h5::read_strings(f, meta_key::class_names, m.class_names)) {
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
  if (h5::read_strings(f, meta_key::args_history, m.args_history) != h5::Status::Ok) m.args_history.clear();
  if (m.has_negative_counter()) bad("negative epoch or step counters");
  if (!h5::has_link(f, "state_dict")) bad("no /state_dict group");
  H5G_info_t info{};
  if (H5Gget_info(group("state_dict"), &info) < 0) bad("cannot list group 'state_dict'");
  if (info.nlinks == 0) bad("/state_dict is empty");
  if (!weights_only) {
    read_optimizer(m.optimizer);
    read_scheduler(m.scheduler);
  }
  if (h5::has_link(file, "model_ema")) {  // --model-ema (read weights-only too: --eval-only evaluates it)
    const hid_t g = group("model_ema");
    m.ema.present = true;
    m.ema.decay = f64(g, "decay");
    m.ema.n_averaged = i64(g, "n_averaged");
    m.ema.num_batches_tracked = i64(g, "num_batches_tracked");
  }
  return m;
}

// The /optimizer group's attributes (full checkpoints only).
void Hdf5Source::read_optimizer(OptimizerState& o) {
  if (!h5::has_link(file, "optimizer")) return;
  const hid_t g = group("optimizer");
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
  if (uses_adam_moments(c.type)) {
    c.beta1 = f64_or(g, "beta1", 0.9);
    c.beta2 = f64_or(g, "beta2", 0.999);
    c.eps = f64_or(g, "eps", 1e-8);
  } else {
    c.momentum = f64_or(g, "momentum", 0.0);
    c.dampening = f64_or(g, "dampening", 0.0);
    c.nesterov = i64_or(g, "nesterov", 0) != 0;
    c.eps = f64_or(g, "eps", c.eps);
  }
  c.norm_weight_decay = f64_or(g, "norm_weight_decay", -1.0);
  c.bias_weight_decay = f64_or(g, "bias_weight_decay", -1.0);
  c.alpha = f64_or(g, "alpha", c.alpha);
  c.trust_coeff = f64_or(g, "trust_coeff", c.trust_coeff);
  c.max_grad_norm = f64_or(g, "max_grad_norm", c.max_grad_norm);
}

// The /scheduler group's attributes (full checkpoints only).
void Hdf5Source::read_scheduler(SchedulerState& c) {
  if (!h5::has_link(file, "scheduler")) return;
  const hid_t g = group("scheduler");
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
  } else if (const auto names = scheduler_names();
             std::none_of(names.begin(), names.end(), [&](const auto& n) { return n.first == c.type; })) {
    bad("unknown scheduler type '" + c.type + "'");
  }
}

}  // namespace

std::unique_ptr<TensorSource> open_hdf5_source(const std::string& path) { return std::make_unique<Hdf5Source>(path); }

}  // namespace rd::io
