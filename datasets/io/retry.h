// Another attempt after a passing fault: a request that timed out, was reset, was cut short or got
// 408 / 429 / 5xx (S3's SlowDown) is tried again after a backoff with full jitter (a random wait up
// to a doubling bound), for up to `retry_for_s` from its first failure. Then, or at once for a
// fault that another attempt cannot mend (403, 404, a changed object), it throws a DatasetError
// naming the URL (redacted), the last status and the attempts. The wait can be cut short.
//
// Example:
//   io::Retrier retry({.retry_for_s = 300});
//   retry.run("s3://bucket/key bytes 0-65535", [&] { read_once(); }, &stats.retries);
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace pipeline::datasets::io {

struct RetryOptions {
  double retry_for_s = 300;     // give up this long after the first failure
  double first_backoff_s = 0.2;  // the first wait's bound; it doubles with each attempt
  double max_backoff_s = 10;     // ... up to this
};

class Retrier {
 public:
  explicit Retrier(RetryOptions options, const std::atomic<bool>* cancel = nullptr)
      : options_(options), cancel_(cancel) {}
  /// Runs `attempt` until it returns. An HttpError marked transient is retried (each retry counted
  /// in `*retries` when given, and told to `on_retry`); with `connections_fatal`, a failure to
  /// reach the server at all (DNS, refused, TLS) is not: before training such a failure is a
  /// wrong setting, not an outage. Throws DatasetError naming `what` when it gives up, or when
  /// cancelled while it waits.
  void run(const std::string& what, const std::function<void()>& attempt, std::atomic<uint64_t>* retries = nullptr,
           bool connections_fatal = false) const;

 private:
  RetryOptions options_;
  const std::atomic<bool>* cancel_;
};

}  // namespace pipeline::datasets::io
