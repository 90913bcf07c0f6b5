// The front on loopback, with a test's own socket in gRPC's place: what
// clients send reaches the server end unchanged and back, and the limits
// close what passes them on both ends.
#include "server/grpc/http2_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/tls_server.h"
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
  SslContext tls_;  // Outlives the front.
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

// Draining: the client is told to open nothing more (GOAWAY letting every
// stream go on, then a PING), between the server's frames; the front counts
// it gone once it has acknowledged the PING with its calls ended, and then
// closes it (gRPC would wait for the client to hang up).
TEST_P(FrontTest, GoAwayTellsTheClientBetweenFramesAndItIsGoneOnceItsCallsHaveEnded) {
  StartFront({});
  const int client = Connect();
  const std::string call = std::string(kPreface) + Frame(kSettings, 0, 0) +
                           Frame(kHeaders, kEndHeaders, 1, "headers") +
                           Frame(kData, kEndStream, 1, "request");
  WriteAll(client, call);
  const int server = Handed(0);
  ASSERT_GE(server, 0);
  EXPECT_EQ(Read(server, call.size()), call);
  // The server's SETTINGS, and half of the answer's first frame: the front's
  // frames must not go into the middle of it.
  const std::string settings = Frame(kSettings, 0, 0);
  const std::string headers = Frame(kHeaders, kEndHeaders, 1, "answer headers");
  WriteAll(server, settings + headers.substr(0, 5));
  EXPECT_EQ(Read(client, settings.size() + 5), settings + headers.substr(0, 5));
  front_->GoAway();
  WriteAll(server, headers.substr(5));
  const std::string told = Frame(kGoaway, 0, 0, std::string("\x7f\xff\xff\xff\0\0\0\0", 8)) +
                           Frame(kPing, 0, 0, "goaway!!");
  EXPECT_EQ(Read(client, headers.size() - 5 + told.size()), headers.substr(5) + told);
  // Acknowledged, with the call still open: not gone yet.
  WriteAll(client, Frame(kPing, 1, 0, "goaway!!"));
  EXPECT_FALSE(front_->AwaitGoneAway(absl::Now() + absl::Milliseconds(300)));
  // The call ends: gone, and closed on both ends once the end has reached
  // the client.
  const std::string trailers = Frame(kHeaders, kEndHeaders | kEndStream, 1, "trailers");
  WriteAll(server, trailers);
  EXPECT_TRUE(front_->AwaitGoneAway(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(Read(client, trailers.size() + 1), trailers);
  EXPECT_TRUE(Ended(server));
  close(client);
}

// Another PING's acknowledgement (gRPC's own, or other opaque data) is not
// the one GoAway waits for.
TEST_P(FrontTest, OnlyTheAcknowledgementOfGoAwaysPingCounts) {
  StartFront({});
  const int client = Connect();
  WriteAll(client, std::string(kPreface) + Frame(kSettings, 0, 0));
  const int server = Handed(0);
  ASSERT_GE(server, 0);
  const std::string settings = Frame(kSettings, 0, 0);
  WriteAll(server, settings);
  EXPECT_EQ(Read(client, settings.size()), settings);
  front_->GoAway();
  const std::string told = Frame(kGoaway, 0, 0, std::string("\x7f\xff\xff\xff\0\0\0\0", 8)) +
                           Frame(kPing, 0, 0, "goaway!!");
  EXPECT_EQ(Read(client, told.size()), told);
  // Its acknowledgement split over two writes, after others.
  WriteAll(client, Frame(kPing, 1, 0, "12345678") + Frame(kPing, 0, 0, "goaway!!"));
  EXPECT_FALSE(front_->AwaitGoneAway(absl::Now() + absl::Milliseconds(300)));
  const std::string ack = Frame(kPing, 1, 0, "goaway!!");
  WriteAll(client, ack.substr(0, 13));
  EXPECT_FALSE(front_->AwaitGoneAway(absl::Now() + absl::Milliseconds(100)));
  WriteAll(client, ack.substr(13));
  EXPECT_TRUE(front_->AwaitGoneAway(absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(Ended(client));
  close(client);
}

// A client that never acknowledges holds the drain only to its deadline; one
// that hangs up counts as gone.
TEST_P(FrontTest, AClientThatHangsUpIsGoneAndOneThatNeverAnswersWaitsForTheDeadline) {
  StartFront({});
  const int silent = Connect();
  const int leaving = Connect();
  WriteAll(silent, std::string(kPreface) + Frame(kSettings, 0, 0));
  WriteAll(leaving, std::string(kPreface) + Frame(kSettings, 0, 0));
  ASSERT_GE(Handed(1), 0);
  for (size_t i = 0; i < 2; ++i) WriteAll(Handed(i), Frame(kSettings, 0, 0));
  front_->GoAway();
  close(leaving);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(front_->AwaitGoneAway(start + absl::Milliseconds(500)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(450));
  close(silent);
  EXPECT_TRUE(front_->AwaitGoneAway(absl::Now() + absl::Seconds(10)));
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

// A CA, a certificate it signed for a client, and the server's own
// certificate, made with the openssl command line once per test binary.
std::string TlsFile(const std::string& name) {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto* dir = new std::string(std::string(tmp != nullptr ? tmp : "/tmp") + "/front_tls");
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    const std::string made =
        "mkdir -p " + *dir + " && cd " + *dir + " && openssl req -x509 " + ec +
        " -days 2 -subj /CN=ca -keyout ca.key -out ca.crt" + " && openssl req -x509 " + ec +
        " -days 2 -subj /CN=localhost -keyout server.key -out server.crt" + " && openssl req " +
        ec + " -subj /CN=client -keyout client.key -out client.csr" +
        " && openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial" +
        " -days 2 -out client.crt >/dev/null 2>&1";
    EXPECT_EQ(std::system(made.c_str()), 0) << made;
    return dir;
  }();
  return *dir + "/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A gRPC client's TLS on a blocking socket: ALPN's h2 offered, the server's
// certificate not checked, the client certificate presented if asked for.
class TlsClient {
 public:
  TlsClient(int fd, bool with_certificate) : fd_(fd), ctx_(SSL_CTX_new(TLS_client_method())) {
    if (with_certificate) {
      SSL_CTX_use_certificate_file(ctx_, TlsFile("client.crt").c_str(), SSL_FILETYPE_PEM);
      SSL_CTX_use_PrivateKey_file(ctx_, TlsFile("client.key").c_str(), SSL_FILETYPE_PEM);
    }
    static const unsigned char kH2[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(ctx_, kH2, sizeof kH2);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd);
    timeval wait{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    handshaken_ = SSL_connect(ssl_) == 1;
  }
  ~TlsClient() {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
    close(fd_);
  }
  bool handshaken() const { return handshaken_; }
  void Write(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const int n = SSL_write(ssl_, bytes.data() + sent, static_cast<int>(bytes.size() - sent));
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }
  // Until `want` bytes, the end, or 10 s of nothing.
  std::string Read(size_t want) {
    std::string got;
    char buffer[1 << 14];
    while (got.size() < want) {
      const int n =
          SSL_read(ssl_, buffer, static_cast<int>(std::min(sizeof buffer, want - got.size())));
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
    }
    return got;
  }
  // Whether the server ended the connection (rather than 10 s passing).
  bool Ended() {
    char buffer[1 << 14];
    for (;;) {
      const int n = SSL_read(ssl_, buffer, sizeof buffer);
      if (n > 0) continue;
      const int error = SSL_get_error(ssl_, n);
      return !(error == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK));
    }
  }

 private:
  const int fd_;
  SSL_CTX* const ctx_;
  SSL* ssl_ = nullptr;
  bool handshaken_ = false;
};

// The name gRPC gives the peer of a handed-over end.
std::string PeerOf(int fd) {
  sockaddr_un peer{};
  socklen_t length = sizeof peer;
  getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length);
  const size_t path = offsetof(sockaddr_un, sun_path);
  return length > path + 1 ? "unix-abstract:" + std::string(peer.sun_path + 1, length - path - 1)
                           : std::string("unix:");
}

TEST_P(FrontTest, OverTlsWhatItDecryptsIsRelayedAndItsBoundsHold) {
  auto tls = MakeTlsServerContext({TlsFile("server.crt"), TlsFile("server.key"), ""}, "gRPC", false,
                                  absl::string_view("\x02h2", 3));
  ASSERT_TRUE(tls.ok()) << tls.status();
  tls_ = *std::move(tls);
  Http2FrontOptions options;
  options.tls = tls_.get();
  options.limits.resets_per_second = 5;  // A burst of 10.
  StartFront(options);
  TlsClient calm(Connect(), /*with_certificate=*/false);
  ASSERT_TRUE(calm.handshaken());
  // More than a TLS record and than the relay holds at once.
  std::string call =
      std::string(kPreface) + Frame(kSettings, 0, 0) + Frame(kHeaders, kEndHeaders, 1, "h");
  for (int i = 0; i < 40; ++i) call += Frame(kData, 0, 1, std::string(16000, static_cast<char>(i)));
  std::thread writer([&] { calm.Write(call); });  // Blocks until the server end reads.
  const int calm_server = Handed(0);
  EXPECT_EQ(Read(calm_server, call.size()), call);
  writer.join();
  ASSERT_GE(calm_server, 0);
  const std::string answer = Frame(kData, 0, 1, std::string(100000, 'a'));
  std::thread answerer([&] { WriteAll(calm_server, answer); });
  EXPECT_EQ(calm.Read(answer.size()), answer);
  answerer.join();
  // The ledger reads what TLS carries: a reset flood is closed.
  TlsClient flood(Connect(), /*with_certificate=*/false);
  ASSERT_TRUE(flood.handshaken());
  std::string resets = std::string(kPreface) + Frame(kSettings, 0, 0);
  for (uint32_t stream = 1; stream < 200; stream += 2) {
    resets += Frame(kHeaders, kEndHeaders, stream, "h") + testing::Reset(stream);
  }
  flood.Write(resets);
  EXPECT_TRUE(flood.Ended());
  EXPECT_EQ(stats_.closed_for_resets.load(), 1);
  // A client speaking plain HTTP/2 gets no further than the handshake.
  const int plain = Connect();
  WriteAll(plain, std::string(kPreface) + Frame(kSettings, 0, 0));
  EXPECT_TRUE(Ended(plain));
  close(plain);
  // The calm connection relays on.
  WriteAll(calm_server, "more");
  EXPECT_EQ(calm.Read(4), "more");
}

TEST_P(FrontTest, OverTlsACallsClientCertificateIsFoundByItsPeer) {
  auto tls = MakeTlsServerContext({TlsFile("server.crt"), TlsFile("server.key"), TlsFile("ca.crt")},
                                  "gRPC", /*require_client_certificate=*/true,
                                  absl::string_view("\x02h2", 3));
  ASSERT_TRUE(tls.ok()) << tls.status();
  tls_ = *std::move(tls);
  Http2FrontOptions options;
  options.tls = tls_.get();
  options.name_peers = true;
  StartFront(options);
  auto client = std::make_unique<TlsClient>(Connect(), /*with_certificate=*/true);
  ASSERT_TRUE(client->handshaken());
  client->Write(std::string(kPreface));
  const int server = Handed(0);
  ASSERT_GE(server, 0);
  ASSERT_EQ(Read(server, 24), std::string(kPreface));
  const std::string peer = PeerOf(server);
  EXPECT_EQ(front_->ClientCertificate(peer), ReadFile(TlsFile("client.crt"))) << peer;
  EXPECT_EQ(front_->ClientCertificate("unix:"), "");
  // Without a certificate, no further than the handshake.
  TlsClient anonymous(Connect(), /*with_certificate=*/false);
  EXPECT_TRUE(anonymous.Ended());
  // Once the connection is gone, so is its certificate.
  client.reset();
  EXPECT_TRUE(Ended(server));
  for (int i = 0; i < 100 && !front_->ClientCertificate(peer).empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(front_->ClientCertificate(peer), "");
}

INSTANTIATE_TEST_SUITE_P(RelayThreads, FrontTest, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Threads");
                         });

}  // namespace
}  // namespace precompile::server
