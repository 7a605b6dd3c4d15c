// Exclusive use of an output folder for the whole run: two runs writing one
// last.h5 would silently continue each other's training.
//
// An flock(2) on OUTPUT_DIR/resnet_ddp.lock, which records who holds it (host, pid,
// Slurm job). The kernel drops the lock when the process ends however it ends, so a
// crashed run never blocks the next one; its record left in the file tells the next
// run that the previous one did not finish cleanly.
#pragma once

#include <string>

namespace rd::train {

class OutputLock {
 public:
  OutputLock() = default;
  // Takes the lock or throws rd::UsageError naming the folder and the holder.
  // `stale` receives the record of a holder that ended without releasing (crash).
  // On a file system without flock (Lustre mounted without -o flock, some NFS) the run
  // goes on unguarded: `unguarded` (when given) receives why, for a warning.
  static OutputLock acquire(const std::string& dir, std::string* stale = nullptr,
                            std::string* unguarded = nullptr);
  ~OutputLock();
  OutputLock(OutputLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  OutputLock& operator=(OutputLock&& o) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Clean end of the run: empties the record and drops the lock.
  void release();

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace rd::train
