// Manifest JSON writer and strict reader. Every key is checked; errors name manifest.json,
// the JSON path of the bad value and its byte offset.
#include "datasets/shards/manifest.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/atomic_file.h"
#include "base/json.h"

namespace pipeline::datasets {
namespace {

class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const JsonValue& v, const std::string& where, const std::string& what) const {
    throw DatasetError(source_ + ": malformed manifest: " + where + " (byte offset " + std::to_string(v.offset) +
                       "): " + what);
  }

  const JsonValue& member(const JsonValue& obj, const std::string& where, const char* key,
                          JsonValue::Type type) const {
    const JsonValue* v = obj.find(key);
    if (!v) fail(obj, where, std::string("missing key \"") + key + "\"");
    if (v->type != type)
      fail(*v, where + "." + key,
           std::string("expected a ") + JsonValue::type_name(type) + ", found a " + JsonValue::type_name(v->type));
    return *v;
  }

  uint64_t u64(const JsonValue& obj, const std::string& where, const char* key) const {
    const JsonValue& v = member(obj, where, key, JsonValue::Type::number);
    uint64_t out = 0;
    auto [p, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), out);
    if (ec != std::errc() || p != v.text.data() + v.text.size())
      fail(v, where + "." + key, "expected a non-negative integer, found " + v.text);
    return out;
  }

  double f64(const JsonValue& obj, const std::string& where, const char* key) const {
    const JsonValue& v = member(obj, where, key, JsonValue::Type::number);
    return std::strtod(v.text.c_str(), nullptr);
  }

  const std::string& str(const JsonValue& obj, const std::string& where, const char* key) const {
    return member(obj, where, key, JsonValue::Type::string).text;
  }

  void only_keys(const JsonValue& obj, const std::string& where, std::initializer_list<std::string_view> keys) const {
    for (const auto& [k, v] : obj.members) {
      bool known = false;
      for (auto key : keys) known |= key == k;
      if (!known) fail(v, where, "unknown key \"" + k + "\"");
    }
  }

 private:
  std::string source_;
};

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

uint64_t Manifest::documents(const std::string& split) const {
  uint64_t n = 0;
  if (auto it = splits.find(split); it != splits.end())
    for (const auto& s : it->second) n += s.documents;
  return n;
}

uint64_t Manifest::items(const std::string& split) const {
  uint64_t n = 0;
  if (auto it = splits.find(split); it != splits.end())
    for (const auto& s : it->second) n += s.items;
  return n;
}

std::string Manifest::to_json() const {
  std::ostringstream o;
  char fraction[32];  // shortest text that reads back as the same double
  auto fraction_end = std::to_chars(fraction, fraction + sizeof fraction, val_fraction).ptr;
  *fraction_end = '\0';
  o << "{\n"
    << "  \"format\": \"pipeline-dataset\",\n"
    << "  \"version\": " << version << ",\n"
    << "  \"kind\": " << json_quote(shard_kind_name(kind)) << ",\n"
    << "  \"created_by\": " << json_quote(created_by) << ",\n"
    << "  \"seed\": " << seed << ",\n"
    << "  \"val_fraction\": " << fraction << ",\n"
    << "  \"split_rule\": " << json_quote(split_rule) << ",\n";
  if (block_shards()) o << "  \"block_bytes\": " << block_bytes << ",\n";
  o << "  \"splits\": {";
  const char* items_key = kind == ShardKind::text ? "text_bytes" : "tokens";
  bool first_split = true;
  for (const auto& [name, shards] : splits) {
    o << (first_split ? "\n" : ",\n") << "    " << json_quote(name) << ": [";
    first_split = false;
    for (size_t i = 0; i < shards.size(); ++i) {
      const auto& s = shards[i];
      o << (i ? ",\n" : "\n") << "      {\"name\": " << json_quote(s.name) << ", \"bytes\": " << s.bytes
        << ", \"documents\": " << s.documents << ", \"" << items_key << "\": " << s.items;
      if (block_shards()) o << ", \"blocks\": " << s.blocks;
      o << ", \"sha256\": " << json_quote(s.sha256) << "}";
    }
    o << (shards.empty() ? "]" : "\n    ]");
  }
  o << "\n  }\n}\n";
  return o.str();
}

Manifest Manifest::parse(std::string_view json, const std::string& source) {
  JsonValue root;
  try {
    root = json_parse(json);
  } catch (const JsonParseError& e) {
    throw DatasetError(source + ": malformed manifest: not valid JSON at " + e.what());
  }
  Reader r(source);
  if (root.type != JsonValue::Type::object) r.fail(root, "top level", "expected an object");
  Manifest m;
  r.only_keys(root, "top level",
              {"format", "version", "kind", "created_by", "seed", "val_fraction", "split_rule", "block_bytes", "splits"});
  const JsonValue& format = r.member(root, "top level", "format", JsonValue::Type::string);
  if (format.text != "pipeline-dataset")
    r.fail(format, "format", "expected \"pipeline-dataset\", found \"" + format.text + "\"");
  uint64_t version = r.u64(root, "top level", "version");
  if (version != kManifestVersion && version != kManifestVersionOneFrame)
    r.fail(*root.find("version"), "version",
           "unsupported manifest version " + std::to_string(version) + "; this build reads versions 1 and 2");
  m.version = static_cast<uint32_t>(version);
  const bool blocks = m.block_shards();
  if (blocks) {
    m.block_bytes = r.u64(root, "top level", "block_bytes");
  } else if (const JsonValue* b = root.find("block_bytes")) {
    r.fail(*b, "block_bytes", "a version 1 manifest has no block shards");
  }
  const JsonValue& kind = r.member(root, "top level", "kind", JsonValue::Type::string);
  if (kind.text == "text")
    m.kind = ShardKind::text;
  else if (kind.text == "tokens")
    m.kind = ShardKind::tokens;
  else
    r.fail(kind, "kind", "expected \"text\" or \"tokens\", found \"" + kind.text + "\"");
  if (root.find("created_by")) m.created_by = r.str(root, "top level", "created_by");
  if (root.find("seed")) m.seed = r.u64(root, "top level", "seed");
  if (root.find("val_fraction")) m.val_fraction = r.f64(root, "top level", "val_fraction");
  if (root.find("split_rule")) m.split_rule = r.str(root, "top level", "split_rule");
  const char* items_key = m.kind == ShardKind::text ? "text_bytes" : "tokens";
  const JsonValue& splits = r.member(root, "top level", "splits", JsonValue::Type::object);
  for (const auto& [split_name, list] : splits.members) {
    std::string where = "splits." + split_name;
    if (list.type != JsonValue::Type::array) r.fail(list, where, "expected an array of shards");
    if (m.splits.count(split_name)) r.fail(list, where, "split listed twice");
    auto& shards = m.splits[split_name];
    for (size_t i = 0; i < list.items.size(); ++i) {
      const JsonValue& s = list.items[i];
      std::string at = where + "[" + std::to_string(i) + "]";
      if (s.type != JsonValue::Type::object) r.fail(s, at, "expected a shard object");
      if (blocks)
        r.only_keys(s, at, {"name", "bytes", "documents", items_key, "blocks", "sha256"});
      else
        r.only_keys(s, at, {"name", "bytes", "documents", items_key, "sha256"});
      ShardInfo info;
      info.name = r.str(s, at, "name");
      if (info.name.empty() || info.name.find('/') != std::string::npos || info.name.find('\\') != std::string::npos ||
          info.name == "." || info.name == "..")
        r.fail(*s.find("name"), at + ".name", "expected a plain file name, found \"" + info.name + "\"");
      info.bytes = r.u64(s, at, "bytes");
      info.documents = r.u64(s, at, "documents");
      info.items = r.u64(s, at, items_key);
      if (blocks) info.blocks = r.u64(s, at, "blocks");
      info.sha256 = r.str(s, at, "sha256");
      if (!is_hex64(info.sha256))
        r.fail(*s.find("sha256"), at + ".sha256", "expected 64 lower-case hex digits, found \"" + info.sha256 + "\"");
      shards.push_back(std::move(info));
    }
  }
  return m;
}

std::filesystem::path manifest_dir_of(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path)) return path.parent_path().empty() ? "." : path.parent_path();
  return path;
}

Manifest Manifest::load(const std::filesystem::path& dir_or_file) {
  std::filesystem::path file = std::filesystem::is_directory(dir_or_file) ? dir_or_file / kManifestFileName : dir_or_file;
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw DatasetError(file.string() + ": cannot open the dataset manifest" +
                       (std::filesystem::exists(dir_or_file) ? "" : " (the path does not exist)"));
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string());
}

void Manifest::save(const std::filesystem::path& dir) const {
  write_file_atomic(dir / kManifestFileName, to_json());  // readers never see a half-written manifest
}

void verify_split(const std::filesystem::path& dir, const Manifest& manifest, const std::string& split,
                  VerifyMode mode) {
  std::string source = (dir / kManifestFileName).string();
  auto it = manifest.splits.find(split);
  if (it == manifest.splits.end()) {
    std::string have;
    for (const auto& [name, _] : manifest.splits) have += (have.empty() ? "" : ", ") + name;
    throw DatasetError(source + ": no split \"" + split + "\" (the manifest has: " + (have.empty() ? "none" : have) + ")");
  }
  for (size_t i = 0; i < it->second.size(); ++i) {
    const ShardInfo& s = it->second[i];
    std::filesystem::path path = dir / s.name;
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    if (ec)
      throw DatasetError(source + ": shard " + split + "[" + std::to_string(i) + "] \"" + s.name +
                         "\" is missing: " + path.string() + " does not exist or cannot be read");
    if (size != s.bytes)
      throw DatasetError(path.string() + ": size mismatch: the file is " + std::to_string(size) + " bytes but " +
                         source + " records " + std::to_string(s.bytes) +
                         (size < s.bytes ? " (truncated at byte offset " + std::to_string(size) + ")" : ""));
    if (mode == VerifyMode::on_open) {
      std::string actual = sha256_file_hex(path);
      if (actual != s.sha256)
        throw DatasetError(path.string() + ": sha256 mismatch: the file hashes to " + actual + " but " + source +
                           " records " + s.sha256 + " (the shard changed after it was written)");
    }
  }
}

}  // namespace pipeline::datasets
