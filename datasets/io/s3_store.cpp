// S3 and what speaks its protocol (MinIO, Ceph, R2, rclone serve s3): objects read by ranged GETs
// signed with Signature V4 (by libcurl), listed with ListObjectsV2, whose XML tinyxml2 reads. A
// custom endpoint is addressed path-style (ENDPOINT/BUCKET/KEY), as MinIO and rclone need; AWS's
// own virtual-hosted (BUCKET.s3.REGION.amazonaws.com/KEY).
#include <curl/curl.h>
#include <tinyxml2.h>

#include <algorithm>

#include "datasets/dataset_error.h"
#include "datasets/io/credentials.h"
#include "datasets/io/remote_store.h"

namespace pipeline::datasets::io {
namespace {

// S3's URI encoding: every byte but A-Z a-z 0-9 - _ . ~ percent-encoded, '/' kept between the
// segments of a key. The signature is computed over this same path.
std::string encode_key(const std::string& key) {
  std::string out;
  static const char* hex = "0123456789ABCDEF";
  for (unsigned char c : key) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string encode_value(const std::string& v) {
  std::string out = encode_key(v);
  std::string slash;
  for (char c : out) slash += c == '/' ? std::string("%2F") : std::string(1, c);
  return slash;
}

std::string text_of(const tinyxml2::XMLElement* parent, const char* name) {
  const tinyxml2::XMLElement* e = parent ? parent->FirstChildElement(name) : nullptr;
  return e && e->GetText() ? e->GetText() : "";
}

// S3's error body: <Error><Code>..</Code><Message>..</Message>...</Error>.
struct S3Error {
  std::string code, message, region, endpoint;
};

S3Error parse_error(const std::string& body) {
  S3Error e;
  tinyxml2::XMLDocument doc;
  if (body.empty() || doc.Parse(body.data(), body.size()) != tinyxml2::XML_SUCCESS) return e;
  const tinyxml2::XMLElement* root = doc.FirstChildElement("Error");
  e.code = text_of(root, "Code");
  e.message = text_of(root, "Message");
  e.region = text_of(root, "Region");
  e.endpoint = text_of(root, "Endpoint");
  return e;
}

bool hidden_key(const std::string& key) {
  // As a local store leaves out names starting with '.', so does a bucket (a writer's temporary
  // objects, rclone's and MinIO's own).
  size_t i = 0;
  while (i < key.size()) {
    if (key[i] == '.') return true;
    const size_t slash = key.find('/', i);
    if (slash == std::string::npos) break;
    i = slash + 1;
  }
  return false;
}

class S3Store : public RemoteStore {
 public:
  S3Store(const RemoteUrl& url, const StoreOptions& options, S3Access access)
      : RemoteStore(options, {access.secret.reveal(), access.session_token.reveal()}),
        access_(std::move(access)),
        bucket_(url.host) {}

  ~S3Store() override { stop_fetching(); }

  std::string describe() const override { return "S3 bucket " + bucket_ + ": " + access_.describe(); }

  std::vector<ObjectInfo> list(const std::string& prefix) override {
    const RemoteUrl u = parse_remote_url(prefix);
    check_bucket(u);
    std::string key_prefix = u.path;
    if (!key_prefix.empty() && key_prefix.back() != '/') key_prefix += '/';
    std::vector<ObjectInfo> out;
    std::string token;
    do {
      std::string query;  // sorted by name, as the signature's canonical query wants
      if (!token.empty()) query += "continuation-token=" + encode_value(token) + "&";
      query += "list-type=2&prefix=" + encode_value(key_prefix);
      HttpRequest req = bucket_request();
      req.url += "?" + query;
      std::string next;
      with_client(prefix + ": listing", [&](HttpClient& client) {
        HttpResponse r = client.perform(req);
        if (r.status != 200) refuse(prefix, r);
        next = parse_listing(prefix, r.body, out);
      });
      token = next;
    } while (!token.empty());
    if (out.empty() && !u.path.empty() && u.path.back() != '/') {
      // Not a folder: an object of that name lists as itself.
      out.push_back(stat(prefix));
      return out;
    }
    if (out.empty())
      throw DatasetError(prefix + ": no objects under this prefix in bucket " + bucket_ + " (" + access_.endpoint + ")");
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
    return out;
  }

  ObjectInfo stat(const std::string& uri) override {
    const RemoteUrl u = parse_remote_url(uri);
    check_bucket(u);
    if (u.path.empty()) throw DatasetError(uri + ": names a bucket, not an object");
    ObjectInfo info{uri, 0, ""};
    with_client(uri, [&](HttpClient& client) {
      HttpRequest req = request_for(uri);
      req.head = true;
      HttpResponse r = client.perform(req);
      if (r.status >= 300 || r.status < 200) {
        // A HEAD's refusal has no body to say why: ask again for one byte, whose refusal does.
        req.head = false;
        req.range_length = 1;
        HttpResponse g = client.perform(req);
        refuse(uri, g.status >= 300 || g.status < 200 ? g : r);
      }
      if (!r.content_length) throw HttpError(uri + ": the server gave no size (Content-Length)", false, r.status);
      info.size = *r.content_length;
      info.version = r.etag;
    });
    return info;
  }

 protected:
  HttpRequest request_for(const std::string& uri) const override {
    const RemoteUrl u = parse_remote_url(uri);
    HttpRequest req = bucket_request();
    req.url += "/" + encode_key(u.path);
    return req;
  }

  std::string explain(const std::string& uri, const HttpResponse& r) const override {
    const S3Error e = parse_error(r.body);
    const std::string said = e.code.empty() ? "" : " " + e.code + (e.message.empty() ? "" : ": " + e.message);
    const std::string head = uri + ": HTTP " + std::to_string(r.status) + said;
    if (e.code == "NoSuchBucket")
      return head + " (no bucket '" + bucket_ + "' at " + access_.endpoint + ": check the URL, and [data] endpoint or "
                    "AWS_ENDPOINT_URL for an S3-compatible server)";
    if (r.status == 404) return head + " (no such object)";
    if (r.status == 301 || e.code == "PermanentRedirect" || e.code == "AuthorizationHeaderMalformed" ||
        e.code == "IllegalLocationConstraintException")
      return head + " (the bucket is in " + (e.region.empty() ? std::string("another region") : "region " + e.region) +
             ": set [data] region or AWS_REGION; now " + access_.region + " from " + access_.region_from + ")";
    if (r.status == 401 || r.status == 403)
      return head + " (access denied; keys " +
             (access_.key_id.empty() ? std::string("none found: requests went unsigned")
                                     : "from " + access_.keys_from) +
             ": set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile ([data] profile or AWS_PROFILE) in "
             "~/.aws/credentials, with read access to the bucket)";
    return head;
  }

  bool transient(const HttpResponse& r) const override {
    if (transient_status(r.status)) return true;
    const std::string code = parse_error(r.body).code;
    return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" || code == "ServiceUnavailable";
  }

 private:
  // Virtual-hosted addressing puts the bucket in the host name, where a '.' in it breaks TLS.
  bool virtual_host_ok() const { return bucket_.find('.') == std::string::npos; }

  HttpRequest bucket_request() const {
    HttpRequest req;
    if (access_.path_style || !virtual_host_ok()) {
      req.url = access_.endpoint + "/" + bucket_;
    } else {
      const size_t at = access_.endpoint.find("://") + 3;
      req.url = access_.endpoint.substr(0, at) + bucket_ + "." + access_.endpoint.substr(at);
    }
    if (!access_.key_id.empty())
      req.sigv4 = Sigv4{access_.region, access_.key_id, &access_.secret, &access_.session_token};
    return req;
  }

  void check_bucket(const RemoteUrl& u) const {
    if (u.scheme != "s3" || u.host != bucket_)
      throw DatasetError(u.redacted() + ": not in this store's bucket (s3://" + bucket_ + ")");
  }

  // One page of ListObjectsV2 into `out`; returns the continuation token ("" : the last page).
  std::string parse_listing(const std::string& prefix, const std::string& body, std::vector<ObjectInfo>& out) const {
    tinyxml2::XMLDocument doc;
    if (doc.Parse(body.data(), body.size()) != tinyxml2::XML_SUCCESS)
      throw DatasetError(prefix + ": the listing is not XML (" + std::string(doc.ErrorStr()) + ")");
    const tinyxml2::XMLElement* root = doc.FirstChildElement("ListBucketResult");
    if (!root) throw DatasetError(prefix + ": the listing has no ListBucketResult");
    for (const auto* c = root->FirstChildElement("Contents"); c; c = c->NextSiblingElement("Contents")) {
      const std::string key = text_of(c, "Key");
      const std::string size = text_of(c, "Size");
      if (key.empty() || size.empty() || size.size() > 19 || !std::all_of(size.begin(), size.end(), ::isdigit))
        throw DatasetError(prefix + ": a listing entry without a key or size");
      if (key.back() == '/' || hidden_key(key)) continue;  // folder markers, hidden names
      std::string etag = text_of(c, "ETag");
      if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
      out.push_back({"s3://" + bucket_ + "/" + key, std::stoull(size), etag});
    }
    if (text_of(root, "IsTruncated") != "true") return {};
    const std::string next = text_of(root, "NextContinuationToken");
    if (next.empty()) throw DatasetError(prefix + ": a truncated listing without NextContinuationToken");
    return next;
  }

  S3Access access_;
  std::string bucket_;
};

}  // namespace

std::unique_ptr<Store> open_s3_store(const RemoteUrl& url, const StoreOptions& options) {
  S3Access access = resolve_s3_access({options.endpoint, options.region, options.profile}, options.env);
  if (access.endpoint.rfind("http://", 0) == 0 && !options.allow_http)
    throw DatasetError(url.redacted() + ": the S3 endpoint " + access.endpoint + " (" + access.endpoint_from +
                       ") is plain HTTP, without TLS: set [data] allow_http = true to use it anyway");
  return std::make_unique<S3Store>(url, options, std::move(access));
}

}  // namespace pipeline::datasets::io
