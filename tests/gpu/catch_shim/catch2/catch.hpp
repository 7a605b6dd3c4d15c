// A minimal stand-in for the Catch2 v2 macros tests/gpu uses (TEST_CASE, INFO,
// CHECK, CHECK_FALSE, REQUIRE, FAIL, WARN, Approx), for the standalone GPU-host
// build (tools/gpu_check.sh), where Catch2 is not installed. The CMake build
// uses the real Catch2; this header is only on the include path of the
// standalone build. Test cases run in registration order; `main` comes from
// RD_CATCH_SHIM_MAIN.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace rd_shim {

struct TestCase {
  std::string name;
  void (*fn)();
};
inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> r;
  return r;
}
struct Registrar {
  Registrar(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};
inline std::vector<std::string>& info_stack() {
  static std::vector<std::string> s;
  return s;
}
struct ScopedInfo {
  explicit ScopedInfo(std::string s) { info_stack().push_back(std::move(s)); }
  ~ScopedInfo() { info_stack().pop_back(); }
};
struct Counters {
  long checks = 0, failures = 0;
};
inline Counters& counters() {
  static Counters c;
  return c;
}
struct RequireFailed {};

inline bool report(bool ok, const char* expr, const char* file, int line) {
  ++counters().checks;
  if (ok) return true;
  ++counters().failures;
  std::cout << file << ":" << line << ": FAILED: " << expr << "\n";
  for (const auto& s : info_stack()) std::cout << "  with: " << s << "\n";
  return false;
}

class Approx {
 public:
  explicit Approx(double v) : value_(v) {}
  Approx& epsilon(double e) {
    eps_ = e;
    return *this;
  }
  Approx& margin(double m) {
    margin_ = m;
    return *this;
  }
  friend bool operator==(double x, const Approx& a) {
    const double d = std::fabs(x - a.value_);
    return d <= a.margin_ || d <= a.eps_ * std::fabs(a.value_);
  }
  friend bool operator==(const Approx& a, double x) { return x == a; }

 private:
  double value_;
  double eps_ = 1.1920929e-7 * 100;
  double margin_ = 0.0;
};

}  // namespace rd_shim

using rd_shim::Approx;

#define RD_SHIM_CAT2(a, b) a##b
#define RD_SHIM_CAT(a, b) RD_SHIM_CAT2(a, b)
#define RD_SHIM_STR(...) (static_cast<std::ostringstream&&>(std::ostringstream() << __VA_ARGS__)).str()

#define TEST_CASE(name, ...)                                                                   \
  static void RD_SHIM_CAT(rd_shim_test_, __LINE__)();                                          \
  static ::rd_shim::Registrar RD_SHIM_CAT(rd_shim_reg_, __LINE__)(name, &RD_SHIM_CAT(rd_shim_test_, __LINE__)); \
  static void RD_SHIM_CAT(rd_shim_test_, __LINE__)()

#define INFO(...) ::rd_shim::ScopedInfo RD_SHIM_CAT(rd_shim_info_, __LINE__)(RD_SHIM_STR(__VA_ARGS__))
#define CHECK(...) (void)::rd_shim::report(static_cast<bool>(__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)
#define CHECK_FALSE(...) (void)::rd_shim::report(!(__VA_ARGS__), "!(" #__VA_ARGS__ ")", __FILE__, __LINE__)
#define REQUIRE(...)                                                                   \
  do {                                                                                 \
    if (!::rd_shim::report(static_cast<bool>(__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)) \
      throw ::rd_shim::RequireFailed{};                                                \
  } while (0)
#define FAIL(...)                                                                            \
  do {                                                                                       \
    ::rd_shim::report(false, RD_SHIM_STR(__VA_ARGS__).c_str(), __FILE__, __LINE__);          \
    throw ::rd_shim::RequireFailed{};                                                        \
  } while (0)
#define WARN(...) (std::cout << "warning: " << RD_SHIM_STR(__VA_ARGS__) << "\n")

#ifdef RD_CATCH_SHIM_MAIN
// Runs every test case (or those whose name contains argv[1]); exit 0 when all pass.
int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  long cases = 0, failed_cases = 0;
  for (const auto& t : rd_shim::registry()) {
    if (!filter.empty() && t.name.find(filter) == std::string::npos) continue;
    ++cases;
    const long before = rd_shim::counters().failures;
    try {
      t.fn();
    } catch (const rd_shim::RequireFailed&) {
    } catch (const std::exception& e) {
      ++rd_shim::counters().failures;
      std::cout << "  exception: " << e.what() << "\n";
    }
    const bool ok = rd_shim::counters().failures == before;
    failed_cases += ok ? 0 : 1;
    std::cout << (ok ? "PASS " : "FAIL ") << t.name << std::endl;
  }
  std::cout << cases - failed_cases << "/" << cases << " test cases passed, "
            << rd_shim::counters().checks << " checks, " << rd_shim::counters().failures
            << " failed" << std::endl;
  return failed_cases ? 1 : 0;
}
#endif
