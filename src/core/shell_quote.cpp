#include "resnet_ddp/shell_quote.h"

#include "resnet_ddp/errors.h"

namespace rd {

std::string shell_quote(const std::string& a) {
  if (!a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+@%") == std::string::npos)
    return a;
  std::string q = "'";
  for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join_command_line(int argc, char** argv) {
  return join_command_line(std::vector<std::string>(argv, argv + argc));
}

std::string join_command_line(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i) s += ' ';
    s += shell_quote(words[i]);
  }
  return s;
}

std::vector<std::string> split_command_line(const std::string& line) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ') {
      if (in_word) out.push_back(word);
      word.clear();
      in_word = false;
    } else if (c == '\'') {
      in_word = true;
      const size_t end = line.find('\'', i + 1);
      if (end == std::string::npos) throw UsageError("unterminated quote in command line: " + line);
      word += line.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '\\' && i + 1 < line.size()) {
      in_word = true;
      word += line[++i];
    } else {
      in_word = true;
      word += c;
    }
  }
  if (in_word) out.push_back(word);
  return out;
}

}  // namespace rd
