#include "resnet_ddp/train/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "resnet_ddp/errors.h"

namespace rd::train {

namespace {

std::string read_all(int fd) {
  std::string s;
  char buf[512];
  if (::lseek(fd, 0, SEEK_SET) < 0) return s;
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0 && s.size() < 4096;) s.append(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string holder_record() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::string r = "host " + std::string(host) + " pid " + std::to_string(::getpid());
  if (const char* job = std::getenv("SLURM_JOB_ID"); job && *job) r += " slurm job " + std::string(job);
  return r + " since " + when;
}

}  // namespace

OutputLock OutputLock::acquire(const std::string& dir, std::string* stale, std::string* unguarded) {
  const std::string path = (std::filesystem::path(dir) / "resnet_ddp.lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw UsageError("--output-dir: cannot create the lock file '" + path + "': " + std::strerror(errno));
  int rc;
  do rc = ::flock(fd, LOCK_EX | LOCK_NB);
  while (rc != 0 && errno == EINTR);
  if (rc != 0 && (errno == ENOSYS || errno == ENOLCK || errno == EOPNOTSUPP || errno == EINVAL)) {
    // The file system cannot lock: refusing to train would leave such clusters no way to
    // use the default output folder; run unguarded and say so. The record is still
    // written, so a crash is still reported to the next run.
    const int err = errno;
    if (unguarded)
      *unguarded = "the file system of '" + dir + "' does not support flock (" + std::strerror(err) +
                   "; e.g. Lustre mounted without -o flock): this run is not protected against a second run "
                   "in the same folder";
    rc = 0;
  }
  if (rc != 0) {
    // Not ours: close without touching the holder's record.
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? read_all(fd) : std::string();
    ::close(fd);
    if (err != EWOULDBLOCK) throw UsageError("--output-dir: cannot lock '" + path + "': " + std::strerror(err));
    throw UsageError("--output-dir: '" + dir + "' is in use by another run (" +
                     (holder.empty() ? std::string("holder unknown") : holder) + "; lock file " + path +
                     "): two runs in one folder would overwrite each other's last.h5. Give this run its own "
                     "--output-dir, or wait for that run to end");
  }
  OutputLock lock;
  lock.fd_ = fd;
  lock.path_ = path;
  const std::string previous = read_all(fd);
  if (stale) *stale = previous;
  const std::string me = holder_record() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    throw UsageError("--output-dir: cannot write the lock file '" + path + "': " + std::strerror(errno));
  return lock;
}

OutputLock& OutputLock::operator=(OutputLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

void OutputLock::release() {
  if (fd_ < 0) return;
  // An empty record means "ended cleanly"; the file stays, since removing it would let
  // a run that opened it just before lock a file no one else sees.
  if (::ftruncate(fd_, 0) != 0) {
  }
  ::close(fd_);  // drops the flock
  fd_ = -1;
}

OutputLock::~OutputLock() { release(); }

}  // namespace rd::train
