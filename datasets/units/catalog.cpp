// Catalogues (catalog.h): what kind of source a path names, and its units, read through its
// store. Nothing here decodes a payload: manifests, block indexes, llm.c headers and Parquet
// footers only.
#include "datasets/units/catalog.h"

#include <fnmatch.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "datasets/dataset_error.h"
#include "datasets/llmc/llmc_shard.h"
#include "datasets/parquet/parquet_module.h"
#include "datasets/shards/block_shard.h"
#include "datasets/shards/sha256.h"

namespace pipeline::datasets {
namespace {

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string parent_of(const std::string& uri) {
  const size_t slash = uri.rfind('/');
  return slash == std::string::npos ? std::string() : uri.substr(0, slash);
}

std::string base_name(const std::string& uri) {
  const size_t slash = uri.rfind('/');
  return slash == std::string::npos ? uri : uri.substr(slash + 1);
}

// The whole of a small file (a manifest), through the store.
std::string read_whole(io::Store& store, const io::ObjectInfo& info) {
  if (info.size > (uint64_t(256) << 20))
    throw DatasetError(info.uri + ": " + std::to_string(info.size) + " bytes, too large for a dataset manifest");
  auto file = store.open(info);
  std::string text(static_cast<size_t>(info.size), '\0');
  if (file->read_at(0, text.data(), text.size()) != text.size())
    throw DatasetError(info.uri + ": the file ends before its " + std::to_string(info.size) + " bytes");
  return text;
}

std::string sha256_through(io::Store& store, const io::ObjectInfo& info) {
  auto file = store.open(info);
  Sha256 hash;
  std::vector<char> buf(size_t(1) << 20);
  for (uint64_t at = 0; at < info.size;) {
    const size_t n = file->read_at(at, buf.data(), buf.size());
    if (n == 0) throw DatasetError(info.uri + ": the file ends at byte offset " + std::to_string(at));
    hash.update(buf.data(), n);
    at += n;
  }
  return hash.hex_digest();
}

uint32_t add_file(Catalog& c, const io::ObjectInfo& info) {
  if (c.files.size() >= UINT32_MAX) throw DatasetError(c.source + ": too many files");
  c.files.push_back({info, info.uri});
  return static_cast<uint32_t>(c.files.size() - 1);
}

// ---- prepared shards --------------------------------------------------------------------------

void prepared_units(io::Store& store, Catalog& c, const io::ObjectInfo& manifest_file, const CatalogOptions& o) {
  const Manifest m = Manifest::parse(read_whole(store, manifest_file), manifest_file.uri);
  const std::string dir = parent_of(manifest_file.uri);
  const auto split = m.splits.find(o.split);
  if (split == m.splits.end()) {
    std::string have;
    for (const auto& [name, _] : m.splits) have += (have.empty() ? "" : ", ") + name;
    throw DatasetError(manifest_file.uri + ": no split \"" + o.split + "\" (the manifest has: " +
                       (have.empty() ? "none" : have) + ")");
  }
  const std::vector<ShardInfo>& shards = split->second;
  const bool text = m.kind == ShardKind::text;
  c.content = text ? UnitContent::documents : UnitContent::tokens;
  c.format = m.block_shards() ? SourceFormat::shards_v2 : SourceFormat::shards_v1;
  const uint64_t ranges = shards.empty() ? 1 : std::max<uint64_t>(1, (o.lanes + shards.size() - 1) / shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardInfo& s = shards[i];
    const std::string uri = join(dir, s.name);
    io::ObjectInfo info;
    try {
      info = store.stat(uri);
    } catch (const DatasetError& e) {
      throw DatasetError(manifest_file.uri + ": shard " + o.split + "[" + std::to_string(i) + "] \"" + s.name +
                         "\" is missing: " + e.what());
    }
    if (info.size != s.bytes)
      throw DatasetError(uri + ": size mismatch: the file is " + std::to_string(info.size) + " bytes but " +
                         manifest_file.uri + " records " + std::to_string(s.bytes) +
                         (info.size < s.bytes ? " (truncated at byte offset " + std::to_string(info.size) + ")" : ""));
    if (o.verify == VerifyMode::on_open) {
      const std::string actual = sha256_through(store, info);
      if (actual != s.sha256)
        throw DatasetError(uri + ": sha256 mismatch: the file hashes to " + actual + " but " + manifest_file.uri +
                           " records " + s.sha256 + " (the shard changed after it was written)");
    }
    const uint32_t f = add_file(c, info);
    if (c.format == SourceFormat::shards_v2) {
      const auto file = store.open(info);
      const BlockIndex index = read_block_index(*file, m.kind);
      if (index.blocks.size() != s.blocks || index.header.documents != s.documents || index.header.items != s.items)
        throw DatasetError(uri + ": the shard holds " + std::to_string(index.blocks.size()) + " blocks, " +
                           std::to_string(index.header.documents) + " documents and " +
                           std::to_string(index.header.items) + " items, but " + manifest_file.uri + " records " +
                           std::to_string(s.blocks) + ", " + std::to_string(s.documents) + " and " +
                           std::to_string(s.items));
      uint64_t first = 0;
      for (size_t b = 0; b < index.blocks.size(); ++b) {
        const ShardBlock& blk = index.blocks[b];
        c.units.push_back({f, blk.offset, blk.bytes, b, first, blk.documents, text ? blk.documents : blk.items,
                           text ? blk.items : kUnknownCount});
        first += blk.documents;
      }
      continue;
    }
    // Format 1: the whole shard a unit, or, with fewer shards than lanes, ranges of its documents
    // (reached by decompressing from the shard's start).
    const uint64_t frame = s.bytes > kShardHeaderBytes ? s.bytes - kShardHeaderBytes : 0;
    for (uint64_t r = 0; r < ranges; ++r) {
      const uint64_t begin = s.documents * r / ranges, end = s.documents * (r + 1) / ranges;
      if (end == begin) continue;
      const uint64_t items = text ? end - begin : ranges == 1 ? s.items : kUnknownCount;
      c.units.push_back({f, kShardHeaderBytes, frame, r, begin, end - begin, items});
    }
  }
}

// ---- llm.c ------------------------------------------------------------------------------------

void llmc_units(io::Store& store, Catalog& c, const std::string& dir, const std::vector<io::ObjectInfo>& listing,
                const CatalogOptions& o) {
  c.format = SourceFormat::llmc;
  c.content = UnitContent::tokens;
  if (o.llmc_unit_tokens == 0) throw DatasetError(c.source + ": llm.c units of 0 tokens");
  std::vector<std::tuple<uint64_t, std::string, io::ObjectInfo>> files;
  std::map<std::string, int> splits;
  for (const io::ObjectInfo& info : listing) {
    if (parent_of(info.uri) != dir) continue;  // the directory's own files, not its subdirectories'
    std::string split;
    uint64_t index = 0;
    if (!parse_llmc_shard_name(base_name(info.uri), split, index)) continue;
    ++splits[split];
    if (split == o.split) files.emplace_back(index, base_name(info.uri), info);
  }
  if (files.empty()) {
    std::string have;
    for (const auto& [name, _] : splits) have += (have.empty() ? "" : ", ") + name;
    throw DatasetError(c.source + ": no llm.c shards of split \"" + o.split + "\" (found: " +
                       (have.empty() ? "none" : have) + ")");
  }
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b)); });
  for (const auto& [index, name, info] : files) {
    const auto file = store.open(info);
    std::string head(kLlmcHeaderBytes, '\0');
    head.resize(file->read_at(0, head.data(), head.size()));
    const uint64_t tokens = parse_llmc_header(head, info.size, info.uri);
    const uint32_t f = add_file(c, info);
    for (uint64_t start = 0, k = 0; start < tokens; start += o.llmc_unit_tokens, ++k) {
      const uint64_t n = std::min(o.llmc_unit_tokens, tokens - start);
      c.units.push_back({f, kLlmcHeaderBytes + 2 * start, 2 * n, k, start, kUnknownCount, n});
    }
  }
}

// ---- Parquet ----------------------------------------------------------------------------------

void parquet_units(io::Store& store, Catalog& c, std::vector<io::ObjectInfo> files, const CatalogOptions& o) {
  c.format = SourceFormat::parquet;
  c.content = UnitContent::documents;
  c.column = o.column;
  std::sort(files.begin(), files.end(), [](const io::ObjectInfo& a, const io::ObjectInfo& b) { return a.uri < b.uri; });
  const ParquetModule& module = parquet_module(c.source);
  for (const io::ObjectInfo& info : files) {
    const std::unique_ptr<ParquetFile> pf = module.open_range_file(store.open(info), o.column);
    const uint32_t f = add_file(c, info);
    for (int g = 0; g < pf->row_groups(); ++g) {
      const int64_t rows = pf->row_group_rows(g);
      if (rows < 0)
        throw DatasetError(info.uri + ": row group " + std::to_string(g) + ": the footer records " +
                           std::to_string(rows) + " rows");
      if (rows == 0) continue;  // an empty row group is no unit
      const auto [offset, bytes] = pf->row_group_range(g);
      c.units.push_back({f, offset, bytes, static_cast<uint64_t>(g), static_cast<uint64_t>(g), kUnknownCount,
                         static_cast<uint64_t>(rows)});
    }
  }
}

bool is_parquet_name(const std::string& uri) { return uri.size() > 8 && uri.ends_with(".parquet"); }

// The Parquet files a directory listing holds: those under data/ when there are any (a hub
// snapshot keeps its data there, beside its README and the client's metadata), else all.
std::vector<io::ObjectInfo> parquet_in(const std::string& dir, const std::vector<io::ObjectInfo>& listing) {
  std::vector<io::ObjectInfo> all, data;
  const std::string data_prefix = join(dir, "data/");
  for (const io::ObjectInfo& info : listing) {
    if (!is_parquet_name(info.uri)) continue;
    all.push_back(info);
    if (info.uri.starts_with(data_prefix)) data.push_back(info);
  }
  return data.empty() ? all : data;
}

}  // namespace

const char* source_format_name(SourceFormat format) {
  switch (format) {
    case SourceFormat::shards_v1: return "shards of format 1";
    case SourceFormat::shards_v2: return "block shards";
    case SourceFormat::llmc: return "llm.c shards";
    case SourceFormat::parquet: return "Parquet";
  }
  return "?";
}

std::string Catalog::describe(const Unit& u) const {
  const std::string& file = files.at(u.file).name;
  switch (format) {
    case SourceFormat::shards_v2:
      return file + " block " + std::to_string(u.place) + " (bytes " + std::to_string(u.offset) + "+" +
             std::to_string(u.bytes) + ")";
    case SourceFormat::shards_v1:
      return file + " documents " + std::to_string(u.first) + ".." + std::to_string(u.first + u.documents);
    case SourceFormat::llmc:
      return file + " tokens " + std::to_string(u.first) + ".." + std::to_string(u.first + u.items);
    case SourceFormat::parquet:
      return file + " row group " + std::to_string(u.place);
  }
  return file;
}

uint64_t Catalog::items() const {
  uint64_t n = 0;
  for (const Unit& u : units) {
    if (u.items == kUnknownCount) return kUnknownCount;
    n += u.items;
  }
  return n;
}

std::string Catalog::slow_reading_note() const {
  if (format != SourceFormat::shards_v1 || units.size() <= files.size()) return "";
  return source + ": " + std::to_string(files.size()) + " shards of format 1 (one zstd frame each) cut into " +
         std::to_string(units.size()) +
         " ranges of documents, one unit each: a lane reaches its range by decompressing the shard from its start, "
         "which reads each shard about (ranges a shard) / 2 times an epoch. `pipeline prepare` again makes block "
         "shards, whose units are read on their own";
}

Catalog build_catalog(io::Store& store, const std::string& given, const CatalogOptions& o) {
  Catalog c;
  c.source = given;
  std::string source = given;
  while (source.size() > 1 && source.back() == '/') source.pop_back();
  if (is_glob(source)) {  // Parquet files matching a pattern, listed from its fixed directory
    if (!source.ends_with(".parquet"))
      throw DatasetError(given + ": a pattern names Parquet files (it ends in .parquet)");
    std::string dir = source.substr(0, source.find_first_of("*?["));
    std::string pattern = source;
    if (dir.find('/') == std::string::npos) {  // a pattern in the working directory, listed as ./NAME
      dir = ".";
      pattern = "./" + source;
    } else {
      dir = parent_of(dir);
    }
    std::vector<io::ObjectInfo> files;
    for (const io::ObjectInfo& info : store.list(dir.empty() ? "/" : dir))
      if (::fnmatch(pattern.c_str(), info.uri.c_str(), FNM_PATHNAME) == 0) files.push_back(info);
    if (files.empty()) throw DatasetError(given + ": the pattern matches no Parquet file");
    parquet_units(store, c, std::move(files), o);
  } else if (is_parquet_name(source)) {
    parquet_units(store, c, {store.stat(source)}, o);
  } else if (source.ends_with(".json")) {
    prepared_units(store, c, store.stat(source), o);
  } else {
    const std::vector<io::ObjectInfo> listing = store.list(source);
    const std::string manifest = join(source, kManifestFileName);
    const auto m = std::find_if(listing.begin(), listing.end(), [&](const io::ObjectInfo& i) { return i.uri == manifest; });
    bool llmc = false;
    for (const io::ObjectInfo& info : listing) {
      std::string split;
      uint64_t index = 0;
      llmc |= parent_of(info.uri) == source && parse_llmc_shard_name(base_name(info.uri), split, index);
    }
    if (m != listing.end()) {
      prepared_units(store, c, *m, o);
    } else if (llmc) {
      llmc_units(store, c, source, listing, o);
    } else if (auto files = parquet_in(source, listing); !files.empty()) {
      parquet_units(store, c, std::move(files), o);
    } else {
      throw DatasetError(given + ": not a dataset: no manifest.json (pipeline prepare), no llm.c shards "
                         "(NAME_SPLIT_NNNNNN.bin) and no Parquet files");
    }
  }
  if (c.units.empty())
    throw DatasetError(given + " (" + source_format_name(c.format) + ", " + std::to_string(c.files.size()) +
                       " files): holds no data");
  return c;
}

void check_unchanged(io::Store& store, const Catalog& catalog) {
  for (const CatalogFile& f : catalog.files) {
    const io::ObjectInfo now = store.stat(f.object.uri);
    if (now.size != f.object.size || now.version != f.object.version)
      throw DatasetError(f.name + ": the file changed since the run's catalogue was made (" +
                         std::to_string(f.object.size) + " bytes, version " + f.object.version + " then; " +
                         std::to_string(now.size) + " bytes, version " + now.version +
                         " now): a run never mixes two versions of a file");
  }
}

}  // namespace pipeline::datasets
