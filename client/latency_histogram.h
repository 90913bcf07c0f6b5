// A latency histogram in the manner of HdrHistogram: log-linear buckets
// (128 per power of two) over nanoseconds, so any recorded value is reported
// within 1/128 (0.8%) of itself, in a fixed 58 KiB of counts however many values are
// recorded.
//
// Thread safety: not thread-safe; callers serialize access (the load
// generator records under its own mutex).
#ifndef PRECOMPILE_CLIENT_LATENCY_HISTOGRAM_H_
#define PRECOMPILE_CLIENT_LATENCY_HISTOGRAM_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace precompile::client {

class LatencyHistogram {
 public:
  LatencyHistogram();

  // Negative durations count as zero.
  void Record(absl::Duration latency);
  void Merge(const LatencyHistogram& other);

  int64_t count() const { return count_; }
  // Zero when empty.
  absl::Duration min() const;
  absl::Duration max() const;
  absl::Duration mean() const;
  // The value at `percentile` (0 to 100): the highest value of the bucket
  // holding that rank, capped at max(). Zero when empty.
  absl::Duration Percentile(double percentile) const;

 private:
  static constexpr int kSubBucketBits = 7;
  static constexpr int kSubBuckets = 1 << kSubBucketBits;
  // Values below kSubBuckets get a bucket each; each power of two above
  // (2^7 to 2^63) gets kSubBuckets buckets.
  static constexpr int kBuckets = kSubBuckets + (64 - kSubBucketBits) * kSubBuckets;

  static int BucketOf(uint64_t nanos);
  static uint64_t HighestValueOf(int bucket);

  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  uint64_t min_ = 0;
  uint64_t max_ = 0;
  long double sum_ = 0;
};

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_LATENCY_HISTOGRAM_H_
