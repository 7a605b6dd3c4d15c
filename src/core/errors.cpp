#include "resnet_ddp/errors.h"

#include <cstring>

namespace rd {

[[noreturn]] void fail_at(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(msg + " (" + (base ? base + 1 : file) + ":" + std::to_string(line) + ")");
}

}  // namespace rd
