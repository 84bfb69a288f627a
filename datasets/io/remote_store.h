// The remote stores (inside datasets/io only; others see store.h): what S3 and HTTPS share, in
// RemoteStore (a pool of connections, retries, ranged reads checked against the object's size and
// ETag, the fetcher and its cache behind open()), and what each protocol says for itself: how a
// file's URL and signature are made, how a directory is listed, and what a refusal means.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datasets/io/fetcher.h"
#include "datasets/io/http_client.h"
#include "datasets/io/retry.h"
#include "datasets/io/store.h"
#include "datasets/io/url.h"

namespace pipeline::datasets::io {

class RemoteStore : public Store {
 public:
  ~RemoteStore() override;
  bool remote() const override { return true; }
  std::unique_ptr<RangeFile> open(const ObjectInfo& info) override;
  void prefetch(std::vector<LaneUnits> lanes) override;
  void release(const UnitRef& unit) override;
  FetchStats fetch_stats() const override;
  void set_fetch_limits(int connections, int prefetch) override;

  /// Bytes [offset, offset + length) of `file`, retried and checked, to `out` in order.
  void download(const ObjectInfo& file, uint64_t offset, uint64_t length, const HttpClient::Sink& out);

 protected:
  RemoteStore(StoreOptions options, std::vector<std::string> secrets);

  /// The request that reads `uri` (URL, signature or token, redirects): the caller adds a range or
  /// HEAD.
  virtual HttpRequest request_for(const std::string& uri) const = 0;
  /// What a refusal means, naming the file and what to set ("access denied ...: set ...").
  virtual std::string explain(const std::string& uri, const HttpResponse& response) const = 0;
  /// Whether a refusal is worth another attempt (S3: SlowDown, RequestTimeout).
  virtual bool transient(const HttpResponse& response) const { return transient_status(response.status); }

  /// Runs `attempt` with a connection of the pool, retried (retry.h). Before the store has reached
  /// its server once, a failure to reach it at all is not retried: a wrong name, not an outage.
  void with_client(const std::string& what, const std::function<void(HttpClient&)>& attempt);
  /// One request's failure as an HttpError, its message cleaned of anything secret.
  [[noreturn]] void refuse(const std::string& uri, const HttpResponse& response) const;
  /// `text` with every secret this store holds replaced, and URLs' query strings redacted.
  std::string scrub(const std::string& text) const;
  /// Stops the fetch threads (transfers in progress are cut). A protocol's destructor calls it
  /// first: the threads call its request_for(), which must not outlive it.
  void stop_fetching();

  StoreOptions options_;
  HttpOptions http_;

 private:
  class Pool;
  Fetcher& fetcher();

  std::vector<std::string> secrets_;  // values that must never be printed (keys, tokens)
  std::atomic<bool> stopping_{false};
  Retrier retry_;
  std::atomic<bool> contacted_{false};
  std::unique_ptr<Pool> pool_;
  mutable FetchCounters counters_;
  mutable std::mutex fetcher_mu_;
  std::unique_ptr<Fetcher> fetcher_;  // made at the first open or plan: `pipeline check` makes no cache
};

/// The store of a remote source: S3 for s3://, HTTPS for https:// and hf:// (through HF_ENDPOINT),
/// http:// with allow_http (remote_module.h hands it to open_store).
std::unique_ptr<Store> open_remote_store(const std::string& source, const StoreOptions& options);

/// s3://BUCKET/PREFIX through S3's REST API (ListObjectsV2; HEAD; GET with a range), signed.
std::unique_ptr<Store> open_s3_store(const RemoteUrl& url, const StoreOptions& options);
/// https:// (and http://) files: no listing; names from a manifest, a list file or a brace pattern.
/// `hub`: where hf:// URLs point (HF_ENDPOINT).
std::unique_ptr<Store> open_http_store(const RemoteUrl& url, const StoreOptions& options, const HubEndpoint& hub);

}  // namespace pipeline::datasets::io
