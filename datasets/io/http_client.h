// One HTTP(S) connection's worth of requests, through libcurl: HEAD and GET with a byte range,
// redirects followed where asked (the Hub's resolve/ URLs redirect to their storage), S3's
// Signature V4 computed by libcurl (CURLOPT_AWS_SIGV4), a bearer token or ~/.netrc for HTTPS. One
// attempt per call: retrying is the caller's (retry.h), which this classifies failures for. A
// client keeps its connection open between requests, and is used by one thread at a time.
//
// Example:
//   io::HttpClient client({});
//   io::HttpRequest req{.url = "https://host/f.bin", .range_first = 0, .range_length = 16};
//   std::string bytes;
//   io::HttpResponse r = client.perform(req, [&](const char* p, size_t n) { bytes.append(p, n); return true; });
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "datasets/dataset_error.h"
#include "datasets/io/credentials.h"

namespace pipeline::datasets::io {

struct HttpOptions {
  double connect_timeout_s = 10;
  /// A transfer that moves no byte for this long has timed out (a stalled server).
  double stall_timeout_s = 30;
  int max_redirects = 8;
  /// A CA bundle to trust instead of the system's (SSL_CERT_FILE or CURL_CA_BUNDLE; tests'
  /// private CA); "" : the system's.
  std::string ca_file;
  /// Read ~/.netrc (or NETRC) for a user and password per host.
  bool netrc = true;
  /// Set: a transfer in progress stops (the store is closing).
  const std::atomic<bool>* cancel = nullptr;
};

/// What to sign an S3 request with.
struct Sigv4 {
  std::string region;
  std::string key_id;
  const Secret* secret = nullptr;
  const Secret* session_token = nullptr;
};

struct HttpRequest {
  std::string url;            // in full, with its query string: never printed as it is
  bool head = false;
  uint64_t range_first = 0;   // with range_length > 0: bytes [range_first, range_first + range_length)
  uint64_t range_length = 0;
  bool follow_redirects = false;
  std::vector<std::string> headers;  // "Name: value", none secret
  std::optional<Sigv4> sigv4;        // S3: sign the request
  const Secret* bearer = nullptr;    // HTTPS: Authorization: Bearer (never sent on to another host)
};

struct HttpResponse {
  long status = 0;
  std::string etag;           // quotes removed; "" when the server sent none
  std::string last_modified;
  std::optional<uint64_t> content_length;
  std::optional<uint64_t> range_start;  // from Content-Range: bytes START-END/TOTAL
  std::optional<uint64_t> range_total;
  std::string body;           // the body when no sink took it (errors, listings), at most 4 MiB
  std::string location;       // the final URL after redirects, as printed (query redacted)
  uint64_t sink_bytes = 0;    // body bytes handed to the sink
};

/// A request that got no usable answer. `transient`: worth another attempt (a timeout, a reset, a
/// refused connection, a body cut short, 408, 429, 5xx); `status` 0 when no response came.
struct HttpError : DatasetError {
  HttpError(const std::string& what, bool transient_, long status_, bool connection_ = false)
      : DatasetError(what), transient(transient_), status(status_), connection(connection_) {}
  bool transient;
  long status;
  bool connection;  // the server could not be reached at all (DNS, refused, TLS): said apart before training
};

class HttpClient {
 public:
  explicit HttpClient(HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// A 2xx response's headers, before its body: throws to refuse it (the transfer stops).
  using HeadersCheck = std::function<void(const HttpResponse&)>;
  /// A 2xx response's body, piece by piece: throws to stop the transfer.
  using Sink = std::function<void(const char*, size_t)>;

  /// One attempt. A 2xx response's headers go to `check`, then its body to `sink` (when given),
  /// any other body into HttpResponse::body. Returns every response that arrived whole, whatever
  /// its status (the caller judges it); throws HttpError when none did (the connection failed,
  /// the transfer stalled or broke off), or what `check` or `sink` threw. Messages name the URL
  /// redacted.
  HttpResponse perform(const HttpRequest& request, const Sink& sink = {}, const HeadersCheck& check = {});

 private:
  struct Impl;
  Impl* impl_;
};

/// Whether a status is worth another attempt: 408, 429 and 5xx (S3's SlowDown is a 503).
bool transient_status(long status);

}  // namespace pipeline::datasets::io
