#include "client/latency_histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace precompile::client {

LatencyHistogram::LatencyHistogram() : counts_(kBuckets, 0) {}

int LatencyHistogram::BucketOf(uint64_t nanos) {
  if (nanos < kSubBuckets) return static_cast<int>(nanos);
  const int exponent = 63 - std::countl_zero(nanos);  // >= kSubBucketBits
  const int shift = exponent - kSubBucketBits;
  const int mantissa = static_cast<int>(nanos >> shift);  // in [kSubBuckets, 2 * kSubBuckets)
  return kSubBuckets + shift * kSubBuckets + (mantissa - kSubBuckets);
}

uint64_t LatencyHistogram::HighestValueOf(int bucket) {
  if (bucket < kSubBuckets) return static_cast<uint64_t>(bucket);
  const int shift = (bucket - kSubBuckets) / kSubBuckets;
  const uint64_t mantissa = kSubBuckets + (bucket - kSubBuckets) % kSubBuckets;
  return ((mantissa + 1) << shift) - 1;
}

void LatencyHistogram::Record(absl::Duration latency) {
  const int64_t signed_nanos = absl::ToInt64Nanoseconds(latency);
  const uint64_t nanos = signed_nanos < 0 ? 0 : static_cast<uint64_t>(signed_nanos);
  ++counts_[BucketOf(nanos)];
  min_ = count_ == 0 ? nanos : std::min(min_, nanos);
  max_ = std::max(max_, nanos);
  sum_ += nanos;
  ++count_;
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  if (other.count_ == 0) return;
  for (int i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
  min_ = count_ == 0 ? other.min_ : std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  sum_ += other.sum_;
  count_ += other.count_;
}

absl::Duration LatencyHistogram::min() const {
  return absl::Nanoseconds(static_cast<int64_t>(min_));
}

absl::Duration LatencyHistogram::max() const {
  return absl::Nanoseconds(static_cast<int64_t>(max_));
}

absl::Duration LatencyHistogram::mean() const {
  if (count_ == 0) return absl::ZeroDuration();
  return absl::Nanoseconds(static_cast<double>(sum_ / count_));
}

absl::Duration LatencyHistogram::Percentile(double percentile) const {
  if (count_ == 0) return absl::ZeroDuration();
  const double fraction = std::clamp(percentile, 0.0, 100.0) / 100.0;
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(fraction * count_)));
  int64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      return absl::Nanoseconds(static_cast<int64_t>(std::min(HighestValueOf(i), max_)));
    }
  }
  return max();
}

}  // namespace precompile::client
