/* LD_PRELOADed in sanitizer test runs only (tools/sanitize/run_ctest.sh): dlclose
 * does nothing. Open MPI dlcloses its MCA components in MPI_Finalize, before
 * LeakSanitizer runs at exit; the component frames of its known leaks then show as
 * "<unknown module>" and the named suppressions in lsan.supp cannot match them. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
