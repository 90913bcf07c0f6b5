#include "server/metrics/duration_histogram.h"

#include <prometheus/text_serializer.h>

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Text(const DurationHistogramFamily& family) {
  return prometheus::TextSerializer().Serialize(family.Collect());
}

DurationHistogramFamily Family() {
  return DurationHistogramFamily("t_duration_seconds", "Test durations",
                                 {absl::Microseconds(1), absl::Milliseconds(1)});
}

TEST(DurationHistogram, BucketsAreInclusiveCumulativeAndEndInInf) {
  DurationHistogramFamily family = Family();
  DurationHistogram& h = family.Add({{"model", "m"}});
  h.Observe(absl::Microseconds(1));    // On the first bound: in its bucket.
  h.Observe(absl::Nanoseconds(1001));  // Just past it.
  h.Observe(absl::Seconds(2));         // Past every bound.
  const std::string text = Text(family);
  EXPECT_THAT(text, HasSubstr("# TYPE t_duration_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("t_duration_seconds_bucket{model=\"m\",le=\"1e-06\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("t_duration_seconds_bucket{model=\"m\",le=\"0.001\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("t_duration_seconds_bucket{model=\"m\",le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("t_duration_seconds_count{model=\"m\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("t_duration_seconds_sum{model=\"m\"} 2.000002001\n"));
}

TEST(DurationHistogram, ConcurrentObservationsAreAllCounted) {
  DurationHistogramFamily family = Family();
  DurationHistogram& h = family.Add({{"model", "m"}});
  constexpr int kThreads = 4;
  constexpr int kEach = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kEach; ++i) h.Observe(absl::Microseconds(t));
    });
  }
  // Scrapes while they record see counts that only grow.
  uint64_t last = 0;
  for (int i = 0; i < 100; ++i) {
    const uint64_t count = h.Collect().sample_count;
    EXPECT_GE(count, last);
    last = count;
  }
  for (std::thread& t : threads) t.join();
  const prometheus::ClientMetric::Histogram total = h.Collect();
  EXPECT_EQ(total.sample_count, uint64_t{kThreads} * kEach);
  // Threads 0 and 1 observe 0 and 1 µs (first bucket), 2 and 3 the second.
  EXPECT_EQ(total.bucket[0].cumulative_count, uint64_t{2} * kEach);
  EXPECT_EQ(total.bucket[1].cumulative_count, uint64_t{4} * kEach);
  EXPECT_DOUBLE_EQ(total.sample_sum, (0 + 1 + 2 + 3) * kEach * 1e-6);
}

TEST(DurationHistogramFamily, SeriesAreFoundByLabelsAndRemoved) {
  DurationHistogramFamily family = Family();
  DurationHistogram& a = family.Add({{"model", "a"}});
  DurationHistogram& b = family.Add({{"model", "b"}});
  EXPECT_EQ(&family.Add({{"model", "a"}}), &a);
  a.Observe(absl::Microseconds(5));
  family.Remove(&a);
  std::string text = Text(family);
  EXPECT_THAT(text, Not(HasSubstr("model=\"a\"")));
  EXPECT_THAT(text, HasSubstr("t_duration_seconds_count{model=\"b\"} 0\n"));
  family.Remove(&b);
  EXPECT_TRUE(family.Collect().empty());
}

}  // namespace
}  // namespace precompile::server
