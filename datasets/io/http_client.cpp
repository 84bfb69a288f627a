// HTTP(S) requests through libcurl (http_client.h). libcurl does the protocol: TLS, redirects,
// keep-alive, chunked bodies, and S3's Signature V4 (CURLOPT_AWS_SIGV4, since 7.75; Debian 12 has
// 7.88). This file sets a request up, sorts the response's headers out, and classifies failures.
#include "datasets/io/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "datasets/io/url.h"

namespace pipeline::datasets::io {
namespace {

constexpr size_t kMaxBody = 4u << 20;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::optional<uint64_t> number(std::string_view s) {
  if (s.empty() || s.size() > 19 || !std::all_of(s.begin(), s.end(), ::isdigit)) return std::nullopt;
  return std::stoull(std::string(s));
}

// The state of one transfer, seen by libcurl's callbacks.
struct Transfer {
  HttpResponse response;
  const HttpClient::Sink* sink = nullptr;
  const HttpClient::HeadersCheck* check = nullptr;
  bool checked = false;
  std::exception_ptr error;  // what the check or the sink threw: libcurl is C, nothing may unwind through it
  bool body_too_long = false;
};

bool ok_status(long status) { return status >= 200 && status < 300; }

// The check runs once, at a 2xx response's first body byte (or at its end when it has none).
bool run_check(Transfer* t) {
  if (t->checked || !ok_status(t->response.status)) return true;
  t->checked = true;
  if (t->check && *t->check) {
    try {
      (*t->check)(t->response);
    } catch (...) {
      t->error = std::current_exception();
      return false;
    }
  }
  return true;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  const std::string_view line(data, n);
  if (line.substr(0, 5) == "HTTP/") {
    // A new response (after a redirect, or a 100 Continue): what came before does not count.
    t->response = HttpResponse{};
    const size_t sp = line.find(' ');
    if (sp != std::string_view::npos) t->response.status = std::atol(std::string(line.substr(sp + 1, 3)).c_str());
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  const std::string name = lower(std::string(line.substr(0, colon)));
  const std::string value = trim(line.substr(colon + 1));
  if (name == "etag") {
    std::string e = value;
    if (e.rfind("W/", 0) == 0) e = e.substr(2);
    if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
    t->response.etag = e;
  } else if (name == "last-modified") {
    t->response.last_modified = value;
  } else if (name == "content-length") {
    t->response.content_length = number(value);
  } else if (name == "content-range") {
    // bytes START-END/TOTAL
    const std::string_view v(value);
    const size_t sp = v.find(' '), dash = v.find('-'), slash = v.find('/');
    if (v.substr(0, 6) == "bytes " && dash != std::string_view::npos && slash != std::string_view::npos && dash < slash) {
      t->response.range_start = number(v.substr(sp + 1, dash - sp - 1));
      t->response.range_total = number(v.substr(slash + 1));
    }
  }
  return n;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (ok_status(t->response.status) && t->sink && *t->sink) {
    if (!run_check(t)) return 0;  // CURLE_WRITE_ERROR
    try {
      (*t->sink)(data, n);
    } catch (...) {
      t->error = std::current_exception();
      return 0;
    }
    t->response.sink_bytes += n;
    return n;
  }
  if (t->response.body.size() + n > kMaxBody) {
    t->body_too_long = true;
    return 0;
  }
  t->response.body.append(data, n);
  return n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancel = static_cast<const std::atomic<bool>*>(user);
  return cancel && cancel->load(std::memory_order_relaxed) ? 1 : 0;  // non-zero: CURLE_ABORTED_BY_CALLBACK
}

struct SList {
  curl_slist* list = nullptr;
  ~SList() { curl_slist_free_all(list); }
  void add(const std::string& s) {
    curl_slist* next = curl_slist_append(list, s.c_str());
    if (!next) throw std::bad_alloc();
    list = next;
  }
};

// Failures of the connection itself, before any answer: named apart, since before training they
// mean a wrong name, address or certificate rather than a passing fault.
bool connection_failure(CURLcode c) {
  return c == CURLE_COULDNT_RESOLVE_HOST || c == CURLE_COULDNT_RESOLVE_PROXY || c == CURLE_COULDNT_CONNECT ||
         c == CURLE_PEER_FAILED_VERIFICATION || c == CURLE_SSL_CACERT_BADFILE || c == CURLE_SSL_CERTPROBLEM ||
         c == CURLE_SSL_CONNECT_ERROR || c == CURLE_UNSUPPORTED_PROTOCOL;
}

bool transient_code(CURLcode c) {
  switch (c) {
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:  // after the first contact: the name service flapped
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
      return true;
    default:
      return false;
  }
}

std::string what_to_set(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
      return " (the host name does not resolve: check the URL, or [data] endpoint / AWS_ENDPOINT_URL)";
    case CURLE_COULDNT_CONNECT:
      return " (nothing answers at that address and port: check the URL, or [data] endpoint / AWS_ENDPOINT_URL)";
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
      return " (the server's TLS certificate is not trusted: for a private CA, set SSL_CERT_FILE to its PEM file)";
    default:
      return "";
  }
}

}  // namespace

bool transient_status(long status) { return status == 408 || status == 429 || (status >= 500 && status <= 599); }

struct HttpClient::Impl {
  HttpOptions options;
  CURL* curl = nullptr;
  char error[CURL_ERROR_SIZE] = {};
};

HttpClient::HttpClient(HttpOptions options) : impl_(new Impl{std::move(options)}) {
  // curl_easy_init initialises libcurl's globals on first use (thread-safe since 7.84).
  impl_->curl = curl_easy_init();
  if (!impl_->curl) {
    delete impl_;
    throw DatasetError("libcurl: cannot start a session (out of memory?)");
  }
}

HttpClient::~HttpClient() {
  curl_easy_cleanup(impl_->curl);
  delete impl_;
}

HttpResponse HttpClient::perform(const HttpRequest& request, const Sink& sink, const HeadersCheck& check) {
  CURL* c = impl_->curl;
  const HttpOptions& o = impl_->options;
  curl_easy_reset(c);  // keeps the open connection and the DNS and TLS session caches
  const std::string printed = redact_urls(request.url);
  Transfer t;
  t.sink = &sink;
  t.check = &check;
  SList headers;
  for (const auto& h : request.headers) headers.add(h);

  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, impl_->error);
  impl_->error[0] = 0;
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "https,http");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout_s * 1000));
  // A transfer slower than 1 byte/s for stall_timeout_s seconds is a stalled one.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(o.stall_timeout_s)));
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "pipeline");
  if (o.cancel) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, o.cancel);
  }
  if (!o.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o.ca_file.c_str());
  if (o.netrc && !request.sigv4 && !request.bearer) curl_easy_setopt(c, CURLOPT_NETRC, static_cast<long>(CURL_NETRC_OPTIONAL));
  if (request.head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  std::string range;
  if (request.range_length > 0) {
    range = std::to_string(request.range_first) + "-" + std::to_string(request.range_first + request.range_length - 1);
    curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  }
  if (request.follow_redirects) {
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, static_cast<long>(o.max_redirects));
    // libcurl sends neither the Authorization header nor a netrc password on to another host.
  }
  std::string sigv4_provider;
  if (request.sigv4) {
    const Sigv4& s = *request.sigv4;
    if (!s.key_id.empty() && s.secret) {
      sigv4_provider = "aws:amz:" + s.region + ":s3";
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_provider.c_str());
      curl_easy_setopt(c, CURLOPT_USERNAME, s.key_id.c_str());
      curl_easy_setopt(c, CURLOPT_PASSWORD, s.secret->reveal().c_str());
      // S3 wants the payload's hash named; a GET or HEAD has none to sign.
      headers.add("x-amz-content-sha256: UNSIGNED-PAYLOAD");
      if (s.session_token && !s.session_token->empty()) headers.add("x-amz-security-token: " + s.session_token->reveal());
    }
  } else if (request.bearer && !request.bearer->empty()) {
    headers.add("Authorization: Bearer " + request.bearer->reveal());
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.list);

  const CURLcode code = curl_easy_perform(c);
  char* effective = nullptr;
  if (curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective)
    t.response.location = redact_urls(effective);
  // The sensitive strings libcurl copied stay in its handle until the next reset; clear them now.
  curl_easy_setopt(c, CURLOPT_PASSWORD, "");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);

  if (t.error) std::rethrow_exception(t.error);
  if (code == CURLE_OK) {
    if (!run_check(&t)) std::rethrow_exception(t.error);
    return std::move(t.response);
  }
  if (t.body_too_long)
    throw HttpError(printed + ": HTTP " + std::to_string(t.response.status) + " with a body over 4 MiB", false,
                    t.response.status);
  std::string why = impl_->error[0] ? std::string(impl_->error) : std::string(curl_easy_strerror(code));
  const bool transient = transient_code(code);
  throw HttpError(printed + ": " + redact_urls(why) + what_to_set(code), transient, 0, connection_failure(code));
}

}  // namespace pipeline::datasets::io
