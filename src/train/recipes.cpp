#include "resnet_ddp/train/recipes.h"

namespace rd::train {

// Sources: the tutorial (README: the reference recipe); torchvision's
// references/classification README (ResNet, "all models have been trained on 8x V100
// GPUs with": batch 32, 90 epochs, lr 0.1, momentum 0.9, wd 1e-4, step 30, gamma 0.1,
// with train.py's default transforms RandomResizedCrop 224 + flip, val 256 -> 224), and
// the ResNet50 IMAGENET1K_V2 recipe (vision issue 3995). Per-GPU batch sizes as published:
// on another number of GPUs the global batch (and so the right lr) changes, as in PyTorch.
// The model is not part of a recipe (torchvision's --model is separate): give --arch.
const std::vector<FlagSet::Preset>& training_recipes() {
  static const std::vector<FlagSet::Preset> table = {
      {"tutorial", "the reference tutorial's recipe (the default): ResNet-34 + MLP head, Adam 1e-4, AutoAugment, 244x244",
       {"arch = resnet34", "head = mlp", "optimizer = adam", "lr = 1e-4", "batch-size = 16", "epochs = 5",
        "label-smoothing = 0.1", "scheduler = plateau", "augment = autoaugment", "image-size = 244",
        "normalize = none", "sync-bn"}},
      {"torchvision-resnet-v1",
       "torchvision's 90-epoch ResNet recipe (IMAGENET1K_V1): SGD 0.1 step/30, RandomResizedCrop 224 + flip",
       {"head = fc", "normalize = imagenet", "optimizer = sgd", "lr = 0.1", "momentum = 0.9", "weight-decay = 1e-4",
        "batch-size = 32", "epochs = 90", "lr-scheduler = steplr", "lr-step-size = 30", "lr-gamma = 0.1",
        "label-smoothing = 0", "augment = none", "train-crop-size = 224", "val-resize-size = 256",
        "val-crop-size = 224", "no-sync-bn"}},
      {"torchvision-resnet-v2",
       "torchvision's ResNet50 IMAGENET1K_V2 recipe: 600 epochs, cosine + warmup, TrivialAugment, MixUp/CutMix, "
       "EMA, repeated augmentation",
       {"head = fc", "normalize = imagenet", "optimizer = sgd", "lr = 0.5", "momentum = 0.9", "weight-decay = 2e-5",
        "norm-weight-decay = 0", "batch-size = 128", "epochs = 600", "lr-scheduler = cosineannealinglr",
        "lr-warmup-epochs = 5", "lr-warmup-method = linear", "lr-warmup-decay = 0.01", "label-smoothing = 0.1",
        "mixup-alpha = 0.2", "cutmix-alpha = 1.0", "auto-augment = ta_wide", "random-erase = 0.1",
        "train-crop-size = 176", "val-resize-size = 232", "val-crop-size = 224", "model-ema",
        "model-ema-steps = 32", "model-ema-decay = 0.99998", "ra-sampler", "ra-reps = 4", "no-sync-bn"}},
  };
  return table;
}

std::string recipe_flags_line(const std::string& name) {
  for (const auto& r : training_recipes()) {
    if (r.name != name) continue;
    std::string out;
    for (const auto& line : r.lines) {
      const auto eq = line.find(" = ");
      out += (out.empty() ? "--" : " --") + (eq == std::string::npos ? line : line.substr(0, eq) + " " + line.substr(eq + 3));
    }
    return out;
  }
  return "";
}

bool recipe_sets(const std::string& name, const std::string& flag) {
  for (const auto& r : training_recipes()) {
    if (r.name != name) continue;
    for (const auto& line : r.lines)
      if ("--" + line.substr(0, line.find(" = ")) == flag) return true;
  }
  return false;
}

// torchvision's README: V1 on 8 GPUs x --batch-size 32; V2 (vision issue 3995, the
// "How to train state-of-the-art models" recipe) on 8 GPUs x 128.
RecipeBatch recipe_reference_batch(const std::string& name) {
  if (name == "torchvision-resnet-v1") return {8, 32};
  if (name == "torchvision-resnet-v2") return {8, 128};
  return {};
}

std::string recipe_help() {
  std::string out = "a training recipe's flags, applied before the others (each flag given wins; printed at start)";
  for (const auto& r : training_recipes()) out += "; " + r.name + " = " + r.summary;
  return out;
}

}  // namespace rd::train
