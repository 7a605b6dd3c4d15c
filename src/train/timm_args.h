// timm's args.yaml as a --config file: the dialect that translates the keys timm's
// train.py writes into this program's flags (docs/usage.md, "timm's args.yaml").
#pragma once

#include "resnet_ddp/flags.h"

namespace rd::train {

// Whether a YAML file's keys are timm's: it has a key timm's train.py always writes and
// this program has no flag for (aa, reprob, img_size, ...).
bool looks_like_timm_args(const std::vector<FlagSet::ConfigKey>& keys);

// Rewrites a timm args.yaml's keys into flag settings; keys that do not change training
// here go to out.ignored, the ones that would and cannot be honoured to out.refused.
// Keys it does not know stay, to be read as flag names (an error unless null).
void translate_timm_args(std::vector<FlagSet::ConfigKey>& keys, FlagSet::ConfigTranslation& out);

}  // namespace rd::train
