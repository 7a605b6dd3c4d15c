// POSIX shell quoting: a command line recorded as text (a checkpoint's `args`, the
// hint printed after a failure) that a shell, or split_command_line, reads back into
// the same words.
#pragma once

#include <string>
#include <vector>

namespace rd {

// Quotes one argument so a POSIX shell reads it back unchanged.
std::string shell_quote(const std::string& arg);
std::string join_command_line(int argc, char** argv);
std::string join_command_line(const std::vector<std::string>& words);
// Reads back a command line written by join_command_line (POSIX single quotes);
// rd::UsageError on an unterminated quote.
std::vector<std::string> split_command_line(const std::string& line);

}  // namespace rd
