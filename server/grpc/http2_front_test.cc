// The front on loopback, with a test's own socket in gRPC's place: what
// clients send reaches the server end unchanged and back, and the limits
// close what passes them on both ends.
#include "server/grpc/http2_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/grpc/http2_test_frames.h"

namespace precompile::server {
namespace {

using testing::Frame;
using testing::kData;
using testing::kEndHeaders;
using testing::kEndStream;
using testing::kGoaway;
using testing::kHeaders;
using testing::kPing;
using testing::kPreface;
using testing::kSettings;

void Blocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); }

void WriteAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// Reads until `want` bytes or the end (EOF, reset, or 10 s of nothing).
std::string Read(int fd, size_t want) {
  timeval wait{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  std::string got;
  char buffer[1 << 16];
  while (got.size() < want) {
    const ssize_t n = recv(fd, buffer, std::min(sizeof buffer, want - got.size()), 0);
    if (n <= 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  return got;
}

// Whether the peer has ended: a read returns the end, not data, within 10 s.
bool Ended(int fd) {
  timeval wait{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    if (n < 0) return false;
  }
}

// Each test runs with one relay thread and with three: with three, the
// connections a test makes relay on different threads (given in turn, the
// last thread accepting), so the bounds over all connections close a
// connection of another thread.
class FrontTest : public ::testing::TestWithParam<int> {
 protected:
  void StartFront(Http2FrontOptions options) {
    options.address = "127.0.0.1:0";
    options.relay_threads = GetParam();
    auto started = Http2Front::Start(
        options,
        [this](int fd) {
          Blocking(fd);
          std::lock_guard<std::mutex> lock(mu_);
          handed_.push_back(fd);
          cv_.notify_all();
        },
        stats_);
    ASSERT_TRUE(started.ok()) << started.status();
    front_ = *std::move(started);
  }

  void TearDown() override {
    front_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : handed_) {
      if (fd >= 0) close(fd);
    }
  }

  // What gRPC does once it has seen the end of a connection.
  void CloseHanded(size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    close(handed_[index]);
    handed_[index] = -1;
  }

  int Connect() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(front_->port()));
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    return fd;
  }

  // The server end of the `index`th connection handed over.
  int Handed(size_t index, absl::Duration wait = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), [&] { return handed_.size() > index; });
    return handed_.size() > index ? handed_[index] : -1;
  }

  Http2FrontStats stats_;
  std::unique_ptr<Http2Front> front_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> handed_;
};

TEST_P(FrontTest, RelaysBothWaysUnchanged) {
  StartFront({});
  const int client = Connect();
  // More than the relay holds at once, both ways.
  std::string sent = std::string(kPreface) + Frame(kSettings, 0, 0);
  sent += Frame(kHeaders, kEndHeaders, 1, "headers");
  for (int i = 0; i < 300; ++i)
    sent += Frame(kData, 0, 1, std::string(16000, static_cast<char>(i)));
  std::thread writer([&] { WriteAll(client, sent); });
  const int server = Handed(0);
  ASSERT_GE(server, 0);
  EXPECT_EQ(Read(server, sent.size()), sent);
  writer.join();
  std::string answer = Frame(kSettings, 0, 0);
  for (int i = 0; i < 300; ++i)
    answer += Frame(kData, 0, 1, std::string(16000, static_cast<char>(i)));
  answer += Frame(kHeaders, kEndHeaders | kEndStream, 1, "trailers");
  std::thread answerer([&] { WriteAll(server, answer); });
  EXPECT_EQ(Read(client, answer.size()), answer);
  answerer.join();
  close(client);
  // The server end learns the client has gone.
  EXPECT_TRUE(Ended(server));
}

TEST_P(FrontTest, WhatTheServerSentLastReachesTheClientBeforeItsEnd) {
  StartFront({});
  const int client = Connect();
  WriteAll(client, std::string(kPreface));
  const int server = Handed(0);
  ASSERT_GE(server, 0);
  const std::string goaway = Frame(kGoaway, 0, 0, std::string(1 << 20, 'g'));
  std::thread answerer([&] {
    WriteAll(server, goaway);
    CloseHanded(0);
  });
  EXPECT_EQ(Read(client, goaway.size() + 1), goaway);
  answerer.join();
  close(client);
}

TEST_P(FrontTest, AConnectionResettingPastItsBudgetIsClosedOnBothEnds) {
  Http2FrontOptions options;
  options.limits.resets_per_second = 5;  // A burst of 10.
  StartFront(options);
  const int calm = Connect();
  const int client = Connect();
  std::string flood = std::string(kPreface) + Frame(kSettings, 0, 0);
  for (uint32_t stream = 1; stream < 200; stream += 2) {
    flood += Frame(kHeaders, kEndHeaders, stream, "h") + testing::Reset(stream);
  }
  const std::string calm_bytes =
      std::string(kPreface) + Frame(kSettings, 0, 0) + Frame(kHeaders, kEndHeaders, 1, "h");
  WriteAll(calm, calm_bytes);
  const int calm_server = Handed(0);
  ASSERT_GE(calm_server, 0);
  EXPECT_EQ(Read(calm_server, calm_bytes.size()), calm_bytes);
  WriteAll(client, flood);
  EXPECT_TRUE(Ended(client));
  const int server = Handed(1);
  ASSERT_GE(server, 0);
  EXPECT_TRUE(Ended(server));
  EXPECT_EQ(stats_.closed_for_resets.load(), 1);
  // The other connection relays on.
  WriteAll(calm_server, "answer");
  EXPECT_EQ(Read(calm, 6), "answer");
  close(calm);
  close(client);
}

TEST_P(FrontTest, AConnectionOpeningStreamsPastTheBoundIsClosed) {
  Http2FrontOptions options;
  options.limits.max_open_streams = 8;
  StartFront(options);
  const int client = Connect();
  std::string opens = std::string(kPreface) + Frame(kSettings, 0, 0);
  for (uint32_t stream = 1; stream <= 17; stream += 2)
    opens += Frame(kHeaders, kEndHeaders, stream, "h");
  WriteAll(client, opens);
  EXPECT_TRUE(Ended(client));
  EXPECT_EQ(stats_.closed_for_streams.load(), 1);
  close(client);
}

// Connections each within their own bound can hold, together, more streams
// than the server can keep: past the total, the one holding the most goes.
TEST_P(FrontTest, PastTheStreamsOfAllConnectionsTheOneHoldingTheMostIsClosed) {
  Http2FrontOptions options;
  options.max_open_streams = 6;
  StartFront(options);
  const std::string hello = std::string(kPreface) + Frame(kSettings, 0, 0);
  auto opening = [](uint32_t first, uint32_t last) {
    std::string frames;
    for (uint32_t stream = first; stream <= last; stream += 2)
      frames += Frame(kHeaders, kEndHeaders, stream, "h");
    return frames;
  };
  const int holder = Connect();
  WriteAll(holder, hello + opening(1, 7));
  ASSERT_EQ(Read(Handed(0), hello.size() + 4 * 10), hello + opening(1, 7));
  const int few = Connect();
  WriteAll(few, hello + opening(1, 3));
  ASSERT_EQ(Read(Handed(1), hello.size() + 2 * 10), hello + opening(1, 3));
  // Its seventh stream of all: the holder of four goes, and the call that
  // passed the total is relayed.
  WriteAll(few, opening(5, 5));
  EXPECT_EQ(Read(Handed(1), 10), opening(5, 5));
  EXPECT_TRUE(Ended(holder));
  EXPECT_TRUE(Ended(Handed(0)));
  EXPECT_EQ(stats_.closed_for_streams.load(), 1);
  // Three are open now; one connection opening five holds the most itself.
  const int greedy = Connect();
  WriteAll(greedy, hello + opening(1, 9));
  EXPECT_TRUE(Ended(greedy));
  EXPECT_EQ(stats_.closed_for_streams.load(), 2);
  // The connection with a few calls relays on, both ways.
  WriteAll(few, opening(7, 7));
  EXPECT_EQ(Read(Handed(1), 10), opening(7, 7));
  WriteAll(Handed(1), "answer");
  EXPECT_EQ(Read(few, 6), "answer");
  for (int fd : {holder, few, greedy}) close(fd);
}

TEST_P(FrontTest, PastTheCapANewConnectionTakesThePlaceOfTheOneIdleLongest) {
  Http2FrontOptions options;
  options.max_connections = 3;
  StartFront(options);
  const std::string hello = std::string(kPreface) + Frame(kSettings, 0, 0);
  const int idle_longer = Connect();
  WriteAll(idle_longer, hello);
  ASSERT_EQ(Read(Handed(0), hello.size()), hello);
  const int idle = Connect();
  WriteAll(idle, hello);
  ASSERT_EQ(Read(Handed(1), hello.size()), hello);
  // Pings are not calls: the first stays the one idle longest.
  const std::string ping = Frame(kPing, 0, 0, "12345678");
  WriteAll(idle_longer, ping);
  ASSERT_EQ(Read(Handed(0), ping.size()), ping);
  const int calling = Connect();
  const std::string call = hello + Frame(kHeaders, kEndHeaders, 1, "h");
  WriteAll(calling, call);
  ASSERT_EQ(Read(Handed(2), call.size()), call);
  // The one that has gone longest without a call goes, on both ends; the
  // others stay.
  const int next = Connect();
  WriteAll(next, hello);
  EXPECT_EQ(Read(Handed(3), hello.size()), hello);
  EXPECT_TRUE(Ended(idle_longer));
  EXPECT_TRUE(Ended(Handed(0)));
  EXPECT_EQ(stats_.refused_connections.load(), 1);
  WriteAll(Handed(1), "to idle");
  EXPECT_EQ(Read(idle, 7), "to idle");
  WriteAll(Handed(2), "to calling");
  EXPECT_EQ(Read(calling, 10), "to calling");
  for (int fd : {idle_longer, idle, calling, next}) close(fd);
}

TEST_P(FrontTest, PastTheCapWithNoneIdleTheNewConnectionIsClosed) {
  Http2FrontOptions options;
  options.max_connections = 2;
  StartFront(options);
  const std::string call =
      std::string(kPreface) + Frame(kSettings, 0, 0) + Frame(kHeaders, kEndHeaders, 1, "h");
  const int first = Connect();
  WriteAll(first, call);
  ASSERT_EQ(Read(Handed(0), call.size()), call);
  const int second = Connect();
  WriteAll(second, call);
  ASSERT_EQ(Read(Handed(1), call.size()), call);
  const int third = Connect();
  EXPECT_TRUE(Ended(third));
  EXPECT_EQ(stats_.refused_connections.load(), 1);
  // Both calling connections relay on.
  const std::string answer = Frame(kData, 0, 1, "answer");
  WriteAll(Handed(0), answer);
  EXPECT_EQ(Read(first, answer.size()), answer);
  // Once the server ends the first one's call, it is idle, and makes room.
  WriteAll(Handed(0), Frame(kHeaders, kEndHeaders | kEndStream, 1, "t"));
  EXPECT_EQ(Read(first, 10), Frame(kHeaders, kEndHeaders | kEndStream, 1, "t"));
  const int fourth = Connect();
  WriteAll(fourth, std::string(kPreface));
  EXPECT_EQ(Read(Handed(2), 24), std::string(kPreface));
  EXPECT_TRUE(Ended(first));
  for (int fd : {first, second, third, fourth}) close(fd);
}

INSTANTIATE_TEST_SUITE_P(RelayThreads, FrontTest, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Threads");
                         });

}  // namespace
}  // namespace precompile::server
