// Typed configuration from TOML: the one place where pipeline config files and `--set`
// overrides are parsed and validated. A Schema declares a section's keys (type, default,
// range, doc); Document::resolve checks a section against it and returns typed values with
// the file and line each came from. Every error names the file, line, key and what was expected.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace pipeline::config {

enum class ValueType { integer, floating, boolean, string, string_list };
const char* value_type_name(ValueType t);

using Value = std::variant<int64_t, double, bool, std::string, std::vector<std::string>>;
std::string value_to_string(const Value& v);

/// Where a value came from: a file and line, "--set", or "default".
struct Location {
  std::string source;  // file path, "--set" or "default"
  int line = 0;        // 1-based; 0 when not from a file
  std::string arg = {};     // "--set": the argument as given ("training.steps=3"), for messages
  std::string str() const;  // "gpt2.toml:12", "--set training.steps=3", "default"
};

/// Every configuration problem: the message already names file, line, key and expectation.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  std::string key;
  ValueType type = ValueType::string;
  std::optional<Value> default_value;  // none: required
  std::optional<double> min, max;       // numeric ranges, inclusive
  std::vector<std::string> choices;     // allowed strings, when not empty
  std::string doc;
  bool allow_auto = false;              // integers: the string "auto" is accepted too
};

/// Checks one value against its option the way a value in a config file is checked (the one
/// validation path for files, --set and values set from code): the type (an integer widens
/// to a float, a string to a one-item list, "auto" where allowed), the range and the choices.
/// Returns the value as stored, or nullopt with `why` saying what was expected.
std::optional<Value> check_value(const OptionSpec& spec, const Value& v, std::string& why);

/// The keys one section accepts. Example:
///   Schema s("model");
///   s.integer("n_layer", 12, "transformer blocks", 1, 1024).string("preset", "gpt2", "...", {"gpt2", "tiny"});
class Schema {
 public:
  explicit Schema(std::string name = {}) : name_(std::move(name)) {}
  Schema& integer(std::string key, std::optional<int64_t> def, std::string doc,
                  std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  Schema& floating(std::string key, std::optional<double> def, std::string doc,
                   std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  Schema& boolean(std::string key, std::optional<bool> def, std::string doc);
  Schema& string(std::string key, std::optional<std::string> def, std::string doc,
                 std::vector<std::string> choices = {});
  Schema& string_list(std::string key, std::optional<std::vector<std::string>> def, std::string doc);
  /// An integer that may also be "auto" (the engine decides); `def` is an integer or "auto".
  Schema& integer_or_auto(std::string key, Value def, std::string doc, std::optional<double> min = std::nullopt,
                          std::optional<double> max = std::nullopt);
  /// Appends every key of `other` (e.g. the common stage keys plus a stage type's own).
  Schema& extend(const Schema& other);

  const std::string& name() const { return name_; }
  const std::vector<OptionSpec>& options() const { return options_; }
  const OptionSpec* find(const std::string& key) const;

 private:
  std::string name_;
  std::vector<OptionSpec> options_;
};

/// A section's values after validation, each with its origin.
class Section {
 public:
  Section() = default;
  Section(std::string name, std::string file) : name_(std::move(name)), file_(std::move(file)) {}

  const std::string& name() const { return name_; }
  int64_t get_int(const std::string& key) const;
  /// An integer_or_auto key: the integer, or nullopt for "auto".
  std::optional<int64_t> get_int_or_auto(const std::string& key) const;
  double get_float(const std::string& key) const;  // integers are accepted for float keys
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<std::string>& get_string_list(const std::string& key) const;
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  /// True when the value came from the file or --set rather than the default.
  bool was_set(const std::string& key) const;
  Location where(const std::string& key) const;
  /// Builds a ConfigError "FILE:LINE: [section] key: MESSAGE" for checks done after resolve
  /// (cross-key constraints such as n_embd % n_head == 0).
  ConfigError error(const std::string& key, const std::string& message) const;

  void set(const std::string& key, Value v, Location loc);
  const std::map<std::string, std::pair<Value, Location>>& values() const { return values_; }
  const std::vector<std::string>& order() const { return order_; }

 private:
  const std::pair<Value, Location>& at(const std::string& key) const;
  std::string name_, file_;
  std::map<std::string, std::pair<Value, Location>> values_;
  std::vector<std::string> order_;  // schema order, for printing
};

/// A parsed config file plus `--set section.key=value` overrides. Section names may be
/// dotted (`stages.tokenize`) for nested tables. `--set TABLE=` (nothing after '=') removes a
/// table of the file (or of an earlier --set): `--set stages.tokenize=` takes a stage out.
class Document {
 public:
  /// Parses `path`; a TOML syntax error becomes a ConfigError naming file, line and column.
  static Document load(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});
  /// Parses TOML text held in memory; `name` stands in for the file name in messages.
  static Document parse(const std::string& text, const std::string& name,
                        const std::vector<std::string>& overrides = {});

  Document();
  ~Document();
  Document(Document&&) noexcept;
  Document& operator=(Document&&) noexcept;

  const std::string& file() const { return file_; }
  bool has_section(const std::string& section) const;
  /// Names of the tables directly under `prefix` ("" = top level), in file order.
  std::vector<std::string> subsections(const std::string& prefix) const;
  /// Validates `section` against `schema`: unknown keys, wrong types and out-of-range values
  /// are errors. A section absent from the file resolves to its defaults (error if a key is required).
  Section resolve(const std::string& section, const Schema& schema) const;
  /// The value of `key` in `section` as written (the last --set for it wins), before any schema:
  /// for the few keys that decide which schema applies, such as a stage's `type`.
  std::optional<Value> peek(const std::string& section, const std::string& key) const;
  /// Marks a section as known; check_all_used() then reports any section or top-level key in
  /// the file (or in --set) that no resolve() or mark_known() accounted for.
  void mark_known(const std::string& section) const;
  void check_all_used() const;
  /// Line where a section's table starts (0 if absent or created by --set).
  int section_line(const std::string& section) const;
  /// The `--set TABLE=` arguments that removed a table (a stage, a section), in order.
  const std::vector<std::string>& removed() const;

 private:
  std::string sections_under(const std::string& prefix) const;  // "; its tables: ..." for messages
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string file_;
};

/// Prints sections as one aligned table, llm.c style: section, key, value, origin.
void print_table(std::ostream& os, const std::vector<Section>& sections);

/// Writes sections back as TOML that Document::load reads to the same values (the resolved
/// config saved in a run directory).
std::string to_toml(const std::vector<Section>& sections);

/// Resolves a config argument: an existing path as given, else `pipelines/NAME` under the
/// search roots (current directory, then the source tree's `pipelines/`).
std::filesystem::path find_config(const std::string& name, const std::filesystem::path& source_dir);

/// A data path as written in a config (a dataset, a model to start from): absolute, or relative
/// to the working directory, the config file's directory (and its parent), or the source tree,
/// whichever holds it first; as written when none does (the caller's check names it).
std::filesystem::path resolve_data_path(const std::filesystem::path& path, const std::filesystem::path& config_file,
                                        const std::filesystem::path& source_dir);

}  // namespace pipeline::config
