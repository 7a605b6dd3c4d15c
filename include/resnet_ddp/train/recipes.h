// Named training recipes for --recipe: the tutorial's, and torchvision's published
// ResNet recipes (references/classification), as flag lists applied before the command
// line, so any flag given wins. Printed in full when training starts.
#pragma once

#include <string>
#include <vector>

#include "resnet_ddp/flags.h"

namespace rd::train {

const std::vector<FlagSet::Preset>& training_recipes();
// The recipe's flags as one line ("--lr 0.5 --epochs 600 ..."); "" for an unknown name.
std::string recipe_flags_line(const std::string& name);
// For --help: each recipe's name and summary.
std::string recipe_help();

}  // namespace rd::train
