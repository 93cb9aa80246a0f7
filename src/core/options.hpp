// Typed option tables: one schema per config struct drives parsing of key=value strings
// (CLI and C++ API), defaults, help text, YAML/JSON dumps and close-match suggestions for
// unknown keys. The CLI is a thin layer over this.
#pragma once
#include <functional>
#include <libreyolo/errors.hpp>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo {

// Keyword arguments as the user wrote them: {"epochs", "10"}, {"amp", "false"}. Order kept.
using Kwargs = std::vector<std::pair<std::string, std::string>>;

enum class OptionType { Int, Float, Bool, String };
const char* option_type_name(OptionType t);

// Parses "true/false/1/0/yes/no/on/off" (any case); throws UsageError naming `key` otherwise.
bool parse_bool(const std::string& key, const std::string& value);
long long parse_int(const std::string& key, const std::string& value);
// parse_int, then a UsageError (config_range_error) naming `key` and [lo, hi] when the value lies
// outside: "epochs=4294967297" must not wrap to 1 in a 32-bit field.
long long parse_int_in_range(const std::string& key, const std::string& value, long long lo, long long hi);
// Finite numbers only: nan, inf and overflowing values are a UsageError naming `key`.
double parse_float(const std::string& key, const std::string& value);

// The closest candidate by edit similarity (difflib-like ratio >= 0.6), or "".
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

template <class Config>
class OptionSchema {
 public:
  struct Field {
    std::string name;
    OptionType type;
    std::string help;
    std::function<void(Config&, const std::string&)> set;
    std::function<std::string(const Config&)> get;
  };

  template <class T>
  OptionSchema& add(const std::string& name, T Config::*member, const std::string& help);
  // An alternative spelling that sets the same field (e.g. mosaic -> mosaic_prob).
  OptionSchema& alias(const std::string& alias_name, const std::string& field_name) {
    aliases_[alias_name] = field_name;
    return *this;
  }

  const std::vector<Field>& fields() const { return fields_; }
  const Field* find(const std::string& key) const {
    std::string k = normalise(key);
    auto a = aliases_.find(k);
    if (a != aliases_.end()) k = a->second;
    for (const auto& f : fields_)
      if (f.name == k) return &f;
    return nullptr;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& f : fields_) out.push_back(f.name);
    for (const auto& a : aliases_) out.push_back(a.first);
    return out;
  }
  // Applies every key=value; an unknown key throws UsageError (code config_unknown_key) with a
  // close-match suggestion; a bad value throws UsageError (config_type_error).
  void apply(Config& cfg, const Kwargs& kwargs, const std::string& command) const;
  // name -> current value as text, in schema order.
  std::vector<std::pair<std::string, std::string>> dump(const Config& cfg) const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& f : fields_) out.emplace_back(f.name, f.get(cfg));
    return out;
  }

  static std::string normalise(const std::string& key) {
    std::string k = key;
    while (!k.empty() && k[0] == '-') k.erase(0, 1);
    for (auto& c : k)
      if (c == '-') c = '_';
    return k;
  }

 private:
  std::vector<Field> fields_;
  std::map<std::string, std::string> aliases_;
};

std::string format_option_value(double v);
[[noreturn]] void throw_unknown_key(const std::string& key, const std::vector<std::string>& names,
                                    const std::string& command);

template <class Config>
template <class T>
OptionSchema<Config>& OptionSchema<Config>::add(const std::string& name, T Config::*member,
                                                const std::string& help) {
  Field f;
  f.name = name;
  f.help = help;
  if constexpr (std::is_same_v<T, bool>) {
    f.type = OptionType::Bool;
    f.set = [member, name](Config& c, const std::string& v) { c.*member = parse_bool(name, v); };
    f.get = [member](const Config& c) { return std::string(c.*member ? "true" : "false"); };
  } else if constexpr (std::is_integral_v<T>) {
    f.type = OptionType::Int;
    f.set = [member, name](Config& c, const std::string& v) {
      c.*member = static_cast<T>(parse_int_in_range(name, v, std::numeric_limits<T>::min(),
                                                    std::numeric_limits<T>::max()));
    };
    f.get = [member](const Config& c) { return std::to_string(c.*member); };
  } else if constexpr (std::is_floating_point_v<T>) {
    f.type = OptionType::Float;
    f.set = [member, name](Config& c, const std::string& v) { c.*member = parse_float(name, v); };
    f.get = [member](const Config& c) { return format_option_value(c.*member); };
  } else {
    static_assert(std::is_same_v<T, std::string>, "option fields are bool, integer, float or string");
    f.type = OptionType::String;
    f.set = [member](Config& c, const std::string& v) { c.*member = v; };
    f.get = [member](const Config& c) { return c.*member; };
  }
  fields_.push_back(std::move(f));
  return *this;
}

template <class Config>
void OptionSchema<Config>::apply(Config& cfg, const Kwargs& kwargs, const std::string& command) const {
  // One list sets each option once: two spellings of it (mosaic= and mosaic_prob=) or a key
  // given twice with different values are a conflict, not "the last one wins".
  std::map<std::string, std::pair<std::string, std::string>> given;  // field -> (key, value)
  for (const auto& [key, value] : kwargs) {
    const Field* f = find(key);
    if (!f) throw_unknown_key(normalise(key), names(), command);
    const auto [it, fresh] = given.emplace(f->name, std::make_pair(key, value));
    if (!fresh && it->second.second != value)
      throw UsageError("'" + it->second.first + "=" + it->second.second + "' and '" + key + "=" + value +
                           "' both set " + f->name,
                       "Give it once.", "config_conflict");
    f->set(cfg, value);
  }
}

}  // namespace libreyolo
