// Retries with backoff and full jitter (retry.h).
#include "datasets/io/retry.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "datasets/io/http_client.h"

namespace pipeline::datasets::io {

void Retrier::run(const std::string& what, const std::function<void()>& attempt, std::atomic<uint64_t>* retries,
                  bool connections_fatal) const {
  using clock = std::chrono::steady_clock;
  std::minstd_rand rng(std::random_device{}());
  clock::time_point first_failure{};
  int attempts = 0;
  while (true) {
    ++attempts;
    try {
      attempt();
      return;
    } catch (const HttpError& e) {
      if (!e.transient || (connections_fatal && e.connection)) throw;
      const auto now = clock::now();
      if (attempts == 1) first_failure = now;
      const double failing_s = std::chrono::duration<double>(now - first_failure).count();
      if (failing_s >= options_.retry_for_s) {
        char span[32];
        std::snprintf(span, sizeof span, "%.0f", failing_s);
        throw DatasetError(std::string(e.what()) + " (" + what + ": gave up after " + std::to_string(attempts) +
                           " attempts over " + span + " s; [stages.fetch] retry_for = " +
                           std::to_string(static_cast<int64_t>(options_.retry_for_s)) + " s)");
      }
      // Full jitter: a wait drawn from [0, bound], the bound doubling, so that many readers that
      // failed together do not come back together.
      const double bound = std::min(options_.max_backoff_s, options_.first_backoff_s * std::pow(2.0, std::min(attempts - 1, 20)));
      const double left = options_.retry_for_s - failing_s;
      const double wait = std::min(left, std::uniform_real_distribution<double>(0, bound)(rng));
      if (retries) retries->fetch_add(1, std::memory_order_relaxed);
      const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(wait));
      while (clock::now() < until) {
        if (cancel_ && cancel_->load(std::memory_order_relaxed))
          throw DatasetError(std::string(e.what()) + " (" + what + ": stopped while waiting to try again)");
        std::this_thread::sleep_for(std::min<clock::duration>(until - clock::now(), std::chrono::milliseconds(20)));
      }
    }
  }
}

}  // namespace pipeline::datasets::io
