// Subcommands of the resnet_ddp CLI that belong to the data component. Each parses
// its own flags (--help prints usage, exit 0), reports a bad flag by name and returns
// 2, and returns 0 on success / 1 on a runtime failure.
#pragma once

#include <string>

namespace rd::data {

// resnet_ddp synth --out DIR [--train N] [--val M] [--classes K | --class-names A,B,C]
//                  [--size WxH] [--seed S] [--format jpg|png]
// Writes a procedurally generated ImageFolder tree whose classes are learnable but
// not trivial. Default shape like Dataset_2: classes C0 C2 C4, 1322 train / 363 val.
int synth_main(int argc, char** argv);

// resnet_ddp pack --data DIR --out FILE.h5 [--image-size 244] [--compress 0-9]
//                 [--strict-data] [--jpeg-draft] [--threads T]
// Decodes and resizes every image once into one HDF5 file (layout in pack.h).
int pack_main(int argc, char** argv);

}  // namespace rd::data
