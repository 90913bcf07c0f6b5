#include "client/latency_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace precompile::client {
namespace {

TEST(LatencyHistogramTest, PercentilesAreWithinOnePercent) {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> latency_us(6.0, 1.0);  // ~400 us, long tail
  LatencyHistogram h;
  std::vector<int64_t> exact;
  for (int i = 0; i < 100000; ++i) {
    const int64_t ns = static_cast<int64_t>(latency_us(rng) * 1000);
    h.Record(absl::Nanoseconds(ns));
    exact.push_back(ns);
  }
  std::sort(exact.begin(), exact.end());
  EXPECT_EQ(h.count(), 100000);
  EXPECT_EQ(h.min(), absl::Nanoseconds(exact.front()));
  EXPECT_EQ(h.max(), absl::Nanoseconds(exact.back()));
  for (double p : {50.0, 90.0, 99.0, 99.9, 100.0}) {
    const int64_t rank = static_cast<int64_t>(std::ceil(p / 100 * exact.size()));
    const double want = exact[rank - 1];
    const double got = absl::ToInt64Nanoseconds(h.Percentile(p));
    EXPECT_GE(got, want) << p;
    EXPECT_LE(got, want * (1 + 1.0 / 128)) << p;
  }
}

TEST(LatencyHistogramTest, HandlesEdges) {
  LatencyHistogram empty;
  EXPECT_EQ(empty.Percentile(50), absl::ZeroDuration());
  EXPECT_EQ(empty.mean(), absl::ZeroDuration());

  LatencyHistogram h;
  h.Record(absl::Nanoseconds(5));
  h.Record(absl::Nanoseconds(-3));  // a clock going backwards counts as zero
  h.Record(absl::Hours(24 * 365));
  EXPECT_EQ(h.min(), absl::ZeroDuration());
  EXPECT_EQ(h.Percentile(50), absl::Nanoseconds(5));
  EXPECT_EQ(h.Percentile(100), absl::Hours(24 * 365));

  LatencyHistogram other;
  other.Record(absl::Microseconds(100));
  h.Merge(other);
  EXPECT_EQ(h.count(), 4);
  EXPECT_GE(h.Percentile(75), absl::Microseconds(100));
  EXPECT_LE(h.Percentile(75), absl::Microseconds(100) * (1 + 1.0 / 128));
}

}  // namespace
}  // namespace precompile::client
