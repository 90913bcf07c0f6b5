#include "server/grpc/http2_stream_ledger.h"

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/grpc/http2_test_frames.h"

namespace precompile::server {
namespace {

using testing::Frame;
using testing::kData;
using testing::kEndHeaders;
using testing::kEndStream;
using testing::kHeaders;
using testing::kPing;
using testing::kPreface;
using testing::kSettings;
using testing::Reset;

// A call's HEADERS, with a payload the ledger must skip unread (it looks
// like frame headers if misread).
std::string Open(uint32_t stream) { return Frame(kHeaders, kEndHeaders, stream, Reset(1)); }
std::string Trailers(uint32_t stream) {
  return Frame(kHeaders, kEndHeaders | kEndStream, stream, "xx");
}

class LedgerTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  Http2StreamLedger Ledger(int max_open_streams, int resets_per_second) {
    Http2StreamLedger ledger({max_open_streams, resets_per_second}, now_);
    EXPECT_TRUE(ledger.FromClient(std::string(kPreface) + Frame(kSettings, 0, 0), now_).ok());
    return ledger;
  }
};

TEST_F(LedgerTest, StreamsAreOpenUntilTheServerEndsThem) {
  Http2StreamLedger ledger = Ledger(0, 0);
  ASSERT_TRUE(ledger.FromClient(Open(1) + Open(3) + Frame(kData, kEndStream, 1, "abc"), now_).ok());
  EXPECT_EQ(ledger.open_streams(), 2);
  // The client's trailers on stream 1 open nothing.
  ASSERT_TRUE(ledger.FromClient(Frame(kHeaders, kEndHeaders | kEndStream, 1, "t"), now_).ok());
  EXPECT_EQ(ledger.open_streams(), 2);
  ledger.FromServer(Frame(kHeaders, kEndHeaders, 1, "h") + Frame(kData, 0, 1, "d") + Trailers(1));
  EXPECT_EQ(ledger.open_streams(), 1);
  ledger.FromServer(Reset(3));
  EXPECT_EQ(ledger.open_streams(), 0);
}

TEST_F(LedgerTest, OnlyANewStreamCountsAsACall) {
  Http2StreamLedger ledger = Ledger(0, 0);
  const absl::Time start = now_;
  EXPECT_EQ(ledger.last_opened(), start);
  now_ += absl::Seconds(5);
  // Settings, data and trailers on a stream already open are not calls.
  ASSERT_TRUE(ledger.FromClient(Frame(kSettings, 0, 0), now_).ok());
  EXPECT_EQ(ledger.last_opened(), start);
  ASSERT_TRUE(ledger.FromClient(Open(1), now_).ok());
  EXPECT_EQ(ledger.last_opened(), now_);
  const absl::Time opened = now_;
  now_ += absl::Seconds(5);
  ASSERT_TRUE(ledger.FromClient(Frame(kData, 0, 1, "x") + Trailers(1), now_).ok());
  EXPECT_EQ(ledger.last_opened(), opened);
}

TEST_F(LedgerTest, FramesSplitAnywhereReadTheSame) {
  const std::string client =
      std::string(kPreface) + Frame(kSettings, 0, 0, "123456") + Open(1) + Open(3) + Reset(3);
  for (size_t piece = 1; piece <= 7; ++piece) {
    Http2StreamLedger ledger({0, 0}, now_);
    for (size_t at = 0; at < client.size(); at += piece) {
      ASSERT_TRUE(ledger.FromClient(client.substr(at, piece), now_).ok()) << piece;
    }
    EXPECT_EQ(ledger.open_streams(), 1) << piece;
    EXPECT_EQ(ledger.resets(), 1) << piece;
    const std::string server = Trailers(1);
    for (size_t at = 0; at < server.size(); at += piece)
      ledger.FromServer(server.substr(at, piece));
    EXPECT_EQ(ledger.open_streams(), 0) << piece;
  }
}

TEST_F(LedgerTest, ResetsPastTheBudgetCloseTheConnection) {
  // 10 a second, a burst of 20.
  Http2StreamLedger ledger = Ledger(0, 10);
  uint32_t stream = 1;
  for (int i = 0; i < 20; ++i, stream += 2) {
    ASSERT_TRUE(ledger.FromClient(Open(stream) + Reset(stream), now_).ok()) << i;
  }
  const absl::Status passed = ledger.FromClient(Open(stream) + Reset(stream), now_);
  EXPECT_EQ(passed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(passed.message().find("rapid reset"), std::string::npos) << passed;
  EXPECT_EQ(ledger.breach(), Http2StreamLedger::Breach::kResets);
  // Closed for good: even harmless bytes are refused.
  EXPECT_FALSE(ledger.FromClient(Frame(kSettings, 0, 0), now_ + absl::Hours(1)).ok());
}

TEST_F(LedgerTest, TheBudgetRefillsWithTime) {
  Http2StreamLedger ledger = Ledger(0, 10);
  uint32_t stream = 1;
  // 10 a second for 10 s, twice the burst, within the rate.
  for (int i = 0; i < 100; ++i, stream += 2) {
    ASSERT_TRUE(ledger.FromClient(Open(stream) + Reset(stream), now_).ok()) << i;
    now_ += absl::Milliseconds(100);
  }
  EXPECT_EQ(ledger.resets(), 100);
}

// The front reads the wall clock, which may step back (an NTP correction):
// a client within its budget keeps its connection all the same.
TEST_F(LedgerTest, AClockThatStepsBackCostsNoBudget) {
  Http2StreamLedger ledger = Ledger(0, 10);
  uint32_t stream = 1;
  now_ -= absl::Seconds(60);
  for (int i = 0; i < 20; ++i, stream += 2) {
    ASSERT_TRUE(ledger.FromClient(Open(stream) + Reset(stream), now_).ok()) << i;
  }
  // The burst is spent all the same.
  EXPECT_FALSE(ledger.FromClient(Open(stream) + Reset(stream), now_).ok());
}

TEST_F(LedgerTest, ResetsOfStreamsTheServerEndedAreFree) {
  Http2StreamLedger ledger = Ledger(0, 1);
  uint32_t stream = 1;
  for (int i = 0; i < 50; ++i, stream += 2) {
    ASSERT_TRUE(ledger.FromClient(Open(stream), now_).ok());
    ledger.FromServer(Trailers(stream));
    ASSERT_TRUE(ledger.FromClient(Reset(stream), now_).ok()) << i;
  }
  EXPECT_EQ(ledger.resets(), 0);
  EXPECT_EQ(ledger.open_streams(), 0);
}

TEST_F(LedgerTest, StreamsPastTheLimitCloseTheConnection) {
  Http2StreamLedger ledger = Ledger(3, 0);
  ASSERT_TRUE(ledger.FromClient(Open(1) + Open(3) + Open(5), now_).ok());
  ledger.FromServer(Trailers(3));
  ASSERT_TRUE(ledger.FromClient(Open(7), now_).ok());
  const absl::Status passed = ledger.FromClient(Open(9), now_);
  EXPECT_EQ(passed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ledger.breach(), Http2StreamLedger::Breach::kStreams);
}

TEST_F(LedgerTest, AClientThatIsNotHttp2IsRefused) {
  Http2StreamLedger ledger({0, 0}, now_);
  ASSERT_TRUE(ledger.FromClient("PRI * HT", now_).ok());
  EXPECT_FALSE(ledger.FromClient("TP/1.1\r\n", now_).ok());
  EXPECT_EQ(ledger.breach(), Http2StreamLedger::Breach::kNotHttp2);
}

// Where the front may put a frame of its own in the server's bytes: after
// the server's first frame, never inside one.
TEST_F(LedgerTest, TheServersBytesAreBetweenFramesOnlyWhereAFrameEnds) {
  Http2StreamLedger ledger = Ledger(0, 0);
  EXPECT_FALSE(ledger.ServerBetweenFrames());
  const std::string answer = Frame(kSettings, 0, 0) + Frame(kHeaders, kEndHeaders, 1, "answer");
  ledger.FromServer(answer.substr(0, 4));
  EXPECT_FALSE(ledger.ServerBetweenFrames());
  ledger.FromServer(answer.substr(4, 5));
  EXPECT_TRUE(ledger.ServerBetweenFrames());
  ledger.FromServer(answer.substr(9, 12));
  EXPECT_FALSE(ledger.ServerBetweenFrames());
  ledger.FromServer(answer.substr(21));
  EXPECT_TRUE(ledger.ServerBetweenFrames());
}

TEST_F(LedgerTest, OnlyTheAcknowledgementOfThePingItWaitsForCounts) {
  Http2StreamLedger ledger = Ledger(0, 0);
  ASSERT_TRUE(ledger.FromClient(Frame(kPing, 1, 0, "goaway!!"), now_).ok());
  EXPECT_FALSE(ledger.ping_acked()) << "acknowledged before it was sent";
  ledger.ExpectPingAck("goaway!!");
  // Another's acknowledgement; the PING itself, not acknowledged; then the
  // acknowledgement, a byte at a time.
  ASSERT_TRUE(
      ledger.FromClient(Frame(kPing, 1, 0, "12345678") + Frame(kPing, 0, 0, "goaway!!"), now_)
          .ok());
  EXPECT_FALSE(ledger.ping_acked());
  for (char byte : Frame(kPing, 1, 0, "goaway!!")) {
    EXPECT_FALSE(ledger.ping_acked());
    ASSERT_TRUE(ledger.FromClient(std::string(1, byte), now_).ok());
  }
  EXPECT_TRUE(ledger.ping_acked());
}

}  // namespace
}  // namespace precompile::server
