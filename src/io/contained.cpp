// A function run in a child process (see contained.h).
#include "io/contained.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

namespace rd::io {

namespace {

// The child: runs fn, writes what it returned to `fd`, never returns.
[[noreturn]] void child(const std::function<std::string()>& fn, int fd) {
  std::string msg;
  try {
    msg = fn();
  } catch (...) {
  }
  for (size_t off = 0; off < msg.size();) {
    const ssize_t n = ::write(fd, msg.data() + off, msg.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  ::_exit(0);  // no atexit handlers, no stdio flush, no MPI finalisation
}

// Reads the child's message until it closes the pipe or the deadline passes; false on timeout.
bool read_until(int fd, std::string& msg, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r != 0;
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    msg.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

ContainedResult run_contained(const std::function<std::string()>& fn, int timeout_s) {
  ContainedResult res;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return res;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return res;
  }
  if (pid == 0) {
    ::close(fds[0]);
    child(fn, fds[1]);
  }
  ::close(fds[1]);
  const bool finished = read_until(fds[0], res.message, timeout_s);
  ::close(fds[0]);
  if (!finished) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!finished) {
    res.outcome = ContainedResult::TimedOut;
  } else if (WIFSIGNALED(status)) {
    res.outcome = ContainedResult::Crashed;
    res.signal = WTERMSIG(status);
  } else {
    res.outcome = ContainedResult::Returned;
  }
  return res;
}

}  // namespace rd::io
