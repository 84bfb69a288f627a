// What the remote stores share (remote_store.h): connections, retries, checked ranged reads, and
// the fetcher and cache behind their files.
#include "datasets/io/remote_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "datasets/dataset_error.h"
#include "datasets/io/url.h"

namespace pipeline::datasets::io {
namespace {

// The CA bundle a private server's certificate is checked against: SSL_CERT_FILE (OpenSSL's
// name for it), else CURL_CA_BUNDLE (curl's), else the system's.
std::string ca_file_of(const EnvLookup& env) {
  for (const char* name : {"SSL_CERT_FILE", "CURL_CA_BUNDLE"})
    if (auto v = env(name); v && !v->empty()) return *v;
  return {};
}

// A remote file: reads go through the store's fetcher (the cache, or the network on demand).
class RemoteFile : public RangeFile {
 public:
  RemoteFile(ObjectInfo info, Fetcher& fetcher) : info_(std::move(info)), name_(redact_urls(info_.uri)), fetcher_(fetcher) {}
  uint64_t size() const override { return info_.size; }
  const std::string& name() const override { return name_; }
  size_t read_at(uint64_t offset, void* out, size_t n) override {
    if (offset >= info_.size) return 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, info_.size - offset));
    fetcher_.read(info_, offset, out, n);
    return n;
  }

 private:
  ObjectInfo info_;
  std::string name_;
  Fetcher& fetcher_;
};

}  // namespace

// Connections kept open between requests, one per caller at a time.
class RemoteStore::Pool {
 public:
  explicit Pool(HttpOptions options) : options_(std::move(options)) {}
  std::unique_ptr<HttpClient> take() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!free_.empty()) {
        auto c = std::move(free_.back());
        free_.pop_back();
        return c;
      }
    }
    return std::make_unique<HttpClient>(options_);
  }
  void give(std::unique_ptr<HttpClient> c) {
    std::lock_guard<std::mutex> l(mu_);
    if (free_.size() < 64) free_.push_back(std::move(c));
  }

 private:
  HttpOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<HttpClient>> free_;
};

RemoteStore::RemoteStore(StoreOptions options, std::vector<std::string> secrets)
    : options_(std::move(options)),
      secrets_(std::move(secrets)),
      retry_({.retry_for_s = options_.retry_for_s}, &stopping_) {
  http_.stall_timeout_s = options_.stall_timeout_s;
  http_.ca_file = ca_file_of(options_.env);
  http_.cancel = &stopping_;
  secrets_.erase(std::remove_if(secrets_.begin(), secrets_.end(), [](const std::string& s) { return s.size() < 4; }),
                 secrets_.end());
  pool_ = std::make_unique<Pool>(http_);
}

RemoteStore::~RemoteStore() { stop_fetching(); }

void RemoteStore::stop_fetching() {
  stopping_ = true;
  std::lock_guard<std::mutex> l(fetcher_mu_);
  fetcher_.reset();
}

std::string RemoteStore::scrub(const std::string& text) const {
  std::string out = redact_urls(text);
  for (const auto& s : secrets_)
    for (size_t at = out.find(s); at != std::string::npos; at = out.find(s, at)) out.replace(at, s.size(), "<redacted>");
  return out;
}

void RemoteStore::refuse(const std::string& uri, const HttpResponse& response) const {
  throw HttpError(scrub(explain(uri, response)), transient(response), response.status);
}

void RemoteStore::with_client(const std::string& what, const std::function<void(HttpClient&)>& attempt) {
  try {
    retry_.run(
        what,
        [&] {
          auto client = pool_->take();
          counters_.in_flight.fetch_add(1, std::memory_order_relaxed);
          const auto start = std::chrono::steady_clock::now();
          auto done = [&] {
            counters_.in_flight.fetch_sub(1, std::memory_order_relaxed);
            counters_.requests.fetch_add(1, std::memory_order_relaxed);
            counters_.busy_ns.fetch_add(
                std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count(),
                std::memory_order_relaxed);
          };
          try {
            attempt(*client);
          } catch (...) {
            done();
            throw;  // a failed connection is not put back: the next attempt starts afresh
          }
          done();
          pool_->give(std::move(client));
          contacted_.store(true, std::memory_order_relaxed);
        },
        &counters_.retries, !contacted_.load(std::memory_order_relaxed));
  } catch (const DatasetError& e) {
    throw DatasetError(scrub(e.what()));
  }
}

void RemoteStore::download(const ObjectInfo& file, uint64_t offset, uint64_t length, const HttpClient::Sink& out) {
  const std::string printed = redact_urls(file.uri);
  uint64_t delivered = 0;  // bytes handed to `out` by earlier attempts: a retry goes on from there
  with_client(printed + " " + byte_range_text(offset, length), [&](HttpClient& client) {
    const uint64_t first = offset + delivered, want = length - delivered;
    HttpRequest req = request_for(file.uri);
    req.range_first = first;
    req.range_length = want;
    uint64_t got = 0;
    std::string held;  // this attempt's bytes: handed on only once the answer is known to be whole
    HttpResponse r = client.perform(
        req,
        [&](const char* p, size_t n) {
          if (got + n > want)
            throw HttpError(printed + ": " + byte_range_text(first, want) + ": the server sent more bytes than asked for", false, 200);
          held.append(p, n);
          got += n;
          // Long bodies go on in pieces; a cut that follows is retried from where they end.
          if (held.size() >= (4u << 20)) {
            out(held.data(), held.size());
            delivered += held.size();
            held.clear();
          }
        },
        [&](const HttpResponse& h) {
          // A 206, or a 200 with Content-Range (rclone answers ranges so); a 200 without one is
          // the whole file, which only a read of the whole file may take.
          if (h.range_start ? *h.range_start != first : !(first == 0 && want == file.size))
            throw HttpError(printed + ": " + byte_range_text(first, want) + ": the server " +
                                (h.range_start ? "answered another range (from byte " + std::to_string(*h.range_start) + ")"
                                               : "ignores range requests (HTTP 200 with the whole file)"),
                            false, h.status);
          if (h.range_total && *h.range_total != file.size)
            throw HttpError(printed + ": the object changed under the run: " + std::to_string(file.size) +
                                " bytes when listed, " + std::to_string(*h.range_total) + " now",
                            false, h.status);
          if (!file.version.empty() && !h.etag.empty() && h.etag != file.version)
            throw HttpError(printed + ": the object changed under the run: ETag " + file.version + " when listed, " +
                                h.etag + " now (a run never mixes two versions of a file)",
                            false, h.status);
        });
    if (r.status < 200 || r.status >= 300) refuse(file.uri, r);
    // A body cut short is never used: the bytes of this attempt past the last piece handed on
    // are dropped, and the next attempt asks for them again.
    if (got < want) {
      delivered += got - held.size();
      counters_.bytes.fetch_add(got - held.size(), std::memory_order_relaxed);
      throw HttpError(printed + ": " + byte_range_text(first, want) + ": the body was cut short (" + std::to_string(got) +
                          " of " + std::to_string(want) + " bytes)",
                      true, r.status);
    }
    out(held.data(), held.size());
    delivered += held.size();
    counters_.bytes.fetch_add(got, std::memory_order_relaxed);
  });
}

Fetcher& RemoteStore::fetcher() {
  std::lock_guard<std::mutex> l(fetcher_mu_);
  if (!fetcher_)
    fetcher_ = std::make_unique<Fetcher>(
        options_,
        [this](const ObjectInfo& f, uint64_t offset, uint64_t length, const HttpClient::Sink& out) {
          download(f, offset, length, out);
        },
        counters_);
  return *fetcher_;
}

std::unique_ptr<RangeFile> RemoteStore::open(const ObjectInfo& info) {
  return std::make_unique<RemoteFile>(info, fetcher());
}

void RemoteStore::prefetch(std::vector<LaneUnits> lanes) { fetcher().plan(std::move(lanes)); }

void RemoteStore::release(const UnitRef& unit) {
  std::lock_guard<std::mutex> l(fetcher_mu_);
  if (fetcher_) fetcher_->release(unit);
}

FetchStats RemoteStore::fetch_stats() const {
  FetchStats s;
  s.bytes = counters_.bytes.load(std::memory_order_relaxed);
  s.requests = counters_.requests.load(std::memory_order_relaxed);
  s.busy_s = static_cast<double>(counters_.busy_ns.load(std::memory_order_relaxed)) * 1e-9;
  s.in_flight = counters_.in_flight.load(std::memory_order_relaxed);
  s.retries = counters_.retries.load(std::memory_order_relaxed);
  s.units = counters_.units.load(std::memory_order_relaxed);
  s.hit_bytes = counters_.hit_bytes.load(std::memory_order_relaxed);
  s.miss_bytes = counters_.miss_bytes.load(std::memory_order_relaxed);
  s.wait_s = static_cast<double>(counters_.wait_ns.load(std::memory_order_relaxed)) * 1e-9;
  s.cache_cap = options_.cache_bytes;
  std::lock_guard<std::mutex> l(fetcher_mu_);
  s.connections = options_.connections;
  s.prefetch = options_.prefetch;
  if (fetcher_) {
    s.cache_bytes = fetcher_->cache().bytes();
    s.cache_high_water = fetcher_->cache().high_water();
    s.connections = fetcher_->connections();
    s.prefetch = fetcher_->prefetch();
  }
  return s;
}

void RemoteStore::set_fetch_limits(int connections, int prefetch) {
  std::lock_guard<std::mutex> l(fetcher_mu_);
  if (connections > 0) options_.connections = connections;
  if (prefetch > 0) options_.prefetch = prefetch;
  if (fetcher_) fetcher_->set_limits(connections, prefetch);
}

std::unique_ptr<Store> open_remote_store(const std::string& source, const StoreOptions& options) {
  HubEndpoint hub;
  if (auto e = options.env("HF_ENDPOINT"); e && !e->empty()) hub.url = *e;
  const RemoteUrl url = parse_remote_url(source, hub);
  if (url.scheme == "s3") return open_s3_store(url, options);
  return open_http_store(url, options, hub);
}

}  // namespace pipeline::datasets::io
