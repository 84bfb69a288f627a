// The text forms of a remote source: its URL (s3://, https://, http://, hf://), the same URL as
// printed (the query string and any user name redacted), the explicit patterns of known names an
// HTTPS source lists its files with (`shard_{000..099}.bin`), and list files (one name a line).
// Pure text, no network: `pipeline check` resolves a remote config with these alone, and the
// fuzz targets run them (tests/fuzz/fuzz_url.cpp, fuzz_list_file.cpp).
//
// Example:
//   io::RemoteUrl u = io::parse_remote_url("s3://bucket/fineweb/train");
//   u.scheme == "s3"; u.host == "bucket"; u.path == "fineweb/train";
//   io::redact_url("https://cdn/x.parquet?X-Amz-Signature=abc") == "https://cdn/x.parquet?<redacted>"
//   io::expand_braces("f_{000..002}.bin") == {"f_000.bin", "f_001.bin", "f_002.bin"}
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline::datasets::io {

/// A remote source's URL, split. For s3: host is the bucket and path the key or key prefix (no
/// leading '/'); for http(s): host is host[:port] and path starts with '/'.
struct RemoteUrl {
  std::string scheme;  // "s3", "https" or "http" (hf:// is rewritten to https)
  std::string host;
  std::string path;
  std::string query;  // without the '?'; "" when none

  /// The URL in full (query included): for requests, never for printing.
  std::string text() const;
  /// The URL as printed: the query string replaced by "<redacted>".
  std::string redacted() const;
  /// The URL of `name` beside this one: a relative name resolves against this URL's folder
  /// (the part of path up to its last '/'); an absolute URL of the same scheme and host stays as
  /// it is. Throws DatasetError for an absolute URL elsewhere, or a name that leaves the folder.
  RemoteUrl sibling(std::string_view name) const;
};

/// Where the Hugging Face Hub is, for hf:// URLs: `HF_ENDPOINT` when set, else the Hub.
struct HubEndpoint {
  std::string url = "https://huggingface.co";
};

/// Parses a remote source. hf://datasets/ORG/NAME[@REVISION]/PATH becomes
/// ENDPOINT/datasets/ORG/NAME/resolve/REVISION/PATH (REVISION "main" when not given). Throws
/// DatasetError naming the text for a URL this reader does not take: another scheme, no host or
/// bucket, a user name or password in it (credentials go in the environment or a credentials file),
/// a bucket name S3 would refuse, or bytes that are not printable ASCII.
RemoteUrl parse_remote_url(std::string_view text, const HubEndpoint& hub = {});

/// `text` with every URL in it printed safely: its query string replaced by "<redacted>" and any
/// user:password@ removed. For messages that may quote a URL (an error from the network library,
/// a redirect's target).
std::string redact_urls(std::string_view text);

/// Whether `text` holds a brace pattern: "{A..B}" (decimal, zero-padded to A's width when A has a
/// leading zero) or "{x,y,z}".
bool has_braces(std::string_view text);

/// Every name a brace pattern stands for, in order (the first brace varies slowest). Throws
/// DatasetError naming the pattern for an unbalanced or empty brace, a range running backwards or
/// mixing widths it cannot pad, or more than `limit` names.
std::vector<std::string> expand_braces(std::string_view pattern, size_t limit = 1000000);

/// The names a list file holds: one a line, relative to the list's folder (or an absolute URL on
/// the list's host); blank lines and lines starting with '#' are skipped, and surrounding
/// whitespace trimmed. Each resolves against `list` (RemoteUrl::sibling). Throws DatasetError
/// naming the list (redacted) and the line for a name that does not resolve, a duplicate, or a
/// list with no name in it.
std::vector<RemoteUrl> parse_list_file(std::string_view text, const RemoteUrl& list);

/// "bytes FIRST-LAST" of the range [offset, offset + length), as messages name a part of a file.
std::string byte_range_text(uint64_t offset, uint64_t length);

}  // namespace pipeline::datasets::io
