#include "runtime/miss_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PRECOMPILE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PRECOMPILE_SANITIZED 1
#endif
#endif

namespace precompile {
namespace {

using ::testing::ElementsAre;

// forward(x, n, mode, scale, mask): one argument of each kind.
std::vector<std::vector<std::string>> Frames() {
  return {{"x", "n", "mode", "scale", "mask"}, {"y"}};
}

struct Call {
  std::vector<int64_t> sizes{8, 4};
  int64_t n = 0;
  std::string mode = "fast";
  std::vector<ArgView> views;

  absl::Span<const ArgView> Views() {
    views.assign(5, ArgView{});
    views[0].kind = ArgView::Kind::kTensor;
    views[0].dtype = DType::kFloat32;
    views[0].rank = static_cast<int32_t>(sizes.size());
    views[0].sizes = sizes.data();
    views[1].kind = ArgView::Kind::kInt;
    views[1].int_value = n;
    views[2].kind = ArgView::Kind::kString;
    views[2].string_value = mode;
    views[3].kind = ArgView::Kind::kFloat;
    views[3].float_value = 0.5;
    views[4].kind = ArgView::Kind::kNone;
    return views;
  }
};

MissExplanation Closest() { return {"forward#0", "x.size(0): expected 8, got 3"}; }

absl::Time At(int seconds) { return absl::FromUnixSeconds(1700000000 + seconds); }

TEST(MissLogTest, RecordsWhatTheGuardsReadOncePerSignature) {
  MissLog log(Frames(), 8);
  int explained = 0;
  auto explain = [&] {
    ++explained;
    return Closest();
  };
  Call batch3;
  batch3.sizes = {3, 4};
  EXPECT_EQ(log.Record(0, batch3.Views(), Outcome::kRefused, explain, At(1)), 1u);
  EXPECT_EQ(log.Record(0, batch3.Views(), Outcome::kRefused, explain, At(5)), 1u);
  Call n2;
  n2.n = 2;
  EXPECT_EQ(log.Record(0, n2.Views(), Outcome::kRefused, explain, At(3)), 2u);
  EXPECT_EQ(explained, 2) << "a signature already kept is not explained again";

  std::vector<FrameMisses> misses = log.Snapshot();
  ASSERT_EQ(misses.size(), 1u) << "only frames with misses";
  EXPECT_EQ(misses[0].frame_index, 0);
  ASSERT_EQ(misses[0].signatures.size(), 2u);
  const MissRecord& top = misses[0].signatures[0];
  EXPECT_EQ(top.count, 2u);
  EXPECT_EQ(top.first_seen, At(1));
  EXPECT_EQ(top.last_seen, At(5));
  EXPECT_EQ(top.outcome, Outcome::kRefused);
  EXPECT_EQ(top.explanation.failing_guard, "x.size(0): expected 8, got 3");

  const auto& args = top.call.arguments();
  ASSERT_EQ(args.size(), 5);
  EXPECT_EQ(args[0].name(), "x");
  EXPECT_EQ(args[0].tensor().dtype(), artifact::v1::DTYPE_FLOAT32);
  EXPECT_EQ(args[0].tensor().device(), "cpu");
  EXPECT_THAT(args[0].tensor().shape(), ElementsAre(3, 4));
  EXPECT_EQ(args[1].name(), "n");
  EXPECT_EQ(args[1].scalar().int_value(), 0);
  EXPECT_EQ(args[2].scalar().string_value(), "fast");
  EXPECT_EQ(args[3].scalar().float_value(), 0.5);
  EXPECT_TRUE(args[4].scalar().none());
  EXPECT_EQ(misses[0].signatures[1].call.arguments(1).scalar().int_value(), 2);
}

TEST(MissLogTest, EveryFieldTheGuardsReadTellsSignaturesApart) {
  MissLog log(Frames(), 64);
  auto record = [&](Call call) {
    return log.Record(0, call.Views(), Outcome::kEagerFallback, Closest, At(0));
  };
  record(Call{});
  Call rank3;
  rank3.sizes = {8, 4, 1};
  EXPECT_EQ(record(rank3), 2u);
  Call mode;
  mode.mode = "slow";
  EXPECT_EQ(record(mode), 3u);
  Call dtype;
  dtype.Views();
  dtype.views[0].dtype = DType::kFloat16;
  EXPECT_EQ(log.Record(0, dtype.views, Outcome::kEagerFallback, Closest, At(0)), 4u);
  Call device;
  device.Views();
  device.views[0].device = DeviceType::kCuda;
  EXPECT_EQ(log.Record(0, device.views, Outcome::kEagerFallback, Closest, At(0)), 5u);
  EXPECT_EQ(record(Call{}), 5u) << "the same call again is no new signature";
}

TEST(MissLogTest, LongStringsAreRecordedByTheirFirstBytes) {
  MissLog log(Frames(), 8);
  Call a;
  a.mode = std::string(100000, 'a');
  Call b = a;
  b.mode.back() = 'b';
  log.Record(0, a.Views(), Outcome::kRefused, Closest, At(0));
  EXPECT_EQ(log.Record(0, b.Views(), Outcome::kRefused, Closest, At(0)), 1u);
  EXPECT_EQ(log.Snapshot()[0].signatures[0].call.arguments(2).scalar().string_value().size(),
            MissLog::kMaxStringBytes);
}

TEST(MissLogTest, ZeroSignaturesRecordsNothing) {
  MissLog log(Frames(), 0);
  Call call;
  EXPECT_EQ(log.Record(0, call.Views(), Outcome::kRefused, Closest, At(0)), 0u);
  EXPECT_TRUE(log.Snapshot().empty());
}

// A flood of distinct misses (every batch size once) keeps the frame within
// its bound, counts the rest as other, and keeps the signature that recurs.
TEST(MissLogTest, AFloodOfDistinctMissesStaysWithinTheBound) {
  constexpr int kBound = 64;
  constexpr int kFlood = 100000;
  MissLog log(Frames(), kBound);
  Call frequent;
  frequent.sizes = {3, 4};
  for (int i = 0; i < 5; ++i) {
    log.Record(0, frequent.Views(), Outcome::kRefused, Closest, At(i));
  }
  const size_t heap_before = mallinfo2().uordblks;
  size_t bytes_early = 0;
  Call flood;
  for (int i = 0; i < kFlood; ++i) {
    flood.sizes = {1000 + i, 4};
    EXPECT_LE(log.Record(0, flood.Views(), Outcome::kRefused, Closest, At(10)),
              static_cast<size_t>(kBound));
    if (i == 1000) bytes_early = log.MemoryBytes();
  }
  const size_t heap_growth = mallinfo2().uordblks - heap_before;

  std::vector<FrameMisses> misses = log.Snapshot();
  ASSERT_EQ(misses.size(), 1u);
  ASSERT_EQ(misses[0].signatures.size(), static_cast<size_t>(kBound));
  EXPECT_THAT(misses[0].signatures[0].call.arguments(0).tensor().shape(), ElementsAre(3, 4));
  EXPECT_EQ(misses[0].signatures[0].count, 5u);
  uint64_t kept = 0;
  for (const MissRecord& r : misses[0].signatures) kept += r.count;
  EXPECT_EQ(kept + misses[0].other_calls, 5u + kFlood) << "no miss is lost from the totals";

  // The table stopped growing once full: 99,000 more signatures later it
  // holds as many bytes as after the first thousand.
  EXPECT_EQ(log.MemoryBytes(), bytes_early);
  EXPECT_LT(log.MemoryBytes(), 64u * 1024);
#ifndef PRECOMPILE_SANITIZED
  // And the allocator agrees (sanitizers keep their own heap accounts).
  EXPECT_LT(heap_growth, 256u * 1024) << "heap grew by " << heap_growth << " bytes";
#else
  (void)heap_growth;
#endif
}

TEST(MissLogTest, ConcurrentRecordsAreAllCounted) {
  MissLog log(Frames(), 4);
  constexpr int kThreads = 4;
  constexpr int kCalls = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&log, t] {
      Call call;
      for (int i = 0; i < kCalls; ++i) {
        call.n = (i + t) % 6;  // Six signatures over a bound of four.
        log.Record(0, call.Views(), Outcome::kEagerFallback, Closest, At(i));
        Call other;
        log.Record(1, other.Views().subspan(0, 1), Outcome::kRefused, Closest, At(i));
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<FrameMisses> misses = log.Snapshot();
  ASSERT_EQ(misses.size(), 2u);
  uint64_t total = misses[0].other_calls;
  for (const MissRecord& r : misses[0].signatures) total += r.count;
  EXPECT_EQ(total, static_cast<uint64_t>(kThreads * kCalls));
  EXPECT_LE(misses[0].signatures.size(), 4u);
  ASSERT_EQ(misses[1].signatures.size(), 1u);
  EXPECT_EQ(misses[1].signatures[0].count, static_cast<uint64_t>(kThreads * kCalls));
  EXPECT_EQ(misses[1].signatures[0].call.arguments(0).name(), "y");
}

}  // namespace
}  // namespace precompile
