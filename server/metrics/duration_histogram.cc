#include "server/metrics/duration_histogram.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace precompile::server {

DurationHistogram::DurationHistogram(const std::vector<absl::Duration>& upper_bounds)
    : upper_bounds_(upper_bounds),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(upper_bounds.size() + 1)) {}

void DurationHistogram::Observe(absl::Duration d) {
  // The first bucket whose bound holds d; past the last bound, +Inf.
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), d) - upper_bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_relaxed);
}

prometheus::ClientMetric::Histogram DurationHistogram::Collect() const {
  prometheus::ClientMetric::Histogram h;
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    h.bucket.push_back({cumulative, i < upper_bounds_.size()
                                        ? absl::ToDoubleSeconds(upper_bounds_[i])
                                        : std::numeric_limits<double>::infinity()});
  }
  // The count is the +Inf bucket's, so that the two always agree.
  h.sample_count = cumulative;
  h.sample_sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return h;
}

DurationHistogramFamily::DurationHistogramFamily(std::string name, std::string help,
                                                 std::vector<absl::Duration> upper_bounds)
    : name_(std::move(name)), help_(std::move(help)), upper_bounds_(std::move(upper_bounds)) {}

DurationHistogram& DurationHistogramFamily::Add(const prometheus::Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<DurationHistogram>& series = series_[labels];
  if (!series) series = std::make_unique<DurationHistogram>(upper_bounds_);
  return *series;
}

void DurationHistogramFamily::Remove(const DurationHistogram* series) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = series_.begin(); it != series_.end(); ++it) {
    if (it->second.get() == series) {
      series_.erase(it);
      return;
    }
  }
}

std::vector<prometheus::MetricFamily> DurationHistogramFamily::Collect() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (series_.empty()) return {};  // As prometheus-cpp's families: no series, no HELP.
  prometheus::MetricFamily family;
  family.name = name_;
  family.help = help_;
  family.type = prometheus::MetricType::Histogram;
  for (const auto& [labels, series] : series_) {
    prometheus::ClientMetric metric;
    for (const auto& [name, value] : labels) metric.label.push_back({name, value});
    metric.histogram = series->Collect();
    family.metric.push_back(std::move(metric));
  }
  return {std::move(family)};
}

}  // namespace precompile::server
