// What torch and AOTInductor write to std::cerr goes out whole lines at a
// bounded rate, so that a client whose calls fail cannot flood the log.
#include "base/rate_limited_lines.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <thread>
#include <vector>

namespace precompile {
namespace {

using ::testing::ElementsAre;

struct Captured {
  std::vector<std::string> lines;
  absl::Time now = absl::FromUnixSeconds(1000);
  RateLimitedLines buffer;
  std::ostream stream;
  explicit Captured(RateLimitedLines::Options options)
      : buffer(
            options, [this](absl::string_view line) { lines.emplace_back(line); },
            [this] { return now; }),
        stream(&buffer) {}
};

TEST(RateLimitedLines, PassesWholeLinesAndHoldsAnUnfinishedOne) {
  Captured out({});
  out.stream << "shape [" << 2 << ", " << 3 << "]\nnext";
  EXPECT_THAT(out.lines, ElementsAre("shape [2, 3]\n"));
  out.stream << " line" << std::endl << "\n";
  EXPECT_THAT(out.lines, ElementsAre("shape [2, 3]\n", "next line\n", "\n"));
}

TEST(RateLimitedLines, DropsLinesPastTheRateAndSaysHowManyWhenLinesPassAgain) {
  Captured out({.lines_per_window = 3, .window = absl::Minutes(1)});
  for (int i = 0; i < 5; ++i) out.stream << "failed " << i << "\n";
  EXPECT_THAT(out.lines, ElementsAre("failed 0\n", "failed 1\n", "failed 2\n"));
  EXPECT_EQ(out.buffer.dropped(), 2);
  out.now += absl::Seconds(59);
  out.stream << "still within the minute\n";
  EXPECT_EQ(out.lines.size(), 3u);
  out.now += absl::Seconds(2);
  out.stream << "a new minute\n";
  EXPECT_THAT(out.lines, ElementsAre("failed 0\n", "failed 1\n", "failed 2\n",
                                     "3 lines dropped (more than 3 in 1m)\n", "a new minute\n"));
  EXPECT_EQ(out.buffer.dropped(), 0);
}

// The server learns from them why a compiled run failed, whether or not the
// log has room for them.
TEST(RateLimitedLines, AnObserverSeesEveryWholeLineOnItsWritersThreadPassedOrDropped) {
  std::vector<std::pair<std::string, std::thread::id>> seen;
  RateLimitedLines::Options options{.lines_per_window = 1, .window = absl::Minutes(1)};
  options.observe = [&seen](absl::string_view line) {
    seen.emplace_back(std::string(line), std::this_thread::get_id());
  };
  Captured out(options);
  out.stream << "first\nsec";
  std::thread([&out] { out.stream << "other thread\n"; }).join();
  out.stream << "ond\n";
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].first, "first");
  EXPECT_EQ(seen[1].first, "other thread");
  EXPECT_NE(seen[1].second, std::this_thread::get_id());
  EXPECT_EQ(seen[2].first, "second");
  EXPECT_EQ(seen[2].second, std::this_thread::get_id());
  EXPECT_THAT(out.lines, ElementsAre("first\n"));  // The rest dropped.
}

TEST(RateLimitedLines, CutsALongLineSayingHowMuchWent) {
  Captured out({.max_line_bytes = 8});
  out.stream << "0123456" << "789abc" << "\n" << "short\n";
  EXPECT_THAT(out.lines, ElementsAre("01234567... (5 more bytes)\n", "short\n"));
}

TEST(RateLimitedLines, ThreadsWritingAtOnceNeverMixTheirLines) {
  Captured out({.lines_per_window = 1 << 20});
  constexpr int kThreads = 4, kLines = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&out, t] {
      for (int i = 0; i < kLines; ++i) out.stream << "thread " << t << " line " << i << '\n';
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(out.lines.size(), static_cast<size_t>(kThreads * kLines));
  std::vector<int> next(kThreads, 0);
  for (const std::string& line : out.lines) {
    int t = -1, i = -1;
    ASSERT_EQ(sscanf(line.c_str(), "thread %d line %d\n", &t, &i), 2) << line;
    ASSERT_TRUE(t >= 0 && t < kThreads) << line;
    EXPECT_EQ(line, "thread " + std::to_string(t) + " line " + std::to_string(i) + "\n");
    EXPECT_EQ(i, next[t]++) << "a thread's lines out of order";
  }
}

}  // namespace
}  // namespace precompile
