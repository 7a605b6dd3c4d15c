// An HDF5 file driver that never reports a failed write to HDF5.
//
// HDF5 1.10 cannot recover from a failed write: the file then fails to close and
// the library crashes at exit while closing it again. So checkpoints are written
// through this minimal POSIX driver (the sec2 driver's behaviour and file layout):
// the first failing system call is latched in the IoLatch active on the calling
// thread and HDF5 is told the call succeeded; the writer checks the latch after
// every dataset and after the close.
#pragma once

#include <hdf5.h>

namespace rd::io {

struct IoLatch {
  int err = 0;         // errno of the first failed system call, 0 when none failed
  const char* op = "";  // which call ("write", "create", ...)
};

// Makes `latch` the one this thread's driver calls record into, for its lifetime.
class LatchScope {
 public:
  explicit LatchScope(IoLatch& latch);
  ~LatchScope();
  LatchScope(const LatchScope&) = delete;
  LatchScope& operator=(const LatchScope&) = delete;
};

// The driver's id, registered on first use; pass it to H5Pset_driver.
hid_t latch_driver();

}  // namespace rd::io
