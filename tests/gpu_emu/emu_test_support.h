// What the emulator's own tests share: device buffers in a line, and running a body in a
// child process (a fault, an exit-time file or an invalidated capture ends that process,
// not the test binary) with its stderr captured.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_emu/device.h"

namespace rd::emu_test {

inline float* device_floats(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
  return static_cast<float*>(p);
}

inline std::vector<float> to_host(const float* d, size_t n) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

struct ChildResult {
  int exit_code = -1;
  std::string err;
};

// Runs `body` in a forked child with stderr piped back. The child exits with body's return
// value (0 for a void body) unless body ends the process itself.
template <class F> ChildResult in_child(F body) {
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    int rc = 0;
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) body();
    else rc = body();
    std::fflush(stderr);
    _exit(rc);
  }
  close(pipefd[1]);
  ChildResult r;
  char buf[4096];
  ssize_t got;
  while ((got = read(pipefd[0], buf, sizeof buf)) > 0) r.err.append(buf, static_cast<size_t>(got));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace rd::emu_test
