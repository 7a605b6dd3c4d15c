// `resnet_ddp predict`: classify images with a checkpoint on one process, and
// score a labelled folder (accuracy + confusion matrix).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/train/report.h"
#include "train/evaluate.h"

namespace fs = std::filesystem;

namespace rd::train {

namespace {

// Images given on the command line (files and folders), as a Dataset so the
// threaded loader decodes them. Label -1 = unknown.
class FileListDataset : public data::Dataset {
 public:
  FileListDataset(std::vector<std::string> paths, std::vector<int32_t> labels, std::vector<std::string> classes)
      : paths_(std::move(paths)), labels_(std::move(labels)), classes_(std::move(classes)) {}
  size_t size() const override { return paths_.size(); }
  int32_t label(size_t i) const override { return std::max(labels_[i], 0); }
  const std::vector<std::string>& class_names() const override { return classes_; }
  std::string source(size_t i) const override { return paths_[i]; }
  std::string description() const override { return "files"; }
  void load(size_t i, data::Image& out) const override { data::decode_image_file(paths_[i], out); }

 private:
  std::vector<std::string> paths_;
  std::vector<int32_t> labels_;
  std::vector<std::string> classes_;
};


// Files without an image extension are ignored, as torchvision's ImageFolder does, and
// counted in `ignored` for the summary.
std::vector<std::string> sorted_images_in(const fs::path& dir, size_t& ignored) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    if (data::has_image_extension(e.path().filename().string()))
      out.push_back(e.path().string());
    else
      ++ignored;
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A directory is either labelled (sub-folders named after classes) or a flat set.
void collect_directory(const fs::path& dir, const std::vector<std::string>& classes, std::vector<std::string>& paths,
                       std::vector<int32_t>& labels, size_t& ignored) {
  std::vector<fs::path> subdirs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) subdirs.push_back(e.path());
  std::sort(subdirs.begin(), subdirs.end());
  if (subdirs.empty()) {
    for (auto& p : sorted_images_in(dir, ignored)) {
      paths.push_back(p);
      labels.push_back(-1);
    }
    return;
  }
  for (const auto& sd : subdirs) {
    const std::string name = sd.filename().string();
    auto it = std::find(classes.begin(), classes.end(), name);
    if (it == classes.end()) {
      std::string known;
      for (const auto& c : classes) known += (known.empty() ? "" : ", ") + c;
      // A dataset root whose split folders have other names (ImageNet's train/ val/).
      const bool split_like = !classes.empty() && fs::is_directory(sd / classes.front());
      throw UsageError("predict: folder '" + sd.string() + "' is not one of the checkpoint's classes (" + known + ")" +
                       (split_like ? "; it holds class folders: for a dataset root with split folders of other "
                                     "names give them with --train-split NAME --val-split NAME"
                                   : ""));
    }
    for (auto& p : sorted_images_in(sd, ignored)) {
      paths.push_back(p);
      labels.push_back(static_cast<int32_t>(it - classes.begin()));
    }
  }
}

// The inputs to classify, with their labels (-1 = unknown) and what was left out.
struct Inputs {
  std::unique_ptr<data::Dataset> dataset;
  std::vector<int32_t> truth;
  size_t unreadable = 0, ignored = 0;
};

// One dataset (root with splits / packed .h5) or a list of files and folders.
Inputs open_inputs(const PredictOptions& o, const std::vector<std::string>& classes) {
  Inputs in;
  const data::Split split = o.split == "Train" ? data::Split::Train
                            : o.split == "Test" ? data::Split::Test
                                                : data::Split::Validation;
  data::ScanOptions scan;
  scan.folders.train = o.train_split;
  scan.folders.validation = o.val_split;
  // The checkpoint names the classes: the split read is all that must exist.
  scan.class_names = classes;
  scan.require_every_class = false;
  scan.data_flag = "input";
  scan.strict = !o.skip_unreadable;
  scan.strict_flag = "predict";
  scan.strict_hint = " (files that cannot be read are never classified; --skip-unreadable skips them)";
  scan.log = [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); };
  // A root with any split folder is a dataset root: a missing split is then an error
  // naming it, not a class folder that does not match.
  auto is_root = [&](const std::string& path) {
    if (data::is_hdf5_file(path)) return true;
    for (data::Split s : {data::Split::Train, data::Split::Validation, data::Split::Test})
      if (data::has_split(path, s, scan.folders)) return true;
    return false;
  };
  if (o.inputs.size() == 1 && is_root(o.inputs[0])) {
    in.dataset = data::open_dataset(o.inputs[0], split, scan);
    if (in.dataset->class_names() != classes)
      throw UsageError("predict: the classes of '" + o.inputs[0] + "' differ from the checkpoint's");
    for (size_t i = 0; i < in.dataset->size(); ++i) in.truth.push_back(in.dataset->label(i));
    in.unreadable = in.dataset->unreadable_files();
    in.ignored = in.dataset->skipped_files() - in.unreadable;
    return in;
  }
  std::vector<std::string> paths;
  for (const auto& path : o.inputs) {
    if (fs::is_directory(path)) {
      collect_directory(path, classes, paths, in.truth, in.ignored);
    } else {
      // A file named explicitly is decoded by its content, whatever its extension;
      // one that is not an image fails below like any unreadable file.
      paths.push_back(path);
      in.truth.push_back(-1);
    }
  }
  if (paths.empty())
    throw UsageError("predict: no image files found in the given inputs" +
                     (in.ignored ? " (" + std::to_string(in.ignored) + " files without an image extension ignored)"
                                 : std::string()));
  in.dataset = std::make_unique<FileListDataset>(paths, in.truth, classes);
  return in;
}

std::unique_ptr<Backend> make_backend(const PredictOptions& o) {
  BackendOptions bo;
  bo.threads = o.threads;
  // More compute threads than cores only contend (see Trainer::resolve_threads).
  if (const int cores = dist::affinity_cpus(); o.threads > cores) {
    std::fprintf(stderr,
                 "resnet_ddp: warning: --threads %d: more threads than the %d core(s) this process may use (its "
                 "CPU affinity); clamped to %d\n",
                 o.threads, cores, cores);
    bo.threads = cores;
  }
  std::unique_ptr<Backend> backend;
  if (o.device == Device::Cuda || (o.device == Device::Auto && cuda_backend_available())) {
    backend = make_cuda_backend(bo);
  } else {
    backend = make_cpu_backend(bo);
  }
  // On stderr, so --json output stays one document: which device answered.
  std::fprintf(stderr, "predict: device %s\n", backend->name().c_str());
  return backend;
}

// The loader stands in a black image for a file it cannot decode; such a sample is
// an error here (stop at the first batch that has one) or, with --skip-unreadable,
// left out of the table and the accuracy.
[[noreturn]] void refuse_unreadable(const data::Loader& loader) {
  auto failures = loader.failures();
  std::sort(failures.begin(), failures.end());
  std::string msg = "predict: " + std::to_string(failures.size()) +
                    " input(s) could not be read as an image (none is classified; --skip-unreadable skips them):";
  for (size_t i = 0; i < failures.size() && i < 20; ++i) msg += "\n  " + failures[i].second;
  if (failures.size() > 20) msg += "\n  ... and " + std::to_string(failures.size() - 20) + " more";
  throw UsageError(msg);
}

// Every input's class probabilities and prediction, and which were left out.
struct Results {
  size_t classes = 0;
  std::vector<std::vector<double>> probs;
  std::vector<int> predicted;
  std::vector<char> excluded;
  size_t shown = 0;
  size_t labelled = 0, correct = 0;
  std::vector<std::vector<int64_t>> confusion;
  double accuracy = 0;
  std::vector<std::vector<int>> top5;  // each input's kTopK best classes (validation's rule)
  size_t correct_top5 = 0;
  double accuracy_top5 = 0;
};

// Softmax of each row of logits (float64), and the arg-max of the logits.
void take_logits(const data::Batch& batch, const float* logits, Results& res) {
  const size_t K = res.classes;
  for (int r = 0; r < batch.n; ++r) {
    const size_t idx = static_cast<size_t>(batch.indices[static_cast<size_t>(r)]);
    const float* z = logits + static_cast<size_t>(r) * K;
    const float zmax = *std::max_element(z, z + K);
    double sum = 0;
    for (size_t k = 0; k < K; ++k) sum += std::exp(static_cast<double>(z[k] - zmax));
    for (size_t k = 0; k < K; ++k) res.probs[idx][k] = std::exp(static_cast<double>(z[k] - zmax)) / sum;
    // argmax of the logits, first maximum wins (as torch.argmax and training do)
    res.predicted[idx] = static_cast<int>(std::max_element(z, z + K) - z);
    res.top5[idx] = top_k_classes(z, static_cast<int>(K), kTopK);
  }
}

Results classify(const PredictOptions& o, std::optional<io::CheckpointReader>& ck, Inputs& in) {
  const io::CheckpointMeta m = ck->meta();
  std::unique_ptr<Backend> backend = make_backend(o);
  ResNet model(*backend, io::model_config(m));
  ck->load_model(model, false);
  ck.reset();  // closes the file

  data::TransformConfig tc;
  tc.image_size = static_cast<int>(m.image_size);
  tc.val_resize_size = static_cast<int>(m.val_resize_size);  // the evaluation the model was validated with
  tc.val_crop_size = static_cast<int>(m.val_crop_size);
  data::TransformPipeline tf(tc, false);
  data::LoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.workers = o.workers;
  const size_t n = in.dataset->size();
  std::vector<int64_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = static_cast<int64_t>(i);
  data::Loader loader(*in.dataset, tf, lo, all, 0);

  Results res;
  res.classes = m.class_names.size();
  res.probs.assign(n, std::vector<double>(res.classes));
  res.predicted.assign(n, 0);
  res.top5.assign(n, {});
  std::vector<float> logits_host;
  evaluate(model, loader, normalization(m.normalize), [&](const data::Batch& batch, const Tensor& logits) {
    if (!o.skip_unreadable && loader.failed_samples() > 0) refuse_unreadable(loader);
    logits_host.resize(static_cast<size_t>(batch.n) * res.classes);
    backend->copy_to_host(logits_host.data(), logits.data, logits_host.size() * sizeof(float));
    take_logits(batch, logits_host.data(), res);
  });
  if (!o.skip_unreadable && loader.failed_samples() > 0) refuse_unreadable(loader);
  res.excluded.assign(n, 0);
  auto failures = loader.failures();
  std::sort(failures.begin(), failures.end());
  for (const auto& [index, what] : failures) {
    res.excluded[static_cast<size_t>(index)] = 1;
    std::fprintf(stderr, "warning: skipping %s\n", what.c_str());
  }
  in.unreadable += failures.size();
  return res;
}

// Accuracy and confusion matrix over the labelled inputs that were classified.
void tally(const std::vector<int32_t>& truth, Results& res) {
  const size_t K = res.classes;
  res.confusion.assign(K, std::vector<int64_t>(K, 0));
  for (size_t i = 0; i < truth.size(); ++i) {
    if (truth[i] < 0 || res.excluded[i]) continue;
    ++res.labelled;
    res.correct += res.predicted[i] == truth[i];
    const auto& top = res.top5[i];
    res.correct_top5 += std::find(top.begin(), top.end(), truth[i]) != top.end();
    ++res.confusion[static_cast<size_t>(truth[i])][static_cast<size_t>(res.predicted[i])];
  }
  res.accuracy = res.labelled ? static_cast<double>(res.correct) / static_cast<double>(res.labelled) : 0.0;
  res.accuracy_top5 =
      res.labelled ? static_cast<double>(res.correct_top5) / static_cast<double>(res.labelled) : 0.0;
}

void write_json(std::ostream& out, const PredictOptions& o, const std::vector<std::string>& classes,
                const Inputs& in, const Results& res) {
  const size_t K = classes.size();
  out << "{\n  \"checkpoint\": " << json_string(o.checkpoint) << ",\n  \"weights\": \""
      << (o.ema ? "model_ema" : "model") << "\",\n  \"classes\": [";
  for (size_t k = 0; k < K; ++k) out << (k ? ", " : "") << json_string(classes[k]);
  out << "],\n  \"predictions\": [\n";
  size_t written = 0;
  for (size_t i = 0; i < in.dataset->size(); ++i) {
    if (res.excluded[i]) continue;
    out << "    {\"image\": " << json_string(in.dataset->source(i)) << ", \"class\": "
        << json_string(classes[static_cast<size_t>(res.predicted[i])]);
    if (in.truth[i] >= 0) out << ", \"label\": " << json_string(classes[static_cast<size_t>(in.truth[i])]);
    out << ", \"probabilities\": {";
    for (size_t k = 0; k < K; ++k) out << (k ? ", " : "") << json_string(classes[k]) << ": " << py_float(res.probs[i][k]);
    out << "}}" << (++written < res.shown ? "," : "") << "\n";
  }
  out << "  ],\n  \"skipped_unreadable\": " << in.unreadable << ",\n  \"ignored_non_image\": " << in.ignored;
  if (res.labelled) {
    out << ",\n  \"labelled\": " << res.labelled << ",\n  \"correct\": " << res.correct << ",\n  \"accuracy\": "
        << py_float(res.accuracy) << ",\n  \"correct_top5\": " << res.correct_top5
        << ",\n  \"accuracy_top5\": " << py_float(res.accuracy_top5) << ",\n  \"confusion_matrix\": [";
    for (size_t t = 0; t < K; ++t) {
      out << (t ? ", " : "") << "[";
      for (size_t p = 0; p < K; ++p) out << (p ? ", " : "") << res.confusion[t][p];
      out << "]";
    }
    out << "]";
  }
  out << "\n}\n";
}

std::string pad(const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); }

void write_confusion(std::ostream& out, const std::vector<std::string>& classes, size_t class_w, const Results& res) {
  const size_t K = classes.size();
  out << "\nAccuracy: " << py_float(res.accuracy) << " (" << res.correct << "/" << res.labelled << ")\n";
  out << "Top-5 accuracy: " << py_float(res.accuracy_top5) << " (" << res.correct_top5 << "/" << res.labelled << ")\n";
  out << "Confusion matrix (rows: true class, columns: predicted class)\n";
  size_t cell = 6;
  for (const auto& c : classes) cell = std::max(cell, c.size() + 1);
  out << std::string(class_w + 2, ' ');
  for (const auto& c : classes) out << std::string(cell - c.size(), ' ') << c;
  out << "\n";
  for (size_t t = 0; t < K; ++t) {
    out << "  " << pad(classes[t], class_w);
    for (size_t p = 0; p < K; ++p) {
      const std::string v = std::to_string(res.confusion[t][p]);
      out << std::string(cell - v.size(), ' ') << v;
    }
    out << "\n";
  }
}

void write_table(std::ostream& out, const std::vector<std::string>& classes, const Inputs& in, const Results& res) {
  const size_t K = classes.size();
  size_t name_w = 5;
  for (size_t i = 0; i < in.dataset->size(); ++i) name_w = std::max(name_w, in.dataset->source(i).size());
  size_t class_w = 10;
  for (const auto& c : classes) class_w = std::max(class_w, c.size());
  out << pad("image", name_w) << "  " << pad("prediction", class_w);
  if (res.labelled) out << "  " << pad("label", class_w);
  for (const auto& c : classes) out << "  " << pad("p(" + c + ")", std::max<size_t>(8, c.size() + 3));
  out << "\n";
  char buf[32];
  for (size_t i = 0; i < in.dataset->size(); ++i) {
    if (res.excluded[i]) continue;
    out << pad(in.dataset->source(i), name_w) << "  " << pad(classes[static_cast<size_t>(res.predicted[i])], class_w);
    if (res.labelled) out << "  " << pad(in.truth[i] >= 0 ? classes[static_cast<size_t>(in.truth[i])] : "-", class_w);
    for (size_t k = 0; k < K; ++k) {
      std::snprintf(buf, sizeof buf, "%.4f", res.probs[i][k]);
      out << "  " << pad(buf, std::max<size_t>(8, classes[k].size() + 3));
    }
    out << "\n";
  }
  if (in.unreadable)
    out << "\nSkipped " << in.unreadable
        << " file(s) that could not be read as an image (--skip-unreadable): not classified, not in the "
           "accuracy; each is named on stderr\n";
  if (in.ignored) out << (in.unreadable ? "" : "\n") << "Ignored " << in.ignored << " file(s) without an image extension\n";
  if (res.labelled) write_confusion(out, classes, class_w, res);
}

}  // namespace

int predict_main(const PredictOptions& o) {
  try {
    // Tensors are streamed into the model below; only the metadata is held.
    std::optional<io::CheckpointReader> ck(std::in_place, o.checkpoint, false,
                                           o.ema ? io::CheckpointReader::Weights::Ema
                                                 : io::CheckpointReader::Weights::Model);
    // On stderr, so --json output stays one document.
    if (o.ema) std::fprintf(stderr, "predict: weights: the weight EMA (%s)\n", ck->weights_origin().c_str());
    const std::vector<std::string> classes = ck->meta().class_names;
    Inputs in = open_inputs(o, classes);
    Results res = classify(o, ck, in);
    for (char x : res.excluded) res.shown += x == 0;
    if (res.shown == 0)
      throw UsageError("predict: none of the inputs could be read as an image (" + std::to_string(in.unreadable) +
                       " skipped)");
    tally(in.truth, res);
    std::ostringstream out;
    if (o.json)
      write_json(out, o, classes, in, res);
    else
      write_table(out, classes, in, res);
    std::fputs(out.str().c_str(), stdout);
    std::fflush(stdout);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace rd::train
