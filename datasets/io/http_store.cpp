// Files behind HTTPS (and http:// with [data] allow_http): read by ranged GETs, redirects followed
// (the Hub's resolve/ URLs redirect to its storage), a 200 with Content-Range taken as a 206.
// HTTP has no listing, so a source names its files one of three ways (docs/remote.md):
//   - a brace pattern of known names: https://host/d/train_{000000..000099}.bin
//   - a list file, a URL ending in .txt: one name a line, relative to the list's folder
//   - a folder holding a prepared dataset: its manifest.json (which names the shards)
// and a single file's URL lists as itself.
#include <algorithm>

#include "datasets/dataset_error.h"
#include "datasets/io/credentials.h"
#include "datasets/io/remote_store.h"

namespace pipeline::datasets::io {
namespace {

class HttpStore : public RemoteStore {
 public:
  HttpStore(const RemoteUrl& url, const StoreOptions& options, HubEndpoint hub, Secret token)
      : RemoteStore(options, {token.reveal()}), host_(url.host), scheme_(url.scheme), hub_(std::move(hub)), token_(std::move(token)) {}

  ~HttpStore() override { stop_fetching(); }

  std::string describe() const override {
    return scheme_ + "://" + host_ + (token_.empty() ? "" : " (HF_TOKEN sent)") + ", files named by a manifest, a list file or a brace pattern";
  }

  std::vector<ObjectInfo> list(const std::string& prefix) override {
    const RemoteUrl u = parse_remote_url(prefix, hub_);
    std::vector<ObjectInfo> out;
    if (has_braces(u.path)) {
      for (const auto& name : expand_braces(u.path)) {
        RemoteUrl one = u;
        one.path = name;
        out.push_back(stat(one.text()));
      }
    } else if (u.path.ends_with(".txt")) {
      const ObjectInfo list_file = stat(prefix);
      std::string text;
      download(list_file, 0, list_file.size, [&](const char* p, size_t n) { text.append(p, n); });
      for (const auto& name : parse_list_file(text, u)) out.push_back(stat(name.text()));
    } else {
      // A file lists as itself; a folder by its manifest.
      const bool folder = u.path.back() == '/';
      if (!folder) {
        if (auto one = try_stat(prefix)) return {*one};
      }
      RemoteUrl manifest = u;
      manifest.path = (folder ? u.path : u.path + "/") + "manifest.json";
      manifest.query.clear();
      auto m = try_stat(manifest.text());
      if (!m)
        throw DatasetError(u.redacted() + ": HTTP cannot list a folder: name its files with a brace pattern "
                           "(https://host/d/train_{000000..000099}.bin), a list file (a URL ending in .txt, one name "
                           "a line), or point at a prepared dataset's folder, whose manifest.json names them "
                           "(none at " + manifest.redacted() + ")");
      out.push_back(*m);
    }
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
    return out;
  }

  ObjectInfo stat(const std::string& uri) override {
    auto info = try_stat(uri, true);
    return *info;
  }

 protected:
  HttpRequest request_for(const std::string& uri) const override {
    const RemoteUrl u = parse_remote_url(uri, hub_);
    if (u.host != host_ || u.scheme != scheme_)
      throw DatasetError(u.redacted() + ": not on this store's server (" + scheme_ + "://" + host_ + ")");
    HttpRequest req;
    req.url = u.text();
    req.follow_redirects = true;
    req.bearer = &token_;
    return req;
  }

  std::string explain(const std::string& uri, const HttpResponse& r) const override {
    std::string head = redact_urls(uri) + ": HTTP " + std::to_string(r.status);
    if (!r.location.empty() && r.location != redact_urls(uri)) head += " (redirected to " + r.location + ")";
    if (r.status == 404 || r.status == 410) return head + " (not found)";
    if (r.status == 401 || r.status == 403)
      return head + " (access denied: for the Hugging Face Hub set HF_TOKEN" +
             std::string(token_.empty() ? "" : " (sent: it does not grant this file)") +
             "; for another server, put its user and password in ~/.netrc, machine " + host_.substr(0, host_.find(':')) + ")";
    if (r.status == 416) return head + " (the range is past the file's end: it changed under the run)";
    return head;
  }

 private:
  // The file's size and version; nullopt for a 404 unless `must`.
  std::optional<ObjectInfo> try_stat(const std::string& uri, bool must = false) {
    std::optional<ObjectInfo> info;
    with_client(redact_urls(uri), [&](HttpClient& client) {
      HttpRequest req = request_for(uri);
      req.head = true;
      HttpResponse r = client.perform(req);
      // Not there, or a folder (a server redirects a folder's name to its name with a '/').
      const bool folder = r.location.ends_with("/") && !uri.ends_with("/");
      if ((r.status == 404 || r.status == 410 || (folder && r.status == 403)) && !must) return;
      if (r.status < 200 || r.status >= 300) refuse(uri, r);
      if (!r.content_length)
        throw HttpError(redact_urls(uri) + ": the server gave no size (Content-Length): it cannot be read by ranges", false,
                        r.status);
      // The ETag tells versions apart; without one, the modification time and size stand in.
      std::string version = r.etag;
      if (version.empty() && !r.last_modified.empty()) version = "modified " + r.last_modified;
      info = ObjectInfo{uri, *r.content_length, version};
    });
    return info;
  }

  std::string host_, scheme_;
  HubEndpoint hub_;
  Secret token_;
};

}  // namespace

std::unique_ptr<Store> open_http_store(const RemoteUrl& url, const StoreOptions& options, const HubEndpoint& hub) {
  if (url.scheme == "http" && !options.allow_http)
    throw DatasetError(url.redacted() + ": plain HTTP, without TLS (the data, and any token, in clear): set [data] "
                       "allow_http = true to read it anyway, or use https://");
  if (!url.query.empty())
    throw DatasetError(url.redacted() + ": a query string in a source's URL (a presigned URL's signature, a token) is a "
                       "credential, and the config is written into the run directory: use HF_TOKEN for the Hub, "
                       "~/.netrc for another server, or an s3:// URL with the AWS credentials");
  return std::make_unique<HttpStore>(url, options, hub, http_token_for(url.host, options.env));
}

}  // namespace pipeline::datasets::io
