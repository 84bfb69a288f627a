// Typed configuration from TOML (see config.h). All parsing of config files and `--set`
// overrides happens here, so every message about a bad config has the same shape:
//   FILE:LINE: [section] key: expected WHAT, got VALUE
#include "base/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

namespace pipeline::config {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::integer: return "an integer";
    case ValueType::floating: return "a number";
    case ValueType::boolean: return "a boolean (true or false)";
    case ValueType::string: return "a string";
    case ValueType::string_list: return "a string or a list of strings";
  }
  return "?";
}

std::string value_to_string(const Value& v) {
  struct Visitor {
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      std::ostringstream os;
      os << std::setprecision(10) << d;
      return os.str();
    }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const std::string& s) const { return "\"" + s + "\""; }
    std::string operator()(const std::vector<std::string>& l) const {
      std::string out = "[";
      for (size_t i = 0; i < l.size(); ++i) out += (i ? ", \"" : "\"") + l[i] + "\"";
      return out + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

std::string Location::str() const {
  if (line > 0) return source + ":" + std::to_string(line);
  if (!arg.empty()) return source + " " + arg;
  return source;
}

// ---------------------------------------------------------------------------------------------
// Schema

Schema& Schema::integer(std::string key, std::optional<int64_t> def, std::string doc, std::optional<double> min,
                        std::optional<double> max) {
  OptionSpec s{std::move(key), ValueType::integer, {}, min, max, {}, std::move(doc)};
  if (def) s.default_value = Value{*def};
  options_.push_back(std::move(s));
  return *this;
}

Schema& Schema::integer_or_auto(std::string key, Value def, std::string doc, std::optional<double> min,
                               std::optional<double> max) {
  OptionSpec s{std::move(key), ValueType::integer, std::move(def), min, max, {}, std::move(doc)};
  s.allow_auto = true;
  options_.push_back(std::move(s));
  return *this;
}

Schema& Schema::floating(std::string key, std::optional<double> def, std::string doc, std::optional<double> min,
                         std::optional<double> max) {
  OptionSpec s{std::move(key), ValueType::floating, {}, min, max, {}, std::move(doc)};
  if (def) s.default_value = Value{*def};
  options_.push_back(std::move(s));
  return *this;
}

Schema& Schema::boolean(std::string key, std::optional<bool> def, std::string doc) {
  OptionSpec s{std::move(key), ValueType::boolean, {}, {}, {}, {}, std::move(doc)};
  if (def) s.default_value = Value{*def};
  options_.push_back(std::move(s));
  return *this;
}

Schema& Schema::string(std::string key, std::optional<std::string> def, std::string doc,
                       std::vector<std::string> choices) {
  OptionSpec s{std::move(key), ValueType::string, {}, {}, {}, std::move(choices), std::move(doc)};
  if (def) s.default_value = Value{*def};
  options_.push_back(std::move(s));
  return *this;
}

Schema& Schema::string_list(std::string key, std::optional<std::vector<std::string>> def, std::string doc) {
  OptionSpec s{std::move(key), ValueType::string_list, {}, {}, {}, {}, std::move(doc)};
  if (def) s.default_value = Value{*def};
  options_.push_back(std::move(s));
  return *this;
}

Schema& Schema::extend(const Schema& other) {
  for (const auto& o : other.options_) {
    auto it = std::find_if(options_.begin(), options_.end(), [&](const OptionSpec& s) { return s.key == o.key; });
    if (it != options_.end())
      *it = o;  // the more specific schema (the stage type's) wins over the common one
    else
      options_.push_back(o);
  }
  return *this;
}

const OptionSpec* Schema::find(const std::string& key) const {
  for (const auto& o : options_)
    if (o.key == key) return &o;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Section

const std::pair<Value, Location>& Section::at(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end())
    throw ConfigError(file_ + ": [" + name_ + "] " + key + ": no such key in this section (a bug: it is not in the schema)");
  return it->second;
}

int64_t Section::get_int(const std::string& key) const {
  const auto& v = at(key).first;
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  throw error(key, "is not an integer");
}

std::optional<int64_t> Section::get_int_or_auto(const std::string& key) const {
  const auto& v = at(key).first;
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  if (auto p = std::get_if<std::string>(&v); p && *p == "auto") return std::nullopt;
  throw error(key, "is not an integer or \"auto\"");
}

double Section::get_float(const std::string& key) const {
  const auto& v = at(key).first;
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
  throw error(key, "is not a number");
}

bool Section::get_bool(const std::string& key) const {
  const auto& v = at(key).first;
  if (auto p = std::get_if<bool>(&v)) return *p;
  throw error(key, "is not a boolean");
}

const std::string& Section::get_string(const std::string& key) const {
  const auto& v = at(key).first;
  if (auto p = std::get_if<std::string>(&v)) return *p;
  throw error(key, "is not a string");
}

const std::vector<std::string>& Section::get_string_list(const std::string& key) const {
  const auto& v = at(key).first;
  if (auto p = std::get_if<std::vector<std::string>>(&v)) return *p;
  throw error(key, "is not a list of strings");
}

bool Section::was_set(const std::string& key) const {
  auto it = values_.find(key);
  return it != values_.end() && it->second.second.source != "default";
}

Location Section::where(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? Location{file_, 0} : it->second.second;
}

ConfigError Section::error(const std::string& key, const std::string& message) const {
  Location loc = where(key);
  std::string origin = loc.source == "default" ? file_ : loc.str();
  return ConfigError(origin + ": [" + name_ + "] " + key + ": " + message);
}

void Section::set(const std::string& key, Value v, Location loc) {
  if (!values_.count(key)) order_.push_back(key);
  values_[key] = {std::move(v), std::move(loc)};
}

// ---------------------------------------------------------------------------------------------
// Document

namespace {

struct Override {
  std::string section;  // dotted
  std::string key;
  std::string text;     // the raw value text after '='
  std::string arg;      // the whole argument, for messages
};

std::vector<std::string> split_dotted(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

// `path` is the part before '='; the caller has handled `--set TABLE=` (a removal).
Override parse_override(const std::string& arg, const std::string& path) {
  const auto eq = path.size();
  auto dot = path.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == path.size())
    throw ConfigError("--set " + arg + ": expected section.key=value (the key needs its section, e.g. model.n_layer=4)");
  return Override{path.substr(0, dot), path.substr(dot + 1), arg.substr(eq + 1), arg};
}

// A TOML basic string holding s: quotes, backslashes and control characters escaped.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

int line_of(const toml::node& n) { return static_cast<int>(n.source().begin.line); }

std::string describe_node(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "the string \"" + std::string(*n.value<std::string>()) + "\"";
    case toml::node_type::integer: return "the integer " + std::to_string(*n.value<int64_t>());
    case toml::node_type::floating_point: {
      std::ostringstream os;
      os << "the number " << *n.value<double>();
      return os.str();
    }
    case toml::node_type::boolean: return *n.value<bool>() ? "true" : "false";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

std::string expected_type(const OptionSpec& spec) {
  if (spec.allow_auto) return "an integer or \"auto\"";
  return value_type_name(spec.type);
}

// The value in the option's type (see check_value), or why not; `got` describes the value.
std::optional<Value> coerce(const OptionSpec& spec, const Value& v, const std::string& got, std::string& why) {
  switch (spec.type) {
    case ValueType::integer:
      if (std::holds_alternative<int64_t>(v)) return v;
      if (auto p = std::get_if<std::string>(&v); p && spec.allow_auto && *p == "auto") return v;
      break;
    case ValueType::floating:
      if (std::holds_alternative<double>(v)) return v;
      if (auto p = std::get_if<int64_t>(&v)) return Value{static_cast<double>(*p)};
      break;
    case ValueType::boolean:
      if (std::holds_alternative<bool>(v)) return v;
      break;
    case ValueType::string:
      if (std::holds_alternative<std::string>(v)) return v;
      break;
    case ValueType::string_list:
      if (auto p = std::get_if<std::string>(&v)) return Value{std::vector<std::string>{*p}};
      if (std::holds_alternative<std::vector<std::string>>(v)) return v;
      break;
  }
  why = "expected " + expected_type(spec) + ", got " + got;
  return std::nullopt;
}

std::optional<Value> raw_value(const toml::node& n);

// Converts a TOML node to the schema's type, or returns an explanation of what was wrong.
std::optional<Value> convert(const toml::node& n, const OptionSpec& spec, std::string& why) {
  auto raw = raw_value(n);
  if (!raw) {
    if (auto arr = n.as_array(); arr && spec.type == ValueType::string_list) {
      for (const auto& e : *arr)
        if (!e.value_exact<std::string>()) {
          why = "expected a list of strings, but an element is " + describe_node(e);
          return std::nullopt;
        }
    }
    why = "expected " + expected_type(spec) + ", got " + describe_node(n);
    return std::nullopt;
  }
  return coerce(spec, *raw, describe_node(n), why);
}

std::string check_range(const Value& v, const OptionSpec& spec) {
  double x = 0;
  if (auto p = std::get_if<int64_t>(&v))
    x = static_cast<double>(*p);
  else if (auto p = std::get_if<double>(&v))
    x = *p;
  else if (auto p = std::get_if<std::string>(&v)) {
    if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(), *p) == spec.choices.end()) {
      std::string list;
      for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + c;
      return "expected one of " + list + ", got \"" + *p + "\"";
    }
    return {};
  } else {
    return {};
  }
  if (!std::isfinite(x)) return "expected a finite number, got " + value_to_string(v);
  auto fmt = [](double d) {
    std::ostringstream os;
    os << d;
    return os.str();
  };
  if (spec.min && spec.max && (x < *spec.min || x > *spec.max))
    return "expected a value in [" + fmt(*spec.min) + ", " + fmt(*spec.max) + "], got " + value_to_string(v);
  if (spec.min && x < *spec.min) return "expected a value >= " + fmt(*spec.min) + ", got " + value_to_string(v);
  if (spec.max && x > *spec.max) return "expected a value <= " + fmt(*spec.max) + ", got " + value_to_string(v);
  return {};
}

}  // namespace

std::optional<Value> check_value(const OptionSpec& spec, const Value& v, std::string& why) {
  auto out = coerce(spec, v, value_to_string(v), why);
  if (!out) return out;
  why = check_range(*out, spec);
  if (!why.empty()) return std::nullopt;
  return out;
}

namespace {

std::string known_keys(const Schema& schema) {
  std::string out;
  for (const auto& o : schema.options()) out += (out.empty() ? "" : ", ") + o.key;
  return out;
}

}  // namespace

struct Document::Impl {
  toml::table root;
  std::vector<Override> overrides;
  std::vector<std::string> removed;             // the tables `--set TABLE=` removed, as given
  mutable std::set<std::string> used_sections;  // resolved, or marked known
  mutable std::set<std::string> resolved_sections;

  // One --set argument. `--set TABLE=`, nothing after '=', where TABLE is a table of the file
  // or of an earlier --set, removes it with every earlier --set into it: its keys take their
  // defaults again, and a stage leaves the graph. Otherwise it is section.key=value.
  void add_override(const std::string& arg) {
    const auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("--set " + arg + ": expected section.key=value (" +
                        (eq == 0 ? std::string("the key is missing") : "no '=' in it: write --set " + arg + "=VALUE") +
                        "), or TABLE= to remove a table");
    }
    const std::string path = arg.substr(0, eq);
    if (eq + 1 == arg.size() && names_table(path)) {
      remove_table(path);
      removed.push_back(arg);
      return;
    }
    overrides.push_back(parse_override(arg, path));
  }

  bool names_table(const std::string& dotted) const {
    if (auto n = find(dotted); n && n->is_table()) return true;
    return std::any_of(overrides.begin(), overrides.end(), [&](const Override& o) {
      return o.section == dotted || o.section.rfind(dotted + ".", 0) == 0;
    });
  }

  void remove_table(const std::string& dotted) {
    const auto dot = dotted.rfind('.');
    const std::string parent = dot == std::string::npos ? std::string() : dotted.substr(0, dot);
    toml::table* t = &root;
    if (!parent.empty())
      for (const auto& part : split_dotted(parent)) t = t ? t->get_as<toml::table>(part) : nullptr;
    if (t) t->erase(dot == std::string::npos ? dotted : dotted.substr(dot + 1));
    std::erase_if(overrides, [&](const Override& o) {
      return o.section == dotted || o.section.rfind(dotted + ".", 0) == 0;
    });
  }

  const toml::node* find(const std::string& dotted) const {
    if (dotted.empty()) return &root;
    const toml::node* cur = &root;
    for (const auto& part : split_dotted(dotted)) {
      auto t = cur->as_table();
      if (!t) return nullptr;
      cur = t->get(part);
      if (!cur) return nullptr;
    }
    return cur;
  }
};

Document::Document() : impl_(std::make_unique<Impl>()) {}
Document::~Document() = default;
Document::Document(Document&&) noexcept = default;
Document& Document::operator=(Document&&) noexcept = default;

Document Document::parse(const std::string& text, const std::string& name, const std::vector<std::string>& overrides) {
  Document doc;
  doc.file_ = name;
  try {
    doc.impl_->root = toml::parse(text, std::string_view(name));
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) + ": invalid TOML: " +
                      std::string(e.description()));
  }
  for (const auto& o : overrides) doc.impl_->add_override(o);
  return doc;
}

Document Document::load(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path.string() + ": cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path.string(), overrides);
}

bool Document::has_section(const std::string& section) const {
  auto n = impl_->find(section);
  if (n && n->is_table()) return true;
  for (const auto& o : impl_->overrides)
    if (o.section == section) return true;
  return false;
}

std::vector<std::string> Document::subsections(const std::string& prefix) const {
  std::vector<std::pair<int, std::string>> found;
  auto n = impl_->find(prefix);
  if (n && n->is_table()) {
    for (const auto& [k, v] : *n->as_table())
      if (v.is_table()) found.emplace_back(line_of(v), std::string(k.str()));
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  // Sections that only --set creates come last, in the order given.
  std::string pre = prefix.empty() ? "" : prefix + ".";
  for (const auto& o : impl_->overrides) {
    if (o.section.rfind(pre, 0) != 0) continue;
    std::string rest = o.section.substr(pre.size());
    if (rest.empty() || rest.find('.') != std::string::npos) continue;
    if (std::find(out.begin(), out.end(), rest) == out.end()) out.push_back(rest);
  }
  return out;
}

int Document::section_line(const std::string& section) const {
  auto n = impl_->find(section);
  return n ? line_of(*n) : 0;
}

Section Document::resolve(const std::string& section, const Schema& schema) const {
  impl_->used_sections.insert(section);
  impl_->resolved_sections.insert(section);
  Section out(section, file_);
  auto node = impl_->find(section);
  if (node && !node->is_table())
    throw ConfigError(file_ + ":" + std::to_string(line_of(*node)) + ": " + section +
                      ": expected a table [" + section + "], got " + describe_node(*node));
  if (node) {
    for (const auto& [k, v] : *node->as_table()) {
      std::string key(k.str());
      int line = static_cast<int>(k.source().begin.line);
      if (line == 0) line = line_of(v);
      auto spec = schema.find(key);
      if (!spec) {
        if (v.is_table()) continue;  // a nested section ([stages.x] under [stages]) is resolved on its own
        throw ConfigError(file_ + ":" + std::to_string(line) + ": [" + section + "] unknown key '" + key +
                          "'; expected one of: " + known_keys(schema));
      }
      std::string why;
      auto val = convert(v, *spec, why);
      if (!val) throw ConfigError(file_ + ":" + std::to_string(line) + ": [" + section + "] " + key + ": " + why);
      out.set(key, std::move(*val), Location{file_, line});
    }
  }
  for (const auto& o : impl_->overrides) {
    if (o.section != section) continue;
    auto spec = schema.find(o.key);
    if (!spec)
      throw ConfigError("--set " + o.arg + ": [" + section + "] unknown key '" + o.key +
                        "'; expected one of: " + known_keys(schema));
    // The value is read as TOML, so numbers, booleans and lists keep their types; a bare word
    // that is not valid TOML is taken as a string (--set model.preset=gpt2).
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + o.text);
    } catch (const toml::parse_error&) {
      // As a string, it must be text a config file could hold (UTF-8): the resolved config is
      // written back as TOML (the run directory's config.toml) and read again on resume.
      try {
        parsed = toml::parse("v = " + toml_string(o.text));
      } catch (const toml::parse_error& e) {
        throw ConfigError("--set " + o.arg + ": [" + section + "] " + o.key + ": the value is not valid UTF-8, which a config must be (" +
                          std::string(e.description()) + ")");
      }
    }
    std::string why;
    auto val = convert(*parsed.get("v"), *spec, why);
    if (!val) throw ConfigError("--set " + o.arg + ": [" + section + "] " + o.key + ": " + why);
    out.set(o.key, std::move(*val), Location{"--set", 0, o.arg});
  }
  for (const auto& spec : schema.options()) {
    if (!out.has(spec.key)) {
      if (!spec.default_value)
        throw ConfigError(file_ + (node ? ":" + std::to_string(line_of(*node)) : std::string()) + ": [" + section +
                          "] missing required key '" + spec.key + "' (" + value_type_name(spec.type) + ": " +
                          spec.doc + ")");
      out.set(spec.key, *spec.default_value, Location{"default", 0});
    }
    std::string bad = check_range(out.values().at(spec.key).first, spec);
    if (!bad.empty()) {
      throw ConfigError(out.where(spec.key).str() + ": [" + section + "] " + spec.key + ": " + bad);
    }
  }
  // Present keys in schema order, so tables read the same whatever order the file used.
  Section ordered(section, file_);
  for (const auto& spec : schema.options()) {
    const auto& [v, loc] = out.values().at(spec.key);
    ordered.set(spec.key, v, loc);
  }
  return ordered;
}

namespace {

// A TOML node as the closest Value, without a schema (arrays must hold strings).
std::optional<Value> raw_value(const toml::node& n) {
  if (auto v = n.value_exact<int64_t>()) return Value{*v};
  if (auto v = n.value_exact<double>()) return Value{*v};
  if (auto v = n.value_exact<bool>()) return Value{*v};
  if (auto v = n.value_exact<std::string>()) return Value{*v};
  if (auto arr = n.as_array()) {
    std::vector<std::string> out;
    for (const auto& e : *arr) {
      auto s = e.value_exact<std::string>();
      if (!s) return std::nullopt;
      out.push_back(*s);
    }
    return Value{std::move(out)};
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> Document::peek(const std::string& section, const std::string& key) const {
  for (auto it = impl_->overrides.rbegin(); it != impl_->overrides.rend(); ++it) {
    if (it->section != section || it->key != key) continue;
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + it->text);
    } catch (const toml::parse_error&) {
      return Value{it->text};
    }
    return raw_value(*parsed.get("v"));
  }
  auto node = impl_->find(section);
  if (!node || !node->is_table()) return std::nullopt;
  auto v = node->as_table()->get(key);
  return v ? raw_value(*v) : std::nullopt;
}

void Document::mark_known(const std::string& section) const { impl_->used_sections.insert(section); }

void Document::check_all_used() const {
  const auto& used = impl_->used_sections;
  auto is_used_or_parent = [&](const std::string& name) {
    if (used.count(name)) return true;
    for (const auto& u : used)
      if (u.rfind(name + ".", 0) == 0) return true;
    return false;
  };
  std::string known;
  for (const auto& u : used)
    if (u.find('.') == std::string::npos) known += (known.empty() ? "" : ", ") + u;

  // Walk every table in the file: each must be a resolved section or a parent of one.
  std::function<void(const toml::table&, const std::string&)> walk = [&](const toml::table& t, const std::string& prefix) {
    for (const auto& [k, v] : t) {
      std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      int line = static_cast<int>(k.source().begin.line);
      if (!v.is_table()) {
        if (prefix.empty())
          throw ConfigError(file_ + ":" + std::to_string(line) + ": top-level key '" + name +
                            "' belongs in a section; known sections: " + known);
        continue;  // keys inside tables were checked by resolve()
      }
      if (!is_used_or_parent(name)) {
        throw ConfigError(file_ + ":" + std::to_string(line) + ": unknown section [" + name + "]" +
                          (prefix.empty() ? "; known sections: " + known : std::string()));
      }
      if (!used.count(name)) walk(*v.as_table(), name);
    }
  };
  walk(impl_->root, "");
  for (const auto& o : impl_->overrides) {
    if (!used.count(o.section))
      throw ConfigError("--set " + o.arg + ": unknown section [" + o.section + "]; known sections: " + known);
    if (impl_->resolved_sections.count(o.section)) continue;
    // A section that only holds sections ([stages]): the key would be read by nothing.
    if (o.text.empty())
      throw ConfigError("--set " + o.arg + ": there is no table [" + o.section + "." + o.key +
                        "] to remove (--set TABLE= removes one)" + sections_under(o.section));
    throw ConfigError("--set " + o.arg + ": [" + o.section + "] holds tables, not keys: expected " + o.section +
                      ".NAME.key=value" + sections_under(o.section));
  }
}

const std::vector<std::string>& Document::removed() const { return impl_->removed; }

std::string Document::sections_under(const std::string& prefix) const {
  const auto names = subsections(prefix);
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "; its tables: " : ", ") + prefix + "." + n;
  return out;
}

void print_table(std::ostream& os, const std::vector<Section>& sections) {
  size_t wk = 3, wv = 5;
  for (const auto& s : sections)
    for (const auto& [k, vl] : s.values()) {
      wk = std::max(wk, s.name().size() + 1 + k.size());
      wv = std::max(wv, std::min<size_t>(48, value_to_string(vl.first).size()));
    }
  auto rule = [&] { os << "+" << std::string(wk + 2, '-') << "+" << std::string(wv + 2, '-') << "+" << std::string(22, '-') << "+\n"; };
  rule();
  os << "| " << std::left << std::setw(static_cast<int>(wk)) << "key" << " | " << std::setw(static_cast<int>(wv))
     << "value" << " | " << std::setw(20) << "from" << " |\n";
  rule();
  for (const auto& s : sections) {
    for (const auto& k : s.order()) {
      const auto& [v, loc] = s.values().at(k);
      std::string val = value_to_string(v);
      if (val.size() > 48) val = val.substr(0, 45) + "...";
      // "default", "--set", a line of the file, or what else set it (a resumed checkpoint).
      std::string from = loc.line > 0 ? "line " + std::to_string(loc.line) : loc.source;
      os << "| " << std::left << std::setw(static_cast<int>(wk)) << (s.name() + "." + k) << " | "
         << std::setw(static_cast<int>(wv)) << val << " | " << std::setw(20) << from << " |\n";
    }
  }
  rule();
}

namespace {

std::string toml_value(const Value& v) {
  if (auto p = std::get_if<std::string>(&v)) return toml_string(*p);
  if (auto p = std::get_if<std::vector<std::string>>(&v)) {
    std::string out = "[";
    for (size_t i = 0; i < p->size(); ++i) out += (i ? ", " : "") + toml_string((*p)[i]);
    return out + "]";
  }
  if (auto p = std::get_if<double>(&v)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", *p);
    std::string s = buf;
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a float when read back
    return s;
  }
  return value_to_string(v);
}

}  // namespace

std::string to_toml(const std::vector<Section>& sections) {
  std::string out;
  for (const auto& s : sections) {
    out += "[" + s.name() + "]\n";
    for (const auto& k : s.order()) out += k + " = " + toml_value(s.values().at(k).first) + "\n";
    out += "\n";
  }
  return out;
}

std::filesystem::path find_config(const std::string& name, const std::filesystem::path& source_dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> tried;
  auto try_path = [&](const fs::path& p) -> bool {
    tried.push_back(p);
    return fs::is_regular_file(p);
  };
  if (try_path(name)) return name;
  bool bare = name.find('/') == std::string::npos;
  if (bare) {
    std::vector<std::string> names{name};
    if (fs::path(name).extension() != ".toml") names.push_back(name + ".toml");
    for (const auto& n : names) {
      if (try_path(fs::path("pipelines") / n)) return fs::path("pipelines") / n;
      if (!source_dir.empty() && try_path(source_dir / "pipelines" / n)) return source_dir / "pipelines" / n;
    }
  }
  std::string list;
  for (const auto& t : tried) list += "\n  " + t.string();
  throw ConfigError(name + ": config file not found; looked for:" + list);
}

std::filesystem::path resolve_data_path(const std::filesystem::path& path, const std::filesystem::path& config_file,
                                        const std::filesystem::path& source_dir) {
  namespace fs = std::filesystem;
  if (!path.is_relative()) return path;
  // Relative to the config file first, then to the source tree, so the bundled configs work
  // from any working directory.
  fs::path cfg_dir = config_file.parent_path();
  for (const fs::path& base : {fs::current_path(), cfg_dir, cfg_dir / "..", source_dir})
    if (fs::exists(base / path)) return fs::weakly_canonical(base / path);
  return path;
}

}  // namespace pipeline::config
