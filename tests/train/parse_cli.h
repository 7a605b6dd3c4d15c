// Parses a resnet_ddp command line given as words (the program name is added), for the
// CLI tests of tests/train.
#pragma once

#include <string>
#include <vector>

#include "resnet_ddp/app/commands.h"

inline rd::train::ParsedCommand parse_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "resnet_ddp");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return rd::train::parse_command_line(static_cast<int>(argv.size()), argv.data());
}
