// A fuzz target's per-process scratch directory, in /dev/shm where there is one (the
// targets rewrite a file on every input), removed with the target's fixture.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace rd::fuzz {

struct ScratchDir {
  std::string path;
  explicit ScratchDir(const std::string& prefix) {
    namespace fs = std::filesystem;
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    path = (base / (prefix + "." + std::to_string(getpid()))).string();
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

}  // namespace rd::fuzz
