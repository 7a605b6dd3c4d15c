#include "resnet_ddp/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "resnet_ddp/errors.h"

namespace rd {

FlagSet::FlagSet(std::string command, std::string program)
    : command_(std::move(command)), program_(std::move(program)) {}

void FlagSet::add(Flag f) { flags_.push_back(std::move(f)); }

void FlagSet::text(const std::string& name, std::string* target, const std::string& metavar,
                   const std::string& help) {
  add({name, metavar, help, *target, false, [target](const std::string&, const std::string& v) { *target = v; },
       [target] { return *target; }});
}

void FlagSet::path(const std::string& name, std::string* target, const std::string& metavar,
                   const std::string& help) {
  add({name, metavar, help, *target, false,
       [target](const std::string& flag, const std::string& v) {
         if (v.empty()) throw UsageError(flag + ": expected a path, got an empty string");
         *target = v;
       },
       [target] { return *target; }});
}

void FlagSet::choice(const std::string& name, std::string* target, std::vector<std::string> choices,
                     const std::string& help) {
  add_choice(
      name, choices, help, [target, choices](size_t i) { *target = choices[i]; },
      [target, choices] {
        return static_cast<size_t>(std::find(choices.begin(), choices.end(), *target) - choices.begin());
      });
}

void FlagSet::add_choice(const std::string& name, const std::vector<std::string>& words, const std::string& help,
                         std::function<void(size_t)> set, std::function<size_t()> get) {
  std::string metavar;
  for (const auto& w : words) metavar += (metavar.empty() ? "" : "|") + w;
  const size_t now = get();
  add({name, metavar, help, now < words.size() ? words[now] : "", false,
       [words, metavar, set](const std::string& flag, const std::string& v) {
         for (size_t i = 0; i < words.size(); ++i)
           if (v == words[i]) return set(i);
         throw UsageError(flag + ": expected one of " + metavar + ", got '" + v + "'");
       },
       [words, get] {
         const size_t i = get();
         return i < words.size() ? words[i] : std::string();
       }});
}

void FlagSet::add_integer(const std::string& name, const std::string& help, int64_t min, int64_t max,
                          std::function<void(int64_t)> set, std::function<int64_t()> get) {
  add({name, "N", help, std::to_string(get()), false,
       [min, max, set](const std::string& flag, const std::string& v) {
         errno = 0;
         char* end = nullptr;
         const long long x = std::strtoll(v.c_str(), &end, 10);
         if (v.empty() || *end != '\0' || errno == ERANGE)
           throw UsageError(flag + ": expected an integer, got '" + v + "'");
         if (x < min || x > max)
           throw UsageError(flag + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                            "], got " + v);
         set(x);
       },
       [get] { return std::to_string(get()); }});
}

void FlagSet::real(const std::string& name, double* target, double min, bool min_exclusive, const std::string& help,
                   double max) {
  std::ostringstream def;
  def << *target;
  add({name, "X", help, def.str(), false,
       [target, min, min_exclusive, max](const std::string& flag, const std::string& v) {
         errno = 0;
         char* end = nullptr;
         const double x = std::strtod(v.c_str(), &end);
         if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x))
           throw UsageError(flag + ": expected a number, got '" + v + "'");
         const bool low = min_exclusive ? !(x > min) : !(x >= min);
         if (low || x > max) {
           std::ostringstream m;
           m << flag << ": expected a number " << (min_exclusive ? "> " : ">= ") << min;
           if (std::isfinite(max)) m << " and <= " << max;
           m << ", got " << v;
           throw UsageError(m.str());
         }
         *target = x;
       },
       // Shortest text that reads back as the same double: 1e-2 and 0.01 compare equal.
       [target] {
         char buf[32];
         for (int prec = 1; prec <= 17; ++prec) {
           std::snprintf(buf, sizeof buf, "%.*g", prec, *target);
           if (std::strtod(buf, nullptr) == *target) break;
         }
         return std::string(buf);
       }});
}

void FlagSet::boolean(const std::string& name, bool* target, const std::string& help) {
  add({name, "", help, "", true, [target](const std::string&, const std::string&) { *target = true; },
       [target] { return std::string(*target ? "on" : "off"); }});
}

void FlagSet::negated(const std::string& name, bool* target, const std::string& help) {
  add({name, "", help, "", true, [target](const std::string&, const std::string&) { *target = false; },
       [target] { return std::string(*target ? "on" : "off"); }});
}

void FlagSet::custom(const std::string& name, const std::string& metavar, const std::string& help,
                     std::function<void(const std::string&)> set) {
  add({name, metavar, help, "", false, [set](const std::string&, const std::string& v) { set(v); }, nullptr});
}

std::vector<std::string> FlagSet::parse(const std::vector<std::string>& args, bool allow_positional,
                                        bool* help_requested, std::vector<std::string>* given) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      *help_requested = true;
      return positional;
    }
    if (a == "--") {
      for (size_t j = i + 1; j < args.size(); ++j) positional.push_back(args[j]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      positional.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    Flag* f = find(name);
    if (!f) throw UsageError(unknown_message(name));
    if (given) given->push_back(name);
    if (f->is_bool) {
      if (has_value) throw UsageError(name + ": takes no value (got '" + value + "')");
      f->set(name, "");
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) throw UsageError(name + ": missing value (" + f->metavar + ")");
      value = args[++i];
    }
    f->set(name, value);
  }
  if (!allow_positional && !positional.empty())
    throw UsageError("unexpected argument '" + positional.front() + "' for '" +
                     (command_.empty() ? program_ : command_) + "' (flags start with --; " + see_help() + ")");
  return positional;
}

std::vector<std::string> FlagSet::parse_or_help(int argc, char** argv, const std::string& usage,
                                                bool allow_positional) {
  bool help_requested = false;
  auto positional = parse(std::vector<std::string>(argv + 1, argv + argc), allow_positional, &help_requested);
  if (help_requested) {
    std::fputs((usage + help() + "  --help                      this text\n").c_str(), stdout);
    std::exit(0);
  }
  return positional;
}

std::string FlagSet::help() const {
  std::ostringstream out;
  for (const auto& f : flags_) {
    std::string lhs = "  " + f.name + (f.is_bool ? "" : " " + f.metavar);
    out << lhs;
    if (lhs.size() < 30) out << std::string(30 - lhs.size(), ' ');
    else out << "\n" << std::string(30, ' ');
    out << f.help;
    if (!f.is_bool && !f.default_value.empty()) out << " [default: " << f.default_value << "]";
    out << "\n";
  }
  return out.str();
}

std::vector<std::pair<std::string, std::string>> FlagSet::values() const {
  std::vector<std::pair<std::string, std::string>> v;
  for (const auto& f : flags_)
    if (f.get) v.emplace_back(f.name, f.get());
  return v;
}

FlagSet::Flag* FlagSet::find(const std::string& name) {
  for (auto& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}

std::string FlagSet::see_help() const {
  return "see " + program_ + (command_.empty() ? "" : " " + command_) + " --help";
}

std::string FlagSet::unknown_message(const std::string& name) const {
  auto edit_distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string msg = "unknown flag '" + name + "' for '" + (command_.empty() ? program_ : command_) + "'";
  size_t best = 4;
  std::string suggestion;
  for (const auto& f : flags_) {
    const size_t d = edit_distance(name, f.name);
    if (d < best) {
      best = d;
      suggestion = f.name;
    }
  }
  if (!suggestion.empty()) msg += " (did you mean " + suggestion + "?)";
  return msg + "; " + see_help();
}

}  // namespace rd
