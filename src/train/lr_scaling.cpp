#include "train/lr_scaling.h"

#include <algorithm>
#include <cmath>

#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/recipes.h"
#include "resnet_ddp/train/report.h"

namespace rd::train {

namespace {

// The flag's own value, not the recipe's: the parser counts a recipe's line as given too.
bool typed(const TrainOptions& o, const std::string& flag) {
  const auto n = std::count(o.given.begin(), o.given.end(), flag);
  return n > (!o.recipe.empty() && recipe_sets(o.recipe, flag) ? 1 : 0);
}

std::string global_batch_text(const TrainOptions& o, int world) {
  return std::to_string(static_cast<int64_t>(world) * o.batch_size * o.accum_steps) + " (" + std::to_string(world) +
         " rank(s) x batch " + std::to_string(o.batch_size) + " x accum " + std::to_string(o.accum_steps) + ")";
}

}  // namespace

LrChoice choose_lr(const TrainOptions& o, int world) {
  LrChoice c;
  c.lr = o.lr;
  const int64_t global = static_cast<int64_t>(world) * o.batch_size * o.accum_steps;
  if (o.lr_base > 0) {
    if (typed(o, "--lr")) {
      c.line = "Notice: --lr " + py_float(o.lr) + " given: it wins over --lr-base (as in timm)";
      return c;
    }
    std::string scale = o.lr_base_scale;
    if (scale == "auto") {  // timm: square root for the adaptive optimizers ('ada', 'lamb' in the name)
      const std::string opt = name_of(optimizer_names(), o.optimizer);
      scale = opt.find("ada") != std::string::npos || opt.find("lamb") != std::string::npos ? "sqrt" : "linear";
    }
    const double ratio = static_cast<double>(global) / static_cast<double>(o.lr_base_size);
    c.derived = true;
    c.lr = o.lr_base * (scale == "sqrt" ? std::sqrt(ratio) : ratio);
    c.line = "Learning rate " + py_float(c.lr) + " = --lr-base " + py_float(o.lr_base) + " x " +
             (scale == "sqrt" ? "sqrt(" : "(") + std::to_string(global) + " / --lr-base-size " +
             std::to_string(o.lr_base_size) + ") (" + scale + " scaling; global batch " + global_batch_text(o, world) +
             ")";
    return c;
  }
  const RecipeBatch ref = recipe_reference_batch(o.recipe);
  const int64_t ref_global = ref.gpus * ref.per_gpu;
  if (ref_global > 0 && recipe_sets(o.recipe, "--lr") && !typed(o, "--lr") &&
      (global * 2 < ref_global || global > ref_global * 2)) {
    const double scaled = o.lr * static_cast<double>(global) / static_cast<double>(ref_global);
    c.warning = "--recipe " + o.recipe + ": its lr " + py_float(o.lr) + " is for a global batch of " +
                std::to_string(ref_global) + " (" + std::to_string(ref.gpus) + " GPUs x batch " +
                std::to_string(ref.per_gpu) + "); this run's is " + global_batch_text(o, world) +
                ". Scaled linearly the lr is " + py_float(scaled) + ": pass --lr " + py_float(scaled) +
                ", or --lr-base " + py_float(o.lr) + " --lr-base-size " + std::to_string(ref_global) +
                " to derive it from any global batch";
  }
  return c;
}

void apply_lr_choice(TrainOptions& o, const LrChoice& c) {
  if (!c.derived) return;
  o.lr = c.lr;
  o.given.push_back("--lr");
}

}  // namespace rd::train
