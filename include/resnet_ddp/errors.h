// Error handling shared by every component: one exception type carrying a
// message that names the file/flag/call at fault, plus check macros.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace rd {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad user input (flag, file content): the CLI maps this to exit code 2.
struct UsageError : Error {
  using Error::Error;
};

[[noreturn]] void fail_at(const char* file, int line, const std::string& msg);

}  // namespace rd

#define RD_STR_(...) (static_cast<std::ostringstream&&>(std::ostringstream() << __VA_ARGS__)).str()

// RD_CHECK(cond, "message " << value): throws rd::Error naming file:line.
#define RD_CHECK(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) ::rd::fail_at(__FILE__, __LINE__, RD_STR_(__VA_ARGS__)); \
  } while (0)

#define RD_FAIL(...) ::rd::fail_at(__FILE__, __LINE__, RD_STR_(__VA_ARGS__))
