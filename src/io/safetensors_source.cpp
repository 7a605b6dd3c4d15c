// The safetensors tensor source (see tensor_source.h): the state_dict's tensors and our
// export's __metadata__. The file's own checks (safetensors.h) word tensor errors as
// "safetensors file 'PATH': ..."; metadata that does not fit is "checkpoint 'PATH': ...".
#include <charconv>
#include <type_traits>

#include "io/tensor_source.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/safetensors.h"

namespace rd::io {

namespace {

class SafetensorsSource final : public TensorSource {
 public:
  explicit SafetensorsSource(const std::string& p) : path(p), st(safetensors::File::open(p)) {}

  CheckpointMeta read_meta(bool weights_only) override;
  bool has_group(const std::string& g) override { return g == "state_dict"; }
  std::vector<std::string> names(const std::string& g) override {
    std::vector<std::string> out;
    if (g == "state_dict")
      for (const safetensors::Entry& e : st.tensors()) out.push_back(e.name);  // in data-offset order
    return out;
  }
  // Any dtype the file allows for a counter (integral floats too).
  std::optional<int64_t> counter(const std::string& g, const std::string& name) override {
    const safetensors::Entry* e = entry(g, name);
    if (!e || !is_num_batches_tracked(name)) return std::nullopt;
    return st.read_int_scalar(*e);
  }
  std::optional<std::vector<int64_t>> float_shape(const std::string& g, const std::string& name) override {
    const safetensors::Entry* e = entry(g, name);
    if (!e) return std::nullopt;
    if (e->dtype == safetensors::DType::I64 || e->dtype == safetensors::DType::I32)
      st.bad_tensor(name, std::string("has dtype ") + safetensors::dtype_name(e->dtype) + ", expected F32, F16 or BF16");
    return e->shape;
  }
  void read_floats(const std::string& g, const std::string& name, float* out) override {
    st.read_f32(*entry(g, name), out);
  }

 private:
  std::string path;
  safetensors::File st;

  const safetensors::Entry* entry(const std::string& g, const std::string& name) const {
    return g == "state_dict" ? st.find(name) : nullptr;
  }
  [[noreturn]] void bad(const std::string& what) const { throw UsageError("checkpoint '" + path + "': " + what); }
};

// Our export's __metadata__ (strings only, by the format's rule) back into the meta.
// Files from other tools have none or other keys: fine for --init, which needs tensors only.
CheckpointMeta SafetensorsSource::read_meta(bool weights_only) {
  CheckpointMeta m;
  m.container = "safetensors";
  const auto& md = st.metadata();
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
    m.format_version = integer(meta_key::format_version, 1);
    if (m.format_version > kCheckpointFormatVersion || m.format_version < 1)
      bad("format_version " + std::to_string(m.format_version) + " is not supported (this program reads up to " +
          std::to_string(kCheckpointFormatVersion) + ")");
  }
  m.arch = text(meta_key::arch, "");
  m.head = text(meta_key::head, "");
  m.num_classes = integer(meta_key::num_classes, 0);
  m.image_size = integer(meta_key::image_size, 0);
  m.val_resize_size = integer(meta_key::val_resize_size, 0);
  m.val_crop_size = integer(meta_key::val_crop_size, 0);
  m.normalize = text(meta_key::normalize, "none");
  // The position fields that `export` writes; the rest keep their defaults.
  for_each_position_field(static_cast<RunPosition&>(m), [&](const PositionField& field, auto& value) {
    if (field.exported == PositionField::Export::No) return;
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, double>)
      value = real(field.name, value);
    else
      value = integer(field.name, value);
  });
  m.val_acc = real(meta_key::val_acc, -1.0);
  m.val_loss = real(meta_key::val_loss, 0.0);
  m.created_by = text(meta_key::created_by, "");
  if (md.count(meta_key::class_names)) {
    try {
      m.class_names = safetensors::parse_json_string_array(md.at(meta_key::class_names), "__metadata__ 'class_names'");
    } catch (const UsageError& e) {
      bad(e.what());
    }
  }
  if (m.has_negative_counter() || m.num_classes < 0 || m.image_size < 0)
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
  if (st.tensors().empty()) bad("holds no tensors");
  return m;
}

}  // namespace

std::unique_ptr<TensorSource> open_safetensors_source(const std::string& path) {
  return std::make_unique<SafetensorsSource>(path);
}

}  // namespace rd::io
