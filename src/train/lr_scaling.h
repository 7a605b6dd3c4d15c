// The learning rate and the global batch: timm's --lr-base rule, which
// derives the lr from the global batch, and the warning for a recipe's lr used at a
// global batch far from the one the recipe was published for.
#pragma once

#include <string>
#include <vector>

#include "resnet_ddp/train/cli.h"

namespace rd::train {

struct LrChoice {
  bool derived = false;  // --lr-base set the learning rate: `lr`
  double lr = 0.0;
  std::string line;     // how the run's lr came about (printed at start; "" for a plain --lr)
  std::string warning;  // a recipe's lr at a global batch more than 2x from its reference
};

// The global batch is --batch-size x `world` ranks x --accum-steps. timm's rule: an --lr
// given (on the command line or in --config; a recipe's does not count) wins over
// --lr-base, which otherwise sets lr = lr_base x global / lr_base_size (or its square root
// under --lr-base-scale sqrt; auto = sqrt for adam, adamw and lamb, as timm).
LrChoice choose_lr(const TrainOptions& o, int world);

// A derived lr becomes --lr, counted as given: a resume compares it with the
// checkpoint's like a typed one (a changed global batch is then a changed lr).
void apply_lr_choice(TrainOptions& o, const LrChoice& c);

}  // namespace rd::train
