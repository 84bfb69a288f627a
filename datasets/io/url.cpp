// Remote source URLs, their printed form, brace patterns and list files (url.h).
#include "datasets/io/url.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "datasets/dataset_error.h"

namespace pipeline::datasets::io {
namespace {

constexpr std::string_view kRedacted = "<redacted>";

bool scheme_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The message names the URL as printed: a bad URL may still carry a token in its query.
[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw DatasetError(redact_urls(text) + ": " + why);
}

// S3's rules for bucket names (3 to 63 of a-z, 0-9, '.', '-', starting and ending with a letter
// or digit): a name outside them is a typo, better named here than as a signature error later.
bool valid_bucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(b.front()) || !alnum(b.back())) return false;
  return std::all_of(b.begin(), b.end(), [&](char c) { return alnum(c) || c == '.' || c == '-'; });
}

bool has_dot_segment(std::string_view path) {
  size_t i = 0;
  while (i <= path.size()) {
    const size_t j = std::min(path.find('/', i), path.size());
    const std::string_view seg = path.substr(i, j - i);
    if (seg == "." || seg == "..") return true;
    i = j + 1;
  }
  return false;
}

RemoteUrl parse_hf(std::string_view text, std::string_view rest, const HubEndpoint& hub) {
  // hf://datasets/ORG/NAME[@REV]/PATH
  constexpr std::string_view kDatasets = "datasets/";
  if (rest.substr(0, kDatasets.size()) != kDatasets)
    bad(text, "an hf:// URL names a dataset: hf://datasets/ORG/NAME[@REVISION]/PATH");
  rest.remove_prefix(kDatasets.size());
  // The revision is the '@' part; a query would be spliced into the resolved path.
  if (rest.find('?') != std::string_view::npos) bad(text, "an hf:// URL takes no query string (a revision is NAME@REVISION)");
  const size_t org_end = rest.find('/');
  if (org_end == std::string_view::npos || org_end == 0) bad(text, "no ORG/NAME after hf://datasets/");
  const size_t name_end = rest.find('/', org_end + 1);
  std::string_view repo = rest.substr(0, name_end == std::string_view::npos ? rest.size() : name_end);
  const std::string_view path = name_end == std::string_view::npos ? std::string_view() : rest.substr(name_end + 1);
  std::string revision = "main";
  if (const size_t at = repo.find('@'); at != std::string_view::npos) {
    revision = std::string(repo.substr(at + 1));
    repo = repo.substr(0, at);
    if (revision.empty()) bad(text, "an empty revision after '@'");
  }
  if (repo.size() <= org_end + 1) bad(text, "no dataset NAME after hf://datasets/ORG/");
  std::string endpoint = hub.url;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  RemoteUrl base;
  try {
    base = parse_remote_url(endpoint + "/");
  } catch (const DatasetError& e) {
    throw DatasetError(std::string("HF_ENDPOINT: ") + e.what());
  }
  if (!base.query.empty()) throw DatasetError("HF_ENDPOINT: " + base.redacted() + ": a query string is not taken here");
  std::string prefix = base.path;
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  base.path = prefix + "datasets/" + std::string(repo) + "/resolve/" + revision + "/" + std::string(path);
  if (has_dot_segment(base.path)) bad(text, "'.' and '..' path segments are not taken");
  return base;
}

}  // namespace

std::string RemoteUrl::text() const {
  std::string out = scheme + "://" + host + (scheme == "s3" && !path.empty() ? "/" : "") + path;
  if (!query.empty()) out += "?" + query;
  return out;
}

std::string RemoteUrl::redacted() const {
  RemoteUrl copy = *this;
  if (!copy.query.empty()) copy.query = std::string(kRedacted);
  return copy.text();
}

RemoteUrl RemoteUrl::sibling(std::string_view name) const {
  if (name.find("://") != std::string_view::npos) {
    RemoteUrl other = parse_remote_url(name);
    if (other.scheme != scheme || lower(other.host) != lower(host))
      throw DatasetError(redact_urls(name) + ": a file of " + redacted() + " must be on the same server (" + scheme +
                         "://" + host + ")");
    other.host = host;  // host names are case-blind: the list's spelling, so that the store knows it
    return other;
  }
  if (name.empty()) throw DatasetError(redacted() + ": an empty file name");
  if (has_dot_segment(name)) throw DatasetError(redact_urls(name) + ": '.' and '..' are not taken in a file name of " + redacted());
  RemoteUrl out = *this;
  out.query.clear();
  if (name.front() == '/') {
    if (scheme == "s3") throw DatasetError(std::string(name) + ": an S3 key is relative to " + redacted());
    out.path = std::string(name);
  } else {
    const size_t slash = path.rfind('/');
    out.path = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + std::string(name);
  }
  // Checked as a URL of its own (spaces, control bytes, a '?' in the name).
  return parse_remote_url(out.text());
}

RemoteUrl parse_remote_url(std::string_view text, const HubEndpoint& hub) {
  for (unsigned char c : text)
    if (c <= ' ' || c >= 0x7f)
      bad(text, "a URL holds printable ASCII only (percent-encode spaces and other bytes: %20)");
  const size_t colon = text.find("://");
  if (colon == std::string_view::npos || colon == 0 ||
      !std::all_of(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(colon), scheme_char))
    bad(text, "not a URL (expected s3://BUCKET/PREFIX, https://HOST/PATH or hf://datasets/ORG/NAME/PATH)");
  const std::string scheme = lower(text.substr(0, colon));
  std::string_view rest = text.substr(colon + 3);
  if (const size_t hash = rest.find('#'); hash != std::string_view::npos) bad(text, "a URL fragment ('#') is not taken");
  if (scheme == "hf") return parse_hf(text, rest, hub);
  if (scheme != "s3" && scheme != "https" && scheme != "http")
    bad(text, "the scheme " + scheme + ":// is not read (s3://, https://, http:// with [data] allow_http, hf://)");

  RemoteUrl u;
  u.scheme = scheme;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    u.query = std::string(rest.substr(q + 1));
    rest = rest.substr(0, q);
  }
  const size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  if (authority.find('@') != std::string_view::npos)
    bad(text, "a user name or password in a URL is a credential, and the config is written into the run directory: "
              "put it in ~/.netrc (HTTPS) or the AWS credentials (S3) instead");
  if (authority.empty()) bad(text, scheme == "s3" ? "no bucket after s3://" : "no host after " + scheme + "://");
  u.host = std::string(authority);
  const std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (scheme == "s3") {
    if (!u.query.empty()) bad(text, "an s3:// URL takes no query string");
    if (!valid_bucket(u.host))
      bad(text, "'" + u.host + "' is not an S3 bucket name (3 to 63 characters: a-z, 0-9, '.', '-')");
    u.path = path.empty() ? std::string() : std::string(path.substr(1));
  } else {
    const size_t port_colon = u.host.rfind(':');
    if (port_colon != std::string::npos && u.host.find(']') == std::string::npos) {
      const std::string port = u.host.substr(port_colon + 1);
      if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) || std::stoi(port) == 0 ||
          std::stoi(port) > 65535)
        bad(text, "'" + port + "' is not a port number");
      if (port_colon == 0) bad(text, "no host before the port");
    }
    u.path = path.empty() ? std::string("/") : std::string(path);
  }
  if (has_dot_segment(u.path)) bad(text, "'.' and '..' path segments are not taken");
  return u;
}

std::string redact_urls(std::string_view text) {
  // Each URL: its user:password@ dropped, and everything from its '?' or '#' on (a query string, a
  // fragment: either may carry a token) printed as "?<redacted>" (a fragment alone goes). Printing
  // what was printed already gives the same text.
  auto url_char = [](char c) {
    return static_cast<unsigned char>(c) > ' ' && c != '"' && c != '\'' && c != '<' && c != '>' && c != '`' &&
           static_cast<unsigned char>(c) < 0x7f;
  };
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t mark = text.find("://", i);
    if (mark == std::string_view::npos) break;
    size_t start = mark;
    while (start > i && scheme_char(text[start - 1])) --start;
    // The URL runs to the first byte no URL holds; a query printed already ("?<redacted>") is
    // passed over and the URL goes on after it: what follows it was the query's, and printing it
    // as text of its own would join it to the URL when a fragment before it is dropped.
    size_t end = mark + 3;
    for (;;) {
      while (end < text.size() && url_char(text[end])) ++end;
      if (text[end - 1] != '?' || text.substr(end, kRedacted.size()) != kRedacted) break;
      end += kRedacted.size();
    }
    out.append(text.substr(i, start - i));
    const std::string_view url = text.substr(start, end - start);
    const size_t auth_begin = mark + 3 - start;
    size_t auth_end = url.find_first_of("/?#", auth_begin);
    if (auth_end == std::string_view::npos) auth_end = url.size();
    const size_t at = url.substr(0, auth_end).rfind('@');
    const size_t host_begin = at != std::string_view::npos && at >= auth_begin ? at + 1 : auth_begin;
    const std::string_view rest = url.substr(host_begin);
    const size_t cut = rest.find_first_of("?#");
    out.append(url.substr(0, auth_begin));
    out.append(rest.substr(0, cut));
    if (cut != std::string_view::npos && rest[cut] == '?') out += "?" + std::string(kRedacted);
    i = end;
  }
  out.append(text.substr(i));
  return out;
}

namespace {

// One brace group: its alternatives, or throws. `body` is the text between the braces.
std::vector<std::string> brace_alternatives(std::string_view pattern, std::string_view body, size_t limit) {
  if (body.empty()) throw DatasetError(std::string(pattern) + ": an empty {} in a pattern");
  if (body.find(',') == std::string_view::npos) {
    const size_t dots = body.find("..");
    if (dots == std::string_view::npos)
      throw DatasetError(std::string(pattern) + ": {" + std::string(body) + "} is neither a range {A..B} nor a list {x,y}");
    const std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
    auto digits = [](std::string_view s) { return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), ::isdigit); };
    if (!digits(a) || !digits(b))
      throw DatasetError(std::string(pattern) + ": {" + std::string(body) + "}: a range is two decimal numbers, {000..099}");
    const uint64_t lo = std::stoull(std::string(a)), hi = std::stoull(std::string(b));
    if (hi < lo) throw DatasetError(std::string(pattern) + ": {" + std::string(body) + "} runs backwards");
    if (hi - lo >= limit) throw DatasetError(std::string(pattern) + ": more than " + std::to_string(limit) + " names");
    const size_t width = a.size() > 1 && a.front() == '0' ? a.size() : 0;
    std::vector<std::string> out;
    for (uint64_t v = lo;; ++v) {
      std::string s = std::to_string(v);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(std::move(s));
      if (v == hi) break;
    }
    return out;
  }
  std::vector<std::string> out;
  size_t i = 0;
  while (true) {
    const size_t comma = body.find(',', i);
    out.emplace_back(body.substr(i, comma == std::string_view::npos ? std::string_view::npos : comma - i));
    if (comma == std::string_view::npos) break;
    i = comma + 1;
  }
  return out;
}

}  // namespace

bool has_braces(std::string_view text) { return text.find('{') != std::string_view::npos || text.find('}') != std::string_view::npos; }

std::vector<std::string> expand_braces(std::string_view pattern, size_t limit) {
  // Groups do not nest: each '{' closes at the next '}'.
  std::vector<std::string> out{std::string()};
  size_t i = 0;
  while (i < pattern.size()) {
    const size_t open = pattern.find_first_of("{}", i);
    const std::string_view literal = pattern.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    for (auto& s : out) s += literal;
    if (open == std::string_view::npos) break;
    if (pattern[open] == '}') throw DatasetError(std::string(pattern) + ": a '}' without its '{'");
    const size_t close = pattern.find_first_of("{}", open + 1);
    if (close == std::string_view::npos || pattern[close] == '{')
      throw DatasetError(std::string(pattern) + ": a '{' without its '}' (groups do not nest)");
    const auto alternatives = brace_alternatives(pattern, pattern.substr(open + 1, close - open - 1), limit);
    if (out.size() * alternatives.size() > limit)
      throw DatasetError(std::string(pattern) + ": more than " + std::to_string(limit) + " names");
    std::vector<std::string> next;
    next.reserve(out.size() * alternatives.size());
    for (const auto& s : out)
      for (const auto& alt : alternatives) next.push_back(s + alt);
    out = std::move(next);
    i = close + 1;
  }
  return out;
}

std::string byte_range_text(uint64_t offset, uint64_t length) {
  return "bytes " + std::to_string(offset) + "-" + std::to_string(offset + (length ? length - 1 : 0));
}

std::vector<RemoteUrl> parse_list_file(std::string_view text, const RemoteUrl& list) {
  std::vector<RemoteUrl> out;
  std::set<std::string> seen;
  size_t line_no = 0, i = 0;
  while (i <= text.size()) {
    const size_t nl = std::min(text.find('\n', i), text.size());
    std::string_view line = text.substr(i, nl - i);
    i = nl + 1;
    ++line_no;
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    RemoteUrl u;
    try {
      u = list.sibling(line);
    } catch (const DatasetError& e) {
      throw DatasetError(list.redacted() + ": line " + std::to_string(line_no) + ": " + e.what());
    }
    if (!seen.insert(u.text()).second)
      throw DatasetError(list.redacted() + ": line " + std::to_string(line_no) + ": " + u.redacted() + " is listed twice");
    out.push_back(std::move(u));
  }
  if (out.empty()) throw DatasetError(list.redacted() + ": the list names no file (one name a line; '#' starts a comment)");
  return out;
}

}  // namespace pipeline::datasets::io
