// Where a remote store's settings and secrets come from, resolved once when a store opens: for S3
// the endpoint, region and keys from [data] (endpoint, region, profile), the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL,
// AWS_PROFILE, ...) and the AWS files (~/.aws/credentials, ~/.aws/config, read with GLib's key-file
// parser); for HTTPS a bearer token for the Hugging Face Hub (HF_TOKEN). Keys never come from the
// config, and a Secret never prints: the stores hand it to the network library and nowhere else.
//
// Example:
//   io::S3Access a = io::resolve_s3_access({.profile = "minio"}, io::process_env());
//   a.describe()  // "endpoint http://127.0.0.1:9000 ([data] endpoint), region us-east-1 (the default),
//                 //  keys from profile 'minio' in /home/me/.aws/credentials"
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace pipeline::datasets::io {

/// A key or token. It has no output operator and no conversion: only reveal() gives the value, for
/// the request that needs it.
class Secret {
 public:
  Secret() = default;
  explicit Secret(std::string value) : value_(std::move(value)) {}
  bool empty() const { return value_.empty(); }
  const std::string& reveal() const { return value_; }

 private:
  std::string value_;
};

/// Environment lookups: the process's (local_store.cpp, beside open_store), or a map in tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

/// What a config says about S3 ([data] endpoint, region, profile); empty: not said.
struct S3Settings {
  std::string endpoint = {};  // scheme://host[:port] of an S3-compatible server (MinIO, R2, rclone)
  std::string region = {};
  std::string profile = {};
};

/// How to reach S3 and sign for it.
struct S3Access {
  std::string endpoint;          // scheme://host[:port], no trailing '/'
  std::string region = "us-east-1";
  bool path_style = false;       // https://ENDPOINT/BUCKET/KEY (a custom endpoint), else BUCKET.ENDPOINT/KEY
  std::string key_id;            // "" : no credentials found, requests go unsigned (public buckets)
  Secret secret, session_token;
  // Where each came from, for `pipeline check` and errors: "[data] endpoint", "AWS_REGION", ...
  std::string endpoint_from, region_from, keys_from;

  /// One line for the log and `pipeline check`: endpoint, region and where the keys came from,
  /// never a key.
  std::string describe() const;
};

/// Resolves S3's settings. Order, first found wins: [data] keys, then the environment
/// (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; AWS_REGION, AWS_DEFAULT_REGION; AWS_ACCESS_KEY_ID with
/// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, unless [data] profile names one), then the profile ([data] profile, else AWS_PROFILE,
/// else "default") in AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials) and AWS_CONFIG_FILE
/// (default ~/.aws/config: region, endpoint_url, and keys too). Throws DatasetError, naming the
/// file and line and never a value, for a file that does not parse, a profile named but found in
/// neither file, a key id without its secret, or an endpoint that is not an http(s) URL.
S3Access resolve_s3_access(const S3Settings& settings, const EnvLookup& env);

/// The bearer token to send to `host` (host[:port]): HF_TOKEN for the Hub (huggingface.co, or
/// HF_ENDPOINT's host), else none. Other servers take ~/.netrc through the network library.
Secret http_token_for(const std::string& host, const EnvLookup& env);

}  // namespace pipeline::datasets::io
