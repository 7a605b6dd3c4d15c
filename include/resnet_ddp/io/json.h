// A small JSON reader (just what a safetensors header holds) and the JSON string writer
// the file formats share. Depth-limited and bounds-checked: it reads untrusted files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rd::io {

struct Json {
  enum Type { Null, Bool, Number, String, Array, Object } type = Null;
  std::string text;  // String: decoded value; Number: as written
  bool boolean = false;
  std::vector<Json> items;                            // Array
  // Object, in file order: keys[i] names values[i]. Two vectors, not one of pairs:
  // std::pair<std::string, Json> inside Json is an incomplete type clang rejects.
  std::vector<std::string> keys;
  std::vector<Json> values;

  const Json* member(const std::string& key) const {
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &values[i];
    return nullptr;
  }
};

// Parses `text` as one JSON document (a value, then only whitespace). On failure returns
// false and sets `error` to what is wrong and at which byte.
bool parse_json(const std::string& text, Json& out, std::string& error);

// A JSON string literal (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s);

}  // namespace rd::io
