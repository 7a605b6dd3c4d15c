// Named training recipes for --recipe: the tutorial's, and torchvision's published
// ResNet recipes (references/classification), as flag lists applied before the command
// line, so any flag given wins. Printed in full when training starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "resnet_ddp/flags.h"

namespace rd::train {

const std::vector<FlagSet::Preset>& training_recipes();
// The recipe's flags as one line ("--lr 0.5 --epochs 600 ..."); "" for an unknown name.
std::string recipe_flags_line(const std::string& name);
// For --help: each recipe's name and summary.
std::string recipe_help();
// Whether the recipe's own lines set `flag` ("--lr").
bool recipe_sets(const std::string& name, const std::string& flag);

// The global batch a recipe's lr was published for, as GPUs x per-GPU batch; {0, 0} when
// it states none. Far from it, that lr is wrong (a run warns with the scaled value).
struct RecipeBatch {
  int64_t gpus = 0, per_gpu = 0;
};
RecipeBatch recipe_reference_batch(const std::string& name);

}  // namespace rd::train
