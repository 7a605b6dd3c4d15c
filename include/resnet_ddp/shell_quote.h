// POSIX shell quoting, for the command lines the programs print and record.
#pragma once

#include <string>

namespace rd {

// Quotes one argument so a POSIX shell reads it back unchanged.
std::string shell_quote(const std::string& arg);

}  // namespace rd
