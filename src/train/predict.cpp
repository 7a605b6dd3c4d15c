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
#include "resnet_ddp/train/checkpoint.h"
#include "resnet_ddp/train/commands.h"
#include "resnet_ddp/train/report.h"

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

}  // namespace

int predict_main(const PredictOptions& o) {
  try {
    // Tensors are streamed into the model below; only the metadata is held.
    std::optional<CheckpointReader> ck(std::in_place, o.checkpoint, false);
    const CheckpointMeta m = ck->meta();
    const std::vector<std::string>& classes = m.class_names;
    const data::Split split = o.split == "Train" ? data::Split::Train
                              : o.split == "Test" ? data::Split::Test
                                                  : data::Split::Validation;

    // Inputs: one dataset (root with splits / packed .h5) or a list of files.
    std::unique_ptr<data::Dataset> dataset;
    std::vector<int32_t> truth;
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
    size_t unreadable = 0, ignored = 0;
    // A root with any split folder is a dataset root: a missing split is then an error
    // naming it, not a class folder that does not match.
    auto is_root = [&](const std::string& in) {
      if (data::is_hdf5_file(in)) return true;
      for (data::Split s : {data::Split::Train, data::Split::Validation, data::Split::Test})
        if (data::has_split(in, s, scan.folders)) return true;
      return false;
    };
    if (o.inputs.size() == 1 && is_root(o.inputs[0])) {
      dataset = data::open_dataset(o.inputs[0], split, scan);
      if (dataset->class_names() != classes)
        throw UsageError("predict: the classes of '" + o.inputs[0] + "' differ from the checkpoint's");
      for (size_t i = 0; i < dataset->size(); ++i) truth.push_back(dataset->label(i));
      unreadable = dataset->unreadable_files();
      ignored = dataset->skipped_files() - unreadable;
    } else {
      std::vector<std::string> paths;
      for (const auto& in : o.inputs) {
        if (fs::is_directory(in)) {
          collect_directory(in, classes, paths, truth, ignored);
        } else {
          // A file named explicitly is decoded by its content, whatever its extension;
          // one that is not an image fails below like any unreadable file.
          paths.push_back(in);
          truth.push_back(-1);
        }
      }
      if (paths.empty())
        throw UsageError("predict: no image files found in the given inputs" +
                         (ignored ? " (" + std::to_string(ignored) + " files without an image extension ignored)"
                                  : std::string()));
      dataset = std::make_unique<FileListDataset>(paths, truth, classes);
    }

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
      bo.layout = default_cpu_layout(bo.precision);
      backend = make_cpu_backend(bo);
    }
    // On stderr, so --json output stays one document: which device answered.
    std::fprintf(stderr, "predict: device %s\n", backend->name().c_str());

    ResNetConfig mc;
    mc.arch = m.arch;
    mc.head = parse_head(m.head);
    mc.num_classes = static_cast<int>(m.num_classes);
    ResNet model(*backend, mc);
    ck->load_model(model, false);
    ck.reset();  // closes the file
    model.train(false);

    data::TransformConfig tc;
    tc.image_size = static_cast<int>(m.image_size);
    tc.augment = data::TransformConfig::Augment::None;
    data::TransformPipeline tf(tc, false);
    data::LoaderOptions lo;
    lo.batch_size = o.batch_size;
    lo.workers = o.workers;
    std::vector<int64_t> all(dataset->size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    data::Loader loader(*dataset, tf, lo, all, 0);
    const float* mean = m.normalize == "imagenet" ? data::kImagenetMean : nullptr;
    const float* stdv = m.normalize == "imagenet" ? data::kImagenetStd : nullptr;

    const size_t K = classes.size();
    std::vector<std::vector<double>> probs(dataset->size(), std::vector<double>(K));
    std::vector<int> predicted(dataset->size());
    data::Batch batch;
    std::vector<float> logits_host;
    // The loader stands in a black image for a file it cannot decode; such a sample is
    // an error here (stop at the first batch that has one) or, with --skip-unreadable,
    // left out of the table and the accuracy.
    auto refuse_unreadable = [&] {
      auto failures = loader.failures();
      std::sort(failures.begin(), failures.end());
      std::string msg = "predict: " + std::to_string(failures.size()) +
                        " input(s) could not be read as an image (none is classified; --skip-unreadable skips them):";
      for (size_t i = 0; i < failures.size() && i < 20; ++i) msg += "\n  " + failures[i].second;
      if (failures.size() > 20) msg += "\n  ... and " + std::to_string(failures.size() - 20) + " more";
      throw UsageError(msg);
    };
    while (loader.next(batch)) {
      if (!o.skip_unreadable && loader.failed_samples() > 0) refuse_unreadable();
      Tensor& input = model.input_buffer(batch.n, batch.h, batch.w);
      backend->images_u8_to_activation(batch.images, input, mean, stdv);
      const Tensor& logits = model.forward(input);
      logits_host.resize(static_cast<size_t>(batch.n) * K);
      backend->copy_to_host(logits_host.data(), logits.data, logits_host.size() * sizeof(float));
      for (int r = 0; r < batch.n; ++r) {
        const size_t idx = static_cast<size_t>(batch.indices[static_cast<size_t>(r)]);
        const float* z = logits_host.data() + static_cast<size_t>(r) * K;
        const float zmax = *std::max_element(z, z + K);
        double sum = 0;
        for (size_t k = 0; k < K; ++k) sum += std::exp(static_cast<double>(z[k] - zmax));
        for (size_t k = 0; k < K; ++k) probs[idx][k] = std::exp(static_cast<double>(z[k] - zmax)) / sum;
        // argmax of the logits, first maximum wins (as torch.argmax and training do)
        predicted[idx] = static_cast<int>(std::max_element(z, z + K) - z);
      }
    }

    if (!o.skip_unreadable && loader.failed_samples() > 0) refuse_unreadable();
    std::vector<char> excluded(dataset->size(), 0);
    {
      auto failures = loader.failures();
      std::sort(failures.begin(), failures.end());
      for (const auto& [index, what] : failures) {
        excluded[static_cast<size_t>(index)] = 1;
        std::fprintf(stderr, "warning: skipping %s\n", what.c_str());
      }
      unreadable += failures.size();
    }
    size_t shown = 0;
    for (char x : excluded) shown += x == 0;
    if (shown == 0)
      throw UsageError("predict: none of the inputs could be read as an image (" + std::to_string(unreadable) +
                       " skipped)");

    size_t labelled = 0, correct = 0;
    std::vector<std::vector<int64_t>> confusion(K, std::vector<int64_t>(K, 0));
    for (size_t i = 0; i < truth.size(); ++i) {
      if (truth[i] < 0 || excluded[i]) continue;
      ++labelled;
      correct += predicted[i] == truth[i];
      ++confusion[static_cast<size_t>(truth[i])][static_cast<size_t>(predicted[i])];
    }
    const double accuracy = labelled ? static_cast<double>(correct) / static_cast<double>(labelled) : 0.0;

    std::ostringstream out;
    if (o.json) {
      out << "{\n  \"checkpoint\": " << json_string(o.checkpoint) << ",\n  \"classes\": [";
      for (size_t k = 0; k < K; ++k) out << (k ? ", " : "") << json_string(classes[k]);
      out << "],\n  \"predictions\": [\n";
      size_t written = 0;
      for (size_t i = 0; i < dataset->size(); ++i) {
        if (excluded[i]) continue;
        out << "    {\"image\": " << json_string(dataset->source(i)) << ", \"class\": "
            << json_string(classes[static_cast<size_t>(predicted[i])]);
        if (truth[i] >= 0) out << ", \"label\": " << json_string(classes[static_cast<size_t>(truth[i])]);
        out << ", \"probabilities\": {";
        for (size_t k = 0; k < K; ++k) out << (k ? ", " : "") << json_string(classes[k]) << ": " << py_float(probs[i][k]);
        out << "}}" << (++written < shown ? "," : "") << "\n";
      }
      out << "  ],\n  \"skipped_unreadable\": " << unreadable << ",\n  \"ignored_non_image\": " << ignored;
      if (labelled) {
        out << ",\n  \"labelled\": " << labelled << ",\n  \"correct\": " << correct << ",\n  \"accuracy\": "
            << py_float(accuracy) << ",\n  \"confusion_matrix\": [";
        for (size_t t = 0; t < K; ++t) {
          out << (t ? ", " : "") << "[";
          for (size_t p = 0; p < K; ++p) out << (p ? ", " : "") << confusion[t][p];
          out << "]";
        }
        out << "]";
      }
      out << "\n}\n";
    } else {
      size_t name_w = 5;
      for (size_t i = 0; i < dataset->size(); ++i) name_w = std::max(name_w, dataset->source(i).size());
      size_t class_w = 10;
      for (const auto& c : classes) class_w = std::max(class_w, c.size());
      auto pad = [](const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
      out << pad("image", name_w) << "  " << pad("prediction", class_w);
      if (labelled) out << "  " << pad("label", class_w);
      for (const auto& c : classes) out << "  " << pad("p(" + c + ")", std::max<size_t>(8, c.size() + 3));
      out << "\n";
      char buf[32];
      for (size_t i = 0; i < dataset->size(); ++i) {
        if (excluded[i]) continue;
        out << pad(dataset->source(i), name_w) << "  " << pad(classes[static_cast<size_t>(predicted[i])], class_w);
        if (labelled) out << "  " << pad(truth[i] >= 0 ? classes[static_cast<size_t>(truth[i])] : "-", class_w);
        for (size_t k = 0; k < K; ++k) {
          std::snprintf(buf, sizeof buf, "%.4f", probs[i][k]);
          out << "  " << pad(buf, std::max<size_t>(8, classes[k].size() + 3));
        }
        out << "\n";
      }
      if (unreadable)
        out << "\nSkipped " << unreadable
            << " file(s) that could not be read as an image (--skip-unreadable): not classified, not in the "
               "accuracy; each is named on stderr\n";
      if (ignored) out << (unreadable ? "" : "\n") << "Ignored " << ignored << " file(s) without an image extension\n";
      if (labelled) {
        out << "\nAccuracy: " << py_float(accuracy) << " (" << correct << "/" << labelled << ")\n";
        out << "Confusion matrix (rows: true class, columns: predicted class)\n";
        size_t cell = 6;
        for (const auto& c : classes) cell = std::max(cell, c.size() + 1);
        out << std::string(class_w + 2, ' ');
        for (const auto& c : classes) out << std::string(cell - c.size(), ' ') << c;
        out << "\n";
        for (size_t t = 0; t < K; ++t) {
          out << "  " << pad(classes[t], class_w);
          for (size_t p = 0; p < K; ++p) {
            const std::string v = std::to_string(confusion[t][p]);
            out << std::string(cell - v.size(), ' ') << v;
          }
          out << "\n";
        }
      }
    }
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
