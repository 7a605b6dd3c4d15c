// Fuzz target: the command-line parser (parse_command_line). The input is argv
// after the program name, arguments separated by NUL bytes. A UsageError is the
// expected refusal; any other exception or a sanitizer report is a finding.
// Bytes after the first 0x01 are the text of a config file, which an argument "@cfg"
// names (--config @cfg), so the file parser is fuzzed too.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/shell_quote.h"
#include "resnet_ddp/app/commands.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string cfg_path = "/tmp/rd_fuzz_flags_" + std::to_string(getpid()) + ".conf";
  size_t end = 0;
  while (end < size && data[end] != 1) ++end;
  {
    std::ofstream cfg(cfg_path, std::ios::binary | std::ios::trunc);
    if (end < size) cfg.write(reinterpret_cast<const char*>(data + end + 1), static_cast<std::streamsize>(size - end - 1));
  }
  size = end;
  std::vector<std::string> args{"resnet_ddp"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  if (args.size() > 64) return 0;
  for (auto& a : args)
    if (a == "@cfg") a = cfg_path;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  try {
    rd::train::ParsedCommand cmd = rd::train::parse_command_line(static_cast<int>(args.size()), argv.data());
    (void)rd::join_command_line(static_cast<int>(args.size()), argv.data());
    if (cmd.command == rd::train::Command::Train) (void)cmd.train.metrics_path();
  } catch (const rd::UsageError&) {
  }
  return 0;
}
