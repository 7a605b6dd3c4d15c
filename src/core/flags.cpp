#include "resnet_ddp/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <sys/stat.h>

#ifndef RESNET_DDP_NO_YAML
#include <yaml-cpp/yaml.h>
#endif

#include "resnet_ddp/errors.h"

namespace rd {

FlagSet::FlagSet(std::string command, std::string program)
    : command_(std::move(command)), program_(std::move(program)) {}

void FlagSet::add(Flag f, std::function<Typed()> typed) {
  f.typed = std::move(typed);
  flags_.push_back(std::move(f));
}

void FlagSet::text(const std::string& name, std::string* target, const std::string& metavar,
                   const std::string& help) {
  add({name, metavar, help, *target, false, [target](const std::string&, const std::string& v) { *target = v; },
       [target] { return *target; }},
      [target] { return Typed{*target}; });
}

void FlagSet::path(const std::string& name, std::string* target, const std::string& metavar,
                   const std::string& help) {
  add({name, metavar, help, *target, false,
       [target](const std::string& flag, const std::string& v) {
         if (v.empty()) throw UsageError(flag + ": expected a path, got an empty string");
         *target = v;
       },
       [target] { return *target; }},
      [target] { return Typed{*target}; });
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
       }},
      [get] { return Typed{static_cast<int64_t>(get())}; });
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
       [get] { return std::to_string(get()); }},
      [get] { return Typed{get()}; });
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
       }},
      [target] { return Typed{*target}; });
}

void FlagSet::boolean(const std::string& name, bool* target, const std::string& help) {
  add({name, "", help, "", true, [target](const std::string&, const std::string&) { *target = true; },
       [target] { return std::string(*target ? "on" : "off"); }, [target] { *target = false; }},
      [target] { return Typed{*target}; });
}

void FlagSet::negated(const std::string& name, bool* target, const std::string& help) {
  add({name, "", help, "", true, [target](const std::string&, const std::string&) { *target = false; },
       [target] { return std::string(*target ? "on" : "off"); }, [target] { *target = true; }},
      [target] { return Typed{*target}; });
}

void FlagSet::custom(const std::string& name, const std::string& metavar, const std::string& help,
                     std::function<void(const std::string&)> set, std::function<std::string()> get) {
  add({name, metavar, help, get ? get() : "", false, [set](const std::string&, const std::string& v) { set(v); },
       std::move(get)});
}

void FlagSet::alias(const std::string& name, const std::string& target) {
  // A clash is a bug in the flag table, not bad input.
  if (find(name)) throw std::logic_error("FlagSet: alias " + name + " is already a flag name");
  Flag* f = find(target);
  if (!f) throw std::logic_error("FlagSet: alias " + name + " of unknown flag " + target);
  aliases_.emplace_back(name, f->name);
}

void FlagSet::on_set(const std::string& name, std::function<void()> then) {
  Flag* f = find(name);
  if (!f) throw std::logic_error("FlagSet: on_set for unknown flag " + name);
  auto set = f->set;
  f->set = [set, then](const std::string& flag, const std::string& v) {
    set(flag, v);
    then();
  };
  if (auto clear = f->clear)
    f->clear = [clear, then] {
      clear();
      then();
    };
}

void FlagSet::yaml_dialect(YamlDialect dialect) { dialect_ = std::move(dialect); }

void FlagSet::config(const std::string& name, const std::string& help) {
  // Read by parse() itself (it has to come before every other flag).
  add({name, "FILE", help, "", false, [](const std::string&, const std::string&) {}, nullptr});
  config_ = name;
}

void FlagSet::presets(const std::string& name, std::string* chosen, const std::string& help,
                      std::vector<Preset> table) {
  std::string names;
  for (const auto& p : table) names += (names.empty() ? "" : "|") + p.name;
  // Read by parse() itself, like the config flag.
  add({name, names, help, "", false, [](const std::string&, const std::string&) {}, nullptr});
  preset_flag_ = name;
  preset_chosen_ = chosen;
  presets_ = std::move(table);
}

std::vector<std::string> FlagSet::parse(const std::vector<std::string>& args, bool allow_positional,
                                        bool* help_requested, std::vector<std::string>* given,
                                        std::vector<std::string>* applied) {
  // The whole command line is read first (unknown flags, missing values, the config
  // file's name), then the config file is applied, then the command line, so that the
  // command line wins wherever --config stands in it.
  struct Pending {
    Flag* flag;
    std::string typed, value;
    bool off;
  };
  std::vector<Pending> pending;
  std::vector<std::string> positional, rest;
  std::string config_path, preset;
  warnings_.clear();
  typed_.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      *help_requested = true;
      return positional;
    }
    if (a == "--") {
      for (size_t j = i; j < args.size(); ++j) rest.push_back(args[j]);
      for (size_t j = i + 1; j < args.size(); ++j) positional.push_back(args[j]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      positional.push_back(a);
      rest.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    const Resolved r = resolve(name);
    Flag* f = r.flag;
    if (!f) throw UsageError(unknown_message(name));
    const size_t first = i;
    if (f->is_bool) {
      if (has_value) throw UsageError(name + ": takes no value (got '" + value + "')");
    } else if (!has_value) {
      if (i + 1 >= args.size()) throw UsageError(name + ": missing value (" + f->metavar + ")");
      value = args[++i];
    }
    if (f->name == config_ && !config_.empty()) {
      if (!config_path.empty())
        throw UsageError(name + ": given twice ('" + config_path + "' and '" + value + "'); use one file");
      if (value.empty()) throw UsageError(name + ": expected a path, got an empty string");
      config_path = value;
      continue;
    }
    if (f->name == preset_flag_ && !preset_flag_.empty()) {
      preset = value;  // the last one wins, as for any flag (a job script's default, then the user's)
      continue;
    }
    for (size_t j = first; j <= i; ++j) rest.push_back(args[j]);
    pending.push_back({f, name, value, r.off});
    typed_.push_back(f->name);
  }
  if (!allow_positional && !positional.empty())
    throw UsageError("unexpected argument '" + positional.front() + "' for '" +
                     (command_.empty() ? program_ : command_) + "' (flags start with --; " + see_help() + ")");
  if (!preset.empty()) apply_preset(preset, given, applied);
  if (!config_path.empty()) apply_file(config_path, given, applied);
  for (const auto& p : pending) {
    if (p.off) p.flag->clear();
    else p.flag->set(p.typed, p.value);
    if (given) given->push_back(p.flag->name);
  }
  if (applied) applied->insert(applied->end(), rest.begin(), rest.end());
  return positional;
}

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// "value" and 'value' as in a shell, so a path with spaces or a '#' can be written.
std::string unquote(const std::string& s) {
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
    return s.substr(1, s.size() - 2);
  return s;
}

// The config file's text. A cap, so that a wrong file (a dataset archive, /dev/zero)
// fails at once instead of filling memory: a flag file is a few hundred bytes.
std::string read_config_text(const std::string& flag, const std::string& path) {
  constexpr size_t kMaxBytes = 1 << 20;
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError(flag + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw UsageError(flag + " " + path + ": is a directory, expected a file of flags");
  // Not a pipe, FIFO or device either: reading one could wait forever (a FIFO nobody
  // writes, a terminal) or never end (/dev/zero).
  if (!S_ISREG(st.st_mode)) throw UsageError(flag + " " + path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(flag + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxBytes)
      throw UsageError(flag + " " + path + ": larger than 1 MiB; expected a short text file of flags");
  }
  if (in.bad()) throw UsageError(flag + " " + path + ": read error");
  return text;
}

bool is_yaml_path(const std::string& path) {
  for (const std::string e : {".yaml", ".yml", ".YAML", ".YML"})
    if (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) return true;
  return false;
}

// One setting of a flag file's line.
struct ConfigEntry {
  std::string name, value;
  bool has_value = false;
};

// Reads one line of a flag file: `--flag value`, `--flag=value`, `--switch`, `flag =
// value` or a bare `flag`, after a comment (a '#' that starts the line or follows a
// blank, outside quotes). false for a blank line. `line` is left as read: without its
// comment and surrounding blanks.
bool parse_config_line(std::string& line, ConfigEntry& e) {
  if (line.find('\0') != std::string::npos) throw UsageError("not a text file (NUL byte)");
  if (!line.empty() && line.back() == '\r') line.pop_back();  // written on Windows
  char quote = 0;
  for (size_t k = 0; k < line.size(); ++k) {
    const char c = line[k];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (k == 0 || line[k - 1] == ' ' || line[k - 1] == '\t')) {
      line.resize(k);
      break;
    }
  }
  line = trim(line);
  if (line.empty()) return false;
  if (line[0] == '-') {  // --flag value, --flag=value, --switch
    const size_t blank = line.find_first_of(" \t");
    const std::string word = line.substr(0, blank);
    if (const size_t eq = word.find('='); eq != std::string::npos) {
      e.name = word.substr(0, eq);
      e.value = line.substr(eq + 1);
      e.has_value = true;
    } else {
      e.name = word;
      if (blank != std::string::npos) {
        e.value = trim(line.substr(blank));
        // "--lr = 0.1": the two formats mixed, read as meant.
        if (e.value[0] == '=') e.value = trim(e.value.substr(1));
        e.has_value = true;
      }
    }
  } else {  // flag = value, or a bare switch
    const size_t eq = line.find('=');
    std::string key = trim(line.substr(0, eq));
    if (key.empty() || key.find_first_of(" \t") != std::string::npos)
      throw UsageError("expected '--flag value' or 'flag = value', got '" + line + "'");
    // timm's args.yaml and Python spell flags with underscores.
    std::replace(key.begin(), key.end(), '_', '-');
    e.name = (key.size() == 1 ? "-" : "--") + key;  // "b = 32" is -b
    if (eq != std::string::npos) {
      e.value = trim(line.substr(eq + 1));
      e.has_value = true;
    }
  }
  e.value = unquote(e.value);
  return true;
}

}  // namespace

void FlagSet::apply_file(const std::string& path, std::vector<std::string>* given,
                         std::vector<std::string>* applied) {
  const std::string& flag = config_;
  const std::string text = read_config_text(flag, path);
  if (is_yaml_path(path)) {
    if (text.find('\0') != std::string::npos) throw UsageError(flag + " " + path + ": not a text file (NUL byte)");
    apply_yaml(path, text, given, applied);
    return;
  }
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    try {
      ConfigEntry e;
      if (parse_config_line(line, e)) apply_entry(e.name, e.value, e.has_value, given, applied);
    } catch (const UsageError& err) {
      // "key: value" (without its comment) is how YAML looks.
      throw UsageError(path + ":" + std::to_string(line_no) + ": " + err.what() +
                       (line.find(": ") != std::string::npos && line[0] != '-'
                            ? " (a YAML file needs the extension .yaml or .yml)"
                            : ""));
    }
  }
}

void FlagSet::apply_preset(const std::string& preset, std::vector<std::string>* given,
                           std::vector<std::string>* applied) {
  const Preset* chosen = nullptr;
  std::string names;
  for (const auto& p : presets_) {
    if (p.name == preset) chosen = &p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  if (!chosen) throw UsageError(preset_flag_ + ": unknown '" + preset + "' (known: " + names + ")");
  if (preset_chosen_) *preset_chosen_ = preset;
  for (std::string line : chosen->lines) {
    ConfigEntry e;
    try {
      if (parse_config_line(line, e)) apply_entry(e.name, e.value, e.has_value, given, applied);
    } catch (const UsageError& err) {
      // A preset is the program's own table: a bad line is a bug, said as such.
      throw UsageError(preset_flag_ + " " + preset + ": line '" + line + "': " + err.what() + " (a bug in the table)");
    }
  }
}

void FlagSet::apply_entry(const std::string& name, const std::string& value, bool has_value,
                          std::vector<std::string>* given, std::vector<std::string>* applied) {
  if (name == "--help" || name == "-h") throw UsageError(name + ": not valid in a config file");
  const Resolved r = resolve(name);
  Flag* f = r.flag;
  if (!f) throw UsageError(unknown_message(name));
  if (f->name == config_) throw UsageError(name + ": a config file cannot read another one");
  // One order for everyone: preset, then file, then command line.
  if (!preset_flag_.empty() && f->name == preset_flag_)
    throw UsageError(name + ": give it on the command line, not in a config file or a preset");
  if (f->is_bool) {
    const bool yes = !has_value || value == "true" || value == "yes" || value == "on" || value == "1";
    if (!yes && value != "false" && value != "no" && value != "off" && value != "0")
      throw UsageError(name + ": a switch: expected true or false (or the bare name for true), got '" + value + "'");
    // `no-x = false` is x turned on.
    if (yes != r.off) {
      f->set(name, "");
      if (applied) applied->push_back(f->name);
    } else {
      f->clear();
      if (applied) applied->push_back(off_spelling(*f));
    }
  } else {
    if (!has_value) throw UsageError(name + ": missing value (" + f->metavar + ")");
    f->set(name, value);
    if (applied) {
      applied->push_back(f->name);
      applied->push_back(value);
    }
  }
  if (given) given->push_back(f->name);
}

#ifndef RESNET_DDP_NO_YAML
namespace {

// A YAML mapping's keys as read, in file order; a key that is not a name is an error.
std::vector<FlagSet::ConfigKey> yaml_keys(const YAML::Node& root, std::vector<std::pair<int, std::string>>& errors) {
  using Kind = FlagSet::ConfigKey::Kind;
  std::vector<FlagSet::ConfigKey> keys;
  for (const auto& kv : root) {
    const int line = kv.first.Mark().line + 1;
    if (!kv.first.IsScalar()) {
      errors.emplace_back(line, "expected a flag name as the key");
      continue;
    }
    FlagSet::ConfigKey k;
    k.key = kv.first.Scalar();
    k.line = line;
    const YAML::Node& v = kv.second;
    if (v.IsNull()) {
      k.kind = Kind::Null;
    } else if (v.IsScalar()) {
      k.value = v.Scalar();
    } else if (v.IsSequence()) {
      k.kind = Kind::List;
      for (const auto& item : v) k.value += (k.value.empty() ? "" : ",") + (item.IsScalar() ? item.Scalar() : "?");
    } else {
      k.kind = Kind::Map;
      k.value = v.size() == 0 ? "" : "{...}";
    }
    keys.push_back(std::move(k));
  }
  return keys;
}

}  // namespace
#endif

#ifdef RESNET_DDP_NO_YAML
// Built without yaml-cpp: a cluster without it (RESNET_DDP_YAML, CMakeLists.txt), or the
// standalone GPU check (tools/gpu_check.sh), which reads no config.
void FlagSet::apply_yaml(const std::string& path, const std::string&, std::vector<std::string>*,
                         std::vector<std::string>*) {
  throw UsageError(path +
                   ": a YAML config, and this build of resnet_ddp has no YAML support: rebuild with yaml-cpp "
                   "found (docs/hpc.md), or write the file as `flag = value` lines");
}
#else
void FlagSet::apply_yaml(const std::string& path, const std::string& text, std::vector<std::string>* given,
                         std::vector<std::string>* applied) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw UsageError(path + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (root.IsNull()) return;  // an empty file sets nothing
  if (!root.IsMap())
    throw UsageError(path + ": expected a YAML mapping of flags ('batch_size: 32', as timm's args.yaml)");
  // Every problem of the file is reported at once (timm's args.yaml has ~180 keys: one
  // run per problem would be a long way to a working file).
  std::vector<std::pair<int, std::string>> errors;
  std::vector<ConfigKey> keys = yaml_keys(root, errors);
  ConfigTranslation dialect;
  if (dialect_) dialect_(keys, dialect);
  for (const auto& r : dialect.refused)
    if (r.moot_with.empty() || std::find(typed_.begin(), typed_.end(), r.moot_with) == typed_.end())
      errors.emplace_back(r.line, r.message);
  std::vector<std::string> unknown_nulls;
  for (const auto& k : keys) {
    try {
      // Python spells flags with underscores; a key may also be written --flag.
      std::string key = k.key;
      while (!key.empty() && key[0] == '-') key.erase(0, 1);
      std::replace(key.begin(), key.end(), '_', '-');
      const std::string name = (key.size() == 1 ? "-" : "--") + key;
      const bool empty = k.kind == ConfigKey::Kind::Null || (k.kind == ConfigKey::Kind::Map && k.value.empty());
      if (!resolve(name).flag) {
        // `key: null` says "not set": nothing is lost by leaving it out, but it is said.
        if (empty) {
          unknown_nulls.push_back(k.key);
          continue;
        }
        throw UsageError(unknown_message(name));
      }
      if (k.kind == ConfigKey::Kind::Null) continue;  // `key: null` (timm's "not set"): the default stays
      if (k.kind != ConfigKey::Kind::Scalar)
        throw UsageError(name + ": expected one value, got a " + (k.kind == ConfigKey::Kind::List ? "list" : "mapping"));
      apply_entry(name, k.value, true, given, applied);
    } catch (const UsageError& e) {
      errors.emplace_back(k.line, e.what());
    }
  }
  if (!errors.empty()) {
    std::stable_sort(errors.begin(), errors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string msg;
    for (const auto& [line, what] : errors)
      msg += (msg.empty() ? "" : "\n") + path + ":" + std::to_string(line) + ": " + what;
    if (errors.size() > 1) msg += "\n" + path + ": " + std::to_string(errors.size()) + " problems, listed above";
    throw UsageError(msg);
  }
  const auto listed = [](const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
  };
  if (!dialect.ignored.empty())
    warnings_.push_back(path + ": ignored, as they do not change training here: " + listed(dialect.ignored));
  if (!unknown_nulls.empty())
    warnings_.push_back(path + ": ignored, unknown and null: " + listed(unknown_nulls));
}
#endif

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
    std::string lhs = "  " + f.name;
    for (const auto& a : aliases_of(f.name)) lhs += ", " + a;
    lhs += f.is_bool ? "" : " " + f.metavar;
    out << lhs;
    if (lhs.size() < 30) out << std::string(30 - lhs.size(), ' ');
    else out << "\n" << std::string(30, ' ');
    out << f.help;
    if (!f.is_bool && !f.default_value.empty()) out << " [default: " << f.default_value << "]";
    out << "\n";
  }
  if (std::any_of(flags_.begin(), flags_.end(), [](const Flag& f) { return f.is_bool && f.name.rfind("--no-", 0) != 0; }))
    out << "  --no-SWITCH                 turns a switch above off"
        << (preset_flag_.empty() && config_.empty() ? "" : " (also one a --recipe or --config turned on)") << "\n";
  return out.str();
}

std::vector<FlagSet::Value> FlagSet::values() const {
  std::vector<Value> v;
  for (const auto& f : flags_)
    if (f.get) {
      std::string text = f.get();
      Typed typed = f.typed ? f.typed() : Typed{text};
      v.push_back({f.name, std::move(text), std::move(typed)});
    }
  return v;
}

FlagSet::Resolved FlagSet::resolve(const std::string& name) {
  if (Flag* f = find(name)) return {f, false};
  // --no-SWITCH for every switch that is not itself a negation (--no-no-sync-bn).
  if (name.rfind("--no-", 0) == 0 && name.size() > 5) {
    Flag* f = find("--" + name.substr(5));
    if (f && f->is_bool && f->clear && f->name.rfind("--no-", 0) != 0) return {f, true};
  }
  return {};
}

std::string FlagSet::off_spelling(const Flag& f) {
  // A negation's own opposite where it has one (--no-sync-bn: --sync-bn).
  if (f.name.rfind("--no-", 0) == 0) {
    const Flag* on = find("--" + f.name.substr(5));
    if (on && on->is_bool) return on->name;
  }
  return "--no-" + f.name.substr(2);
}

FlagSet::Flag* FlagSet::find(const std::string& name) {
  std::string main = name;
  for (const auto& [alias, flag] : aliases_)
    if (alias == name) main = flag;
  for (auto& f : flags_)
    if (f.name == main) return &f;
  return nullptr;
}

std::vector<std::string> FlagSet::aliases_of(const std::string& name) const {
  std::vector<std::string> v;
  for (const auto& [alias, flag] : aliases_)
    if (flag == name) v.push_back(alias);
  return v;
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
  // --no-NAME of a flag that takes a value: say why there is no such form.
  if (name.rfind("--no-", 0) == 0 && name.size() > 5) {
    std::string target = "--" + name.substr(5);
    for (const auto& [alias, flag] : aliases_)
      if (alias == target) target = flag;
    for (const auto& f : flags_)
      if (f.name == target && !f.is_bool)
        return msg + ": --" + name.substr(5) + " takes a value: it has no --no- form (only switches do); " + see_help();
  }
  // The nearest spelling among names and aliases, reported as the flag it stands for.
  // No guess for very short names: "-c" is as near to "-b" as to anything.
  const size_t typed = name.size() - std::min(name.find_first_not_of('-'), name.size());
  const Flag* match = nullptr;
  std::string near;
  // A shortened name ("--batch") is a prefix of the one it stands for: nearer than
  // any spelling a few edits away ("--arch"). Ambiguous prefixes give no guess here.
  if (typed >= 3) {
    size_t hits = 0;
    for (const auto& f : flags_)
      if (f.name.rfind(name, 0) == 0) {
        ++hits;
        match = &f;
        near = f.name;
      }
    if (hits != 1) match = nullptr;
  }
  if (!match) {
    size_t best = 4;
    for (const auto& f : flags_) {
      std::vector<std::string> spellings{f.name};
      for (const auto& a : aliases_of(f.name)) spellings.push_back(a);
      for (const auto& s : spellings) {
        const size_t d = edit_distance(name, s);
        if (d < best && 2 * d <= typed) {
          best = d;
          match = &f;
          near = s;
        }
      }
    }
  }
  if (match) {
    msg += " (did you mean " + match->name;
    if (near != match->name) msg += ", also spelled " + near;
    msg += "?)";
  }
  return msg + "; " + see_help();
}

}  // namespace rd
