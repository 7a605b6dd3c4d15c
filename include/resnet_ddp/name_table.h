// The command-line spellings of an enumeration: one table per enum, so a value is spelled
// the same in every program's flags, in checkpoints and in messages.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace rd {

template <class E>
using NameTable = std::vector<std::pair<std::string, E>>;

// The spelling of `value` in `table` ("" when absent).
template <class E>
std::string name_of(const NameTable<E>& table, E value) {
  for (const auto& [name, v] : table)
    if (v == value) return name;
  return "";
}

}  // namespace rd
