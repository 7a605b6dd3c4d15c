// The one command-line parser of every program (resnet_ddp, message_passing, the
// benchmarks, the parity driver): a declarative table where each flag knows its
// target, how to parse and check a value, and how to describe itself in --help.
// Values arrive typed (numbers, enumerations), never as strings for the caller to
// compare. Every error is an rd::UsageError whose message names the flag.
//
// Other spellings of a flag (alias) are accepted wherever the flag is, listed next to
// it in --help, and count as the flag itself for `given`. An optional config flag
// (config) reads more flags from a file, applied before the command line so that the
// command line wins. A flag given twice, in any spelling, keeps the last value (as
// argparse does). Every switch can also be turned off, as CLI11 and argparse's
// BooleanOptionalAction allow: `--no-SWITCH` on the command line, `no-switch` or
// `switch = false` in a config file, `switch: false` in YAML; it counts as the switch
// given (a recipe's switch turned off is a setting the user chose).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace rd {

class FlagSet {
 public:
  // Messages name the command ("unknown flag '--x' for 'train'; see resnet_ddp train
  // --help"); a program without subcommands passes its own name as `program` and an
  // empty `command`.
  explicit FlagSet(std::string command, std::string program = "resnet_ddp");

  void text(const std::string& name, std::string* target, const std::string& metavar, const std::string& help);
  void path(const std::string& name, std::string* target, const std::string& metavar, const std::string& help);
  void choice(const std::string& name, std::string* target, std::vector<std::string> choices,
              const std::string& help);
  // One of `names`, stored as its value: --precision bf16 -> Precision::BF16.
  template <class E>
  void enumeration(const std::string& name, E* target, std::vector<std::pair<std::string, E>> names,
                   const std::string& help) {
    std::vector<std::string> words;
    for (const auto& n : names) words.push_back(n.first);
    add_choice(
        name, words, help, [target, names](size_t i) { *target = names[i].second; },
        [target, names] {
          for (size_t i = 0; i < names.size(); ++i)
            if (names[i].second == *target) return i;
          return size_t{0};
        });
  }
  template <class Int>
  void integer(const std::string& name, Int* target, int64_t min, const std::string& help,
               int64_t max = std::numeric_limits<int32_t>::max()) {
    add_integer(name, help, min, max, [target](int64_t v) { *target = static_cast<Int>(v); },
                [target] { return static_cast<int64_t>(*target); });
  }
  // Real number with min (inclusive unless min_exclusive) and optional max.
  void real(const std::string& name, double* target, double min, bool min_exclusive, const std::string& help,
            double max = std::numeric_limits<double>::infinity());
  // A switch: naming it turns it on; --no-NAME (generated) turns it off.
  void boolean(const std::string& name, bool* target, const std::string& help);
  // A flag that switches a default-on option off (listed in --help as such).
  void negated(const std::string& name, bool* target, const std::string& help);
  // Any other value: `set` parses it (throwing UsageError naming the flag) and may be
  // called once per occurrence (repeatable flags). `get`, when given, spells the current
  // value (the --help default, values()).
  void custom(const std::string& name, const std::string& metavar, const std::string& help,
              std::function<void(const std::string& value)> set, std::function<std::string()> get = nullptr);
  // Another name for the flag `target` (registered before): "-b" for "--batch-size".
  void alias(const std::string& name, const std::string& target);
  // Also runs `then` each time flag `name` is set (after its value is stored): lets a
  // flag undo what another one chose earlier, so the later of the two wins.
  void on_set(const std::string& name, std::function<void()> then);
  // `name` FILE reads flags from FILE, one per line: `--flag value`, `--flag=value`,
  // `flag = value` (also `flag_name`), a bare `flag` for a switch (or `flag = true`);
  // blank lines and `#` comments are skipped. The file's flags are applied before the
  // command line's, wherever `name` appears in it. Errors name the file and the line.
  void config(const std::string& name, const std::string& help);
  // `name` PRESET applies a named list of flags (config-file syntax, one per line) before
  // the config file and the command line, so that every flag given wins over the preset
  // (--recipe: a published training recipe). An unknown name lists the known ones.
  struct Preset {
    std::string name, summary;
    std::vector<std::string> lines;
  };
  // The chosen preset's name goes to `chosen` ("" when none).
  void presets(const std::string& name, std::string* chosen, const std::string& help, std::vector<Preset> table);

  // One key of a YAML config file as read, for a dialect (timm's args.yaml).
  struct ConfigKey {
    std::string key;  // as written; a dialect rewrites it to a flag spelling ("--lr")
    int line = 0;     // 1-based
    enum class Kind { Null, Scalar, List, Map } kind = Kind::Scalar;
    std::string value;  // a scalar's text; a list's items joined by ','; "" for an empty mapping
  };
  // What a dialect did with a file's keys: the keys left out because they do not change
  // the run here, and the ones it cannot honour, each with the flag that would make it
  // moot when given on the command line ("" when none).
  struct ConfigRefusal {
    int line;
    std::string message, moot_with;
  };
  struct ConfigTranslation {
    std::vector<std::string> ignored;
    std::vector<ConfigRefusal> refused;
  };
  // A YAML dialect rewrites `keys` in place into flag settings, moving the keys it reads
  // as not changing the run to `ignored` and the ones it cannot honour to `refused`.
  // Keys it leaves alone are read as flag names, as in any YAML config.
  using YamlDialect = std::function<void(std::vector<ConfigKey>& keys, ConfigTranslation& out)>;
  void yaml_dialect(YamlDialect dialect);
  // Warnings of the last parse() (a config file's ignored keys), for the caller to print.
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Parses args; positional arguments are returned (an error when !allow_positional).
  // `given` collects the flags set (their main names, aliases resolved; a config file's
  // too), for "did the user set this". `applied` receives the arguments as applied: the
  // config file's flags as words (`--flag`, `value`), then `args` without the config
  // flag, so that a recorded command line does not depend on the file.
  std::vector<std::string> parse(const std::vector<std::string>& args, bool allow_positional, bool* help_requested,
                                 std::vector<std::string>* given = nullptr,
                                 std::vector<std::string>* applied = nullptr);
  // For a program's main: parses argv[1..]; on --help prints `usage` and the flag table
  // and exits 0.
  std::vector<std::string> parse_or_help(int argc, char** argv, const std::string& usage,
                                         bool allow_positional = false);

  std::string help() const;
  // A flag's value typed as its target holds it (an enumeration's or choice's index, an
  // integer, a real, a switch, a text); a custom flag's is its text.
  using Typed = std::variant<bool, int64_t, double, std::string>;
  struct Value {
    std::string name, text;  // text: as --help spells it
    Typed typed;             // for comparing two sets of options
  };
  // Every flag with its current value, in --help order.
  std::vector<Value> values() const;

 private:
  struct Flag {
    std::string name, metavar, help, default_value;
    bool is_bool = false;
    std::function<void(const std::string&, const std::string&)> set;
    std::function<std::string()> get;
    std::function<void()> clear = nullptr;  // a switch turned off (--no-NAME)
    std::function<Typed()> typed = nullptr;  // nullptr: the text from `get`
  };
  // A spelling resolved to its flag; `off`: a switch's --no- form.
  struct Resolved {
    Flag* flag = nullptr;
    bool off = false;
  };
  Resolved resolve(const std::string& name);
  // How the recorded command line spells switch `f` turned off.
  std::string off_spelling(const Flag& f);
  void add(Flag f, std::function<Typed()> typed = nullptr);
  void add_choice(const std::string& name, const std::vector<std::string>& words, const std::string& help,
                  std::function<void(size_t)> set, std::function<size_t()> get);
  void add_integer(const std::string& name, const std::string& help, int64_t min, int64_t max,
                   std::function<void(int64_t)> set, std::function<int64_t()> get);
  Flag* find(const std::string& name);
  // Applies the config file's lines (see config()).
  void apply_file(const std::string& path, std::vector<std::string>* given, std::vector<std::string>* applied);
  // A .yaml/.yml config file: one mapping of flag names (timm's args.yaml).
  void apply_yaml(const std::string& path, const std::string& text, std::vector<std::string>* given,
                  std::vector<std::string>* applied);
  // One setting from a config file: `name` as a flag spelling, a switch's value empty
  // or true/yes/on/1.
  void apply_entry(const std::string& name, const std::string& value, bool has_value, std::vector<std::string>* given,
                   std::vector<std::string>* applied);
  // The flags the command line sets (main names), so that a config key they override is
  // not refused.
  std::vector<std::string> typed_;
  YamlDialect dialect_;
  std::vector<std::string> warnings_;
  std::string unknown_message(const std::string& name) const;
  std::string see_help() const;

  std::vector<std::string> aliases_of(const std::string& name) const;

  std::string command_, program_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> aliases_;  // (alias, flag name)
  std::string config_;                                       // the config flag's name, "" when none
  std::string preset_flag_;                                  // the presets flag's name, "" when none
  std::vector<Preset> presets_;
  std::string* preset_chosen_ = nullptr;
  // Applies one preset's lines (see presets()).
  void apply_preset(const std::string& preset, std::vector<std::string>* given, std::vector<std::string>* applied);
};

}  // namespace rd
