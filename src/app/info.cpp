// `resnet_ddp info FILE.h5`: a checkpoint's metadata, without loading a model.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <type_traits>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/train/report.h"

namespace rd::train {

namespace {


std::string json_number(double x) {
  // JSON has no NaN/Inf: null keeps the document valid.
  return std::isfinite(x) ? py_float(x) : "null";
}

int64_t count_params(const std::vector<io::TensorInfo>& state_dict) {
  int64_t n = 0;
  for (const auto& t : state_dict) {
    if (t.is_int64_scalar || t.name.find("running_") != std::string::npos) continue;
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    n += count;
  }
  return n;
}

// The metadata and state_dict list of a checkpoint; every tensor is read, so a
// damaged one is refused here as it would be by a load.
struct Contents {
  io::CheckpointMeta meta;
  std::vector<io::TensorInfo> state_dict;
};
Contents read_contents(const std::string& path, bool weights_only) {
  io::CheckpointReader ck(path, weights_only);
  std::vector<io::TensorInfo> tensors = ck.check_tensors();
  return Contents{ck.meta(), std::move(tensors)};
}

// info --json: one object, the state_dict's shapes with --tensors.
void print_json(std::ostringstream& out, const InfoOptions& o, const Contents& s, bool weights_only) {
  const io::CheckpointMeta& m = s.meta;
  out << "{\n  \"file\": " << json_string(o.checkpoint) << ",\n  \"kind\": "
      << json_string(weights_only ? "weights" : "checkpoint") << ",\n  \"container\": " << json_string(m.container) << ",\n  \"format_version\": " << m.format_version
      << ",\n  \"arch\": " << json_string(m.arch) << ",\n  \"head\": " << json_string(m.head)
      << ",\n  \"num_classes\": " << m.num_classes << ",\n  \"class_names\": [";
  for (size_t i = 0; i < m.class_names.size(); ++i) out << (i ? ", " : "") << json_string(m.class_names[i]);
  out << "],\n  \"image_size\": " << m.image_size << ",\n  \"val_resize_size\": " << m.val_resize_size
      << ",\n  \"val_crop_size\": " << m.val_crop_size << ",\n  \"normalize\": " << json_string(m.normalize);
  io::for_each_position_field(static_cast<const io::RunPosition&>(m), [&](const io::PositionField& field, auto value) {
    if (field.preemption_only) return;
    out << ",\n  " << json_string(field.name) << ": ";
    if constexpr (std::is_same_v<decltype(value), double>)
      out << json_number(value);
    else
      out << value;
  });
  out << ",\n  \"val_acc\": " << json_number(m.val_acc)
      << ",\n  \"val_loss\": " << json_number(m.val_loss) << ",\n  \"world_size\": " << m.world_size
      << ",\n  \"batch_size\": " << m.batch_size << ",\n  \"seed\": " << m.seed
      << ",\n  \"parameters\": " << count_params(s.state_dict) << ",\n  \"tensors\": " << s.state_dict.size()
      << ",\n  \"optimizer\": " << json_string(m.optimizer.present ? name_of(optimizer_names(), m.optimizer.config.type) : "")
      << ",\n  \"optimizer_step\": " << m.optimizer.step << ",\n  \"lr\": " << json_number(m.optimizer.lr)
      << ",\n  \"scheduler\": " << json_string(m.scheduler.present ? m.scheduler.type : "")
      << ",\n  \"args\": " << json_string(m.args) << ",\n  \"args_history\": [";
  for (size_t i = 0; i < m.args_history.size(); ++i) out << (i ? ", " : "") << json_string(m.args_history[i]);
  out << "],\n  \"created_by\": " << json_string(m.created_by) << ",\n  \"slurm_job_id\": " << json_string(m.slurm_job_id)
      << ",\n  \"slurm_step_id\": " << json_string(m.slurm_step_id)
      << ",\n  \"slurm_restart_count\": " << m.slurm_restart_count;
  if (o.tensors) {
    out << ",\n  \"state_dict\": {";
    for (size_t i = 0; i < s.state_dict.size(); ++i) {
      const auto& t = s.state_dict[i];
      out << (i ? ", " : "") << json_string(t.name) << ": [";
      for (size_t d = 0; d < t.shape.size(); ++d) out << (d ? ", " : "") << t.shape[d];
      out << "]";
    }
    out << "}";
  }
  out << "\n}\n";
}

// info's text: what the file is, how it was trained, and the tensors with --tensors.
void print_text(std::ostringstream& out, const InfoOptions& o, const Contents& s, bool weights_only) {
  const io::CheckpointMeta& m = s.meta;
  const bool st = m.container == "safetensors";
  out << "file:            " << o.checkpoint << (weights_only ? " (weights only)" : "") << "\n";
  if (st) out << "format:          safetensors" << (weights_only ? "" : " (" + m.created_by + ")") << "\n";
  if (m.container == "pytorch") out << "format:          PyTorch state_dict (torch.save zip)\n";
  else if (!weights_only) out << "format:          resnet_ddp v" << m.format_version << " (" << m.created_by << ")\n";
  if (!m.arch.empty()) out << "model:           " << m.arch << ", " << m.head << " head\n";
  out << "parameters:      " << count_params(s.state_dict) << " in " << s.state_dict.size() << " state_dict tensors\n";
  if (!weights_only) {
    out << "classes:         " << m.num_classes << " (";
    for (size_t i = 0; i < m.class_names.size(); ++i) out << (i ? ", " : "") << m.class_names[i];
    out << ")\nimage size:      " << m.image_size << " (normalize: " << m.normalize << ")\n";
    if (m.val_crop_size > 0)
      out << "evaluation:      Resize(" << m.val_resize_size << ") + CenterCrop(" << m.val_crop_size << ")\n";
    out << "epoch:           " << m.epoch << " completed";
    if (m.step_in_epoch > 0) out << " + " << m.step_in_epoch << " steps of epoch " << m.epoch + 1 << " (preempted)";
    out << "\nglobal step:     " << m.global_step << "\n";
    if (st) {
      if (m.best_val_acc >= 0)
        out << "best val acc:    " << py_float(m.best_val_acc) << " (val loss " << py_float(m.best_val_loss) << ")\n";
      out << "contents:        weights only (no optimizer state; train from it with --init)\n";
    }
  }
  if (!weights_only && !st) {
    if (m.val_acc >= 0) out << "val accuracy:    " << py_float(m.val_acc) << " (val loss " << py_float(m.val_loss) << ")\n";
    out << "best val acc:    " << py_float(m.best_val_acc) << " (val loss " << py_float(m.best_val_loss) << ")\n";
    out << "trained on:      " << m.world_size << " rank(s) x batch " << m.batch_size << ", seed " << m.seed << "\n";
    if (!m.slurm_job_id.empty())  // whose requeue may continue it unasked
      out << "slurm job:       " << m.slurm_job_id << (m.slurm_step_id.empty() ? "" : " step " + m.slurm_step_id)
          << " restart " << m.slurm_restart_count << "\n";
    if (m.optimizer.present)
      out << "optimizer:       " << name_of(optimizer_names(), m.optimizer.config.type) << ", step " << m.optimizer.step << ", lr "
          << py_float(m.optimizer.lr) << " (initial " << py_float(m.optimizer.config.lr) << ")\n";
    if (m.scheduler.present) {
      out << "scheduler:       " << m.scheduler.type;
      if (m.scheduler.type == "plateau")
        out << " (best " << py_float(m.scheduler.plateau.best) << ", bad epochs " << m.scheduler.plateau.num_bad_epochs
            << "/" << m.scheduler.plateau.patience << ")";
      out << "\n";
    }
    out << "command line:    " << m.args << "\n";
    // How the run came to be: its first command and every resume (flags may change).
    if (m.args_history.size() > 1)
      for (size_t i = 0; i < m.args_history.size(); ++i) {
        const std::string label = i == 0 ? "first run:" : "resume " + std::to_string(i) + ":";
        out << label << std::string(label.size() < 17 ? 17 - label.size() : 1, ' ') << m.args_history[i] << "\n";
      }
  }
  if (o.tensors) {
    out << "tensors:\n";
    for (const auto& t : s.state_dict) {
      out << "  " << t.name << "  ";
      if (t.is_int64_scalar) {
        out << "int64 = " << t.int_value;
      } else {
        out << "float32 [";
        for (size_t d = 0; d < t.shape.size(); ++d) out << (d ? ", " : "") << t.shape[d];
        out << "]";
      }
      out << "\n";
    }
  }
}

}  // namespace

int info_main(const InfoOptions& o) {
  Contents s;
  bool weights_only = false;
  try {
    s = read_contents(o.checkpoint, false);
  } catch (const UsageError& full_error) {
    try {
      s = read_contents(o.checkpoint, true);
      weights_only = true;
    } catch (const UsageError&) {
      std::fprintf(stderr, "resnet_ddp: error: %s\n", full_error.what());
      return 2;
    }
  }
  std::ostringstream out;
  if (o.json) print_json(out, o, s, weights_only);
  else print_text(out, o, s, weights_only);
  std::fputs(out.str().c_str(), stdout);
  return 0;
}

}  // namespace rd::train
