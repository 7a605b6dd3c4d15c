/* Preloaded by e2e_output_lock_no_flock: flock(2) fails as on a file system that
 * cannot lock (Lustre mounted without -o flock answers ENOSYS). */
#include <errno.h>
#include <sys/file.h>

int flock(int fd, int operation) {
  (void)fd;
  (void)operation;
  errno = ENOSYS;
  return -1;
}
