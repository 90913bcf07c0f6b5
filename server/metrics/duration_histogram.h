// Prometheus histograms of durations that requests record without a lock.
//
// prometheus-cpp's Histogram::Observe takes a mutex per series, and a
// request records three observations in series that every request of its
// model shares: on many cores they serialize. Here a series is a fixed array
// of atomic counters, and the sum is kept in whole nanoseconds, so Observe
// is a few relaxed atomic adds and exact. A scrape reads the counters one by
// one: a request recorded while it reads may show in some counters and not
// yet in others, which Prometheus's rate() over scrapes does not notice.
#ifndef PRECOMPILE_SERVER_METRICS_DURATION_HISTOGRAM_H_
#define PRECOMPILE_SERVER_METRICS_DURATION_HISTOGRAM_H_

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace precompile::server {

// One labelled series. Thread safety: Observe and Collect may run
// concurrently from any threads.
class DurationHistogram {
 public:
  // `upper_bounds` ascending, each a bucket's inclusive upper bound; a last
  // bucket without bound (+Inf) is implied. It must outlive the histogram.
  explicit DurationHistogram(const std::vector<absl::Duration>& upper_bounds);

  void Observe(absl::Duration d);
  // Cumulative buckets, count and sum (seconds), as Prometheus exposes them.
  prometheus::ClientMetric::Histogram Collect() const;

 private:
  const std::vector<absl::Duration>& upper_bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // Per bucket, +Inf last.
  std::atomic<int64_t> sum_ns_{0};
};

// A histogram metric: one name, its series by labels, collected by
// ServerMetrics, which serves it beside its Registry.
class DurationHistogramFamily final : public prometheus::Collectable {
 public:
  DurationHistogramFamily(std::string name, std::string help,
                          std::vector<absl::Duration> upper_bounds);

  // The series with `labels`, created if there is none. It stays valid until
  // Remove.
  DurationHistogram& Add(const prometheus::Labels& labels) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(const DurationHistogram* series) ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<prometheus::MetricFamily> Collect() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<absl::Duration> upper_bounds_;
  // Taken by Add, Remove and Collect, never by Observe.
  mutable std::mutex mu_;
  std::map<prometheus::Labels, std::unique_ptr<DurationHistogram>> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_METRICS_DURATION_HISTOGRAM_H_
