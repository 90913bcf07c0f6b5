// The HTTP transport on loopback with raw sockets: what a client that
// follows no library's rules can send, and what it gets back.
#include "server/http/http_transport.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace precompile::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Echoes "<method> <path> <body>" from a worker; GET /probe is answered by
// Screen, POST /refuse-early is refused by Screen, POST /hold waits until
// Release() (recording whether the client had gone by then), and GET /big/N
// answers N bytes.
class EchoHandler final : public HttpHandler {
 public:
  std::optional<HttpAnswer> Screen(const HttpRequest& request) override {
    if (request.head.path == "/probe")
      return HttpAnswer{200, "text/plain", absl::Cord("alive"), {}};
    if (request.head.path == "/refuse-early")
      return HttpAnswer{415, "text/plain", absl::Cord("no"), {}};
    return std::nullopt;
  }
  void Handle(HttpExchange& exchange) override {
    const HttpRequest& request = exchange.request();
    if (request.head.path == "/hold") {
      std::unique_lock<std::mutex> lock(mu_);
      ++holding_;
      changed_.notify_all();
      changed_.wait(lock, [this] { return released_; });
      --holding_;
      saw_cancelled_ = exchange.cancelled();
      changed_.notify_all();
    }
    if (request.head.path == "/throw") throw std::runtime_error("secret detail");
    if (absl::StartsWith(request.head.path, "/big/")) {
      size_t size = 0;
      if (absl::SimpleAtoi(request.head.path.substr(5), &size)) {
        return exchange.Answer(
            HttpAnswer{200, "text/plain", absl::Cord(std::string(size, 'z')), {}});
      }
    }
    if (absl::StartsWith(request.head.path, "/pieces/")) {
      size_t n = 0;
      if (absl::SimpleAtoi(request.head.path.substr(8), &n)) {
        return exchange.Answer(HttpAnswer{200, "text/plain", BorrowedPieces(n), {}});
      }
    }
    exchange.Answer(HttpAnswer{
        200,
        "text/plain",
        absl::Cord(absl::StrCat(request.head.method, " ", request.head.path, " ", request.body)),
        {}});
  }
  HttpAnswer Refusal(int status, absl::string_view message) override {
    return HttpAnswer{status, "text/plain", absl::Cord(message), {}};
  }

  void AwaitHolding(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return holding_ == n; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }
  bool saw_cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return saw_cancelled_;
  }
  // How many pieces of /pieces/ answers were made, and are still held.
  int pieces_made() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(pieces_.size());
  }
  int pieces_held() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(std::count_if(pieces_.begin(), pieces_.end(),
                                          [](const auto& piece) { return !piece.expired(); }));
  }

 private:
  // `n` pieces of 1000 bytes ('a', 'b', ...), each borrowed from a buffer of
  // its own that the answer holds until written (large enough that the Cord
  // does not copy them).
  absl::Cord BorrowedPieces(size_t n) {
    absl::Cord body;
    for (size_t i = 0; i < n; ++i) {
      auto piece = std::make_shared<const std::string>(1000, static_cast<char>('a' + i % 26));
      {
        std::lock_guard<std::mutex> lock(mu_);
        pieces_.push_back(piece);
      }
      body.Append(absl::MakeCordFromExternal(*piece, [piece] {}));
    }
    return body;
  }

  std::mutex mu_;
  std::condition_variable changed_;
  int holding_ = 0;
  bool released_ = false;
  bool saw_cancelled_ = false;
  std::vector<std::weak_ptr<const std::string>> pieces_;
};

// A blocking client socket on loopback.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }

  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  void ShutdownWrite() { shutdown(fd_, SHUT_WR); }

  // One answer: the head and as many body bytes as its Content-Length says;
  // "" when the server closes first or nothing comes within `timeout`.
  std::string Answer(absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const size_t end = buffer_.find("\r\n\r\n");
      if (end != std::string::npos) {
        size_t length = 0;
        const size_t field = buffer_.find("Content-Length: ");
        if (field != std::string::npos && field < end) {
          length = std::stoul(buffer_.substr(field + 16, 20));  // Not the whole buffer.
        }
        const bool head_only = buffer_.compare(0, 12, "HTTP/1.1 100") == 0 || head_only_;
        const size_t total = end + 4 + (head_only ? 0 : length);
        if (buffer_.size() >= total) {
          std::string answer = buffer_.substr(0, total);
          buffer_.erase(0, total);
          return answer;
        }
      }
      if (!ReadMore(deadline)) return "";
    }
  }
  void set_head_only(bool head_only) { head_only_ = head_only; }

  // Whether the server closes the connection (within `timeout`), dropping
  // whatever it still sends.
  bool Closed(absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (ms <= 0 || poll(&p, 1, ms) <= 0) return false;
      char chunk[4096];
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return true;
    }
  }

 private:
  bool ReadMore(absl::Time deadline) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0 || poll(&p, 1, ms) <= 0) return false;
    char chunk[65536];
    const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool head_only_ = false;
  std::string buffer_;
};

class HttpTransportTest : public ::testing::Test {
 protected:
  void Start(HttpTransportOptions options = {}) {
    options.address = "127.0.0.1:0";
    options.workers = options.workers == 64 ? 2 : options.workers;
    auto started = HttpTransport::Start(options, handler_);
    ASSERT_TRUE(started.ok()) << started.status();
    transport_ = *std::move(started);
  }
  void TearDown() override {
    handler_.Release();
    if (transport_) transport_->Stop(absl::Now());
  }
  int port() const { return transport_->port(); }

  EchoHandler handler_;
  std::unique_ptr<HttpTransport> transport_;
};

std::string Post(absl::string_view path, absl::string_view body) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(),
                      "\r\n\r\n", body);
}

TEST_F(HttpTransportTest, AnswersKeptAliveAndPipelinedRequestsInOrder) {
  Start();
  Client client(port());
  ASSERT_TRUE(client.Send(Post("/a", "one")));
  EXPECT_THAT(client.Answer(), HasSubstr("POST /a one"));
  ASSERT_TRUE(client.Send(Post("/b", "two") + "GET /probe HTTP/1.1\r\n\r\n" + Post("/c", "3")));
  EXPECT_THAT(client.Answer(), HasSubstr("POST /b two"));
  EXPECT_THAT(client.Answer(), HasSubstr("alive"));
  EXPECT_THAT(client.Answer(), HasSubstr("POST /c 3"));
}

// An answer of pieces borrowed from elsewhere (as a model's outputs are),
// more than one write takes, arrives whole and in order, and each piece's
// buffer is let go once written.
TEST_F(HttpTransportTest, AnswersOfBorrowedPiecesArriveWholeAndLetThemGo) {
  Start();
  Client client(port());
  ASSERT_TRUE(client.Send("GET /pieces/40 HTTP/1.1\r\n\r\n"));
  const std::string answer = client.Answer();
  ASSERT_THAT(answer, HasSubstr("Content-Length: 40000\r\n"));
  std::string expected;
  for (int i = 0; i < 40; ++i) expected.append(1000, static_cast<char>('a' + i % 26));
  EXPECT_EQ(answer.substr(answer.find("\r\n\r\n") + 4), expected);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (handler_.pieces_held() > 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(handler_.pieces_held(), 0);
}

// A client that does not read an answer larger than the sockets take keeps
// no borrowed piece: what waits is copied out of them (a model's outputs go
// back to the memory model calls may hold) and still arrives whole.
TEST_F(HttpTransportTest, AnAnswerAClientDoesNotReadLetsItsBorrowedPiecesGo) {
  Start();
  Client slow(port());
  constexpr int kPieces = 64 << 10;  // 64 MiB, of 1000 bytes each.
  ASSERT_TRUE(slow.Send(absl::StrCat("GET /pieces/", kPieces, " HTTP/1.1\r\n\r\n")));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while ((handler_.pieces_made() < kPieces || handler_.pieces_held() > 0) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(handler_.pieces_held(), 0) << "the unread answer still borrows its pieces";
  const std::string answer = slow.Answer(absl::Seconds(60));
  const std::string body = answer.substr(answer.find("\r\n\r\n") + 4);
  ASSERT_EQ(body.size(), size_t{kPieces} * 1000);
  for (int i = 0; i < kPieces; i += 997) {
    ASSERT_EQ(body[static_cast<size_t>(i) * 1000 + 999], static_cast<char>('a' + i % 26))
        << "piece " << i;
  }
}

// A request sent while the one before it is handled waits in the socket:
// the connection thread stops watching it (level-triggered, it would be
// woken for it again and again, a core spent until the answer) and reads it
// once the first is answered.
TEST_F(HttpTransportTest, ARequestSentWhileTheLastIsHandledWaitsWithoutSpinning) {
  Start();
  Client client(port());
  ASSERT_TRUE(client.Send("GET /hold HTTP/1.1\r\n\r\n"));
  handler_.AwaitHolding(1);
  ASSERT_TRUE(client.Send(Post("/next", "2")));
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  absl::SleepFor(absl::Milliseconds(500));
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  const absl::Duration cpu =
      absl::DurationFromTimeval(after.ru_utime) + absl::DurationFromTimeval(after.ru_stime) -
      absl::DurationFromTimeval(before.ru_utime) - absl::DurationFromTimeval(before.ru_stime);
  EXPECT_LT(cpu, absl::Milliseconds(200)) << "the process was busy while nothing was to be done";
  handler_.Release();
  EXPECT_THAT(client.Answer(), HasSubstr("GET /hold"));
  EXPECT_THAT(client.Answer(), HasSubstr("POST /next 2"));
}

TEST_F(HttpTransportTest, HeadIsAnsweredAsGetWithoutTheBody) {
  Start();
  Client client(port());
  client.set_head_only(true);
  ASSERT_TRUE(client.Send("HEAD /x HTTP/1.1\r\n\r\n"));
  const std::string answer = client.Answer();
  EXPECT_THAT(answer, HasSubstr("Content-Length: 7\r\n"));  // of "GET /x ", not sent
  EXPECT_THAT(answer, testing::EndsWith("\r\n\r\n"));
  // The next request's answer has its body again, a refusal's too.
  client.set_head_only(false);
  ASSERT_TRUE(client.Send("GET /x HTTP/1.1\r\nBad Name: 1\r\n\r\n"));
  EXPECT_THAT(client.Answer(), AllOf(StartsWith("HTTP/1.1 400"), HasSubstr("token for a name")));
}

TEST_F(HttpTransportTest, HeadsOverTheLimitsAreRefusedAndTheConnectionClosed) {
  HttpTransportOptions options;
  options.max_head_bytes = 1024;
  options.max_fields = 4;
  Start(options);
  {
    Client client(port());
    // A header line that never ends: cut off at the limit, not buffered.
    ASSERT_TRUE(client.Send("GET / HTTP/1.1\r\nX: " + std::string(4096, 'a')));
    const std::string answer = client.Answer();
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 431"));
    EXPECT_THAT(answer, HasSubstr("more than the server's limit of 1024 bytes"));
    EXPECT_TRUE(client.Closed());
  }
  {
    Client client(port());
    ASSERT_TRUE(client.Send("GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n"));
    EXPECT_THAT(client.Answer(), AllOf(StartsWith("HTTP/1.1 431"), HasSubstr("more than 4")));
    EXPECT_TRUE(client.Closed());
  }
  {
    Client client(port());
    ASSERT_TRUE(client.Send("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"));
    EXPECT_THAT(client.Answer(), AllOf(StartsWith("HTTP/1.1 400"), HasSubstr("two different")));
    EXPECT_TRUE(client.Closed());
  }
}

TEST_F(HttpTransportTest, BodiesAreRefusedFromTheHeadAndNotTakenForTheNextRequest) {
  HttpTransportOptions options;
  options.max_body_bytes = 100;
  Start(options);
  {
    Client client(port());
    // The body that follows would read as a request if the connection stayed.
    ASSERT_TRUE(client.Send("POST /a HTTP/1.1\r\nContent-Length: 101\r\n\r\n"
                            "GET /probe HTTP/1.1\r\n\r\n"));
    const std::string answer = client.Answer();
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 413"));
    EXPECT_THAT(answer, HasSubstr("101 bytes, more than the server's limit of 100 bytes "
                                  "(--max_message_bytes)"));
    EXPECT_THAT(answer, HasSubstr("Connection: close"));
    EXPECT_TRUE(client.Closed());
  }
  {
    Client client(port());
    ASSERT_TRUE(client.Send("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                            "3\r\nabc\r\n0\r\n\r\n"));
    EXPECT_THAT(client.Answer(), AllOf(StartsWith("HTTP/1.1 411"), HasSubstr("Content-Length")));
    EXPECT_TRUE(client.Closed());
  }
  {
    Client client(port());
    ASSERT_TRUE(client.Send(Post("/refuse-early", "GET /probe HTTP/1.1\r\n\r\n")));
    EXPECT_THAT(client.Answer(), StartsWith("HTTP/1.1 415"));
    EXPECT_TRUE(client.Closed());
  }
}

TEST_F(HttpTransportTest, SlowAndIdleClientsLoseTheirConnections) {
  HttpTransportOptions options;
  options.request_timeout = absl::Seconds(1);
  Start(options);
  Client slow(port());
  Client silent(port());
  Client body(port());
  ASSERT_TRUE(slow.Send("GET / HTTP/1.1\r\nX-Sl"));
  ASSERT_TRUE(body.Send("POST /a HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"));
  const absl::Time started = absl::Now();
  // One byte more now and then does not keep a request alive.
  for (int i = 0; i < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(300));
    slow.Send("o");
  }
  EXPECT_THAT(slow.Answer(), AllOf(StartsWith("HTTP/1.1 408"), HasSubstr("within 1s")));
  EXPECT_THAT(body.Answer(), StartsWith("HTTP/1.1 408"));
  EXPECT_TRUE(silent.Closed());
  EXPECT_LT(absl::Now() - started, absl::Seconds(5));
}

TEST_F(HttpTransportTest, ProbesAreAnsweredWhileEveryWorkerIsBusy) {
  HttpTransportOptions options;
  options.workers = 1;
  Start(options);
  Client busy(port());
  ASSERT_TRUE(busy.Send(Post("/hold", "")));
  handler_.AwaitHolding(1);
  Client probe(port());
  ASSERT_TRUE(probe.Send("GET /probe HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(probe.Answer(absl::Seconds(5)), HasSubstr("alive"));
  handler_.Release();
  EXPECT_THAT(busy.Answer(), HasSubstr("POST /hold"));
}

TEST_F(HttpTransportTest, AClientThatGoesCancelsItsRequest) {
  Start();
  {
    Client client(port());
    ASSERT_TRUE(client.Send(Post("/hold", "")));
    handler_.AwaitHolding(1);
  }
  // The loop notices the close within a turn.
  absl::SleepFor(absl::Milliseconds(500));
  handler_.Release();
  handler_.AwaitHolding(0);
  EXPECT_TRUE(handler_.saw_cancelled());
  Client next(port());
  ASSERT_TRUE(next.Send(Post("/a", "after")));
  EXPECT_THAT(next.Answer(), HasSubstr("POST /a after"));
}

TEST_F(HttpTransportTest, AnswersAClientDoesNotReadCountAgainstTheBudgetUntilSentOrDropped) {
  HttpTransportOptions options;
  options.max_body_buffer_bytes = 1 << 20;
  Start(options);
  // 64 MiB: more than loopback's socket buffers take, so most of it stays
  // in the server while the client reads nothing.
  constexpr size_t kBig = size_t{64} << 20;
  auto next_answer = [this] {
    Client next(port());
    EXPECT_TRUE(next.Send(Post("/a", "x")));
    return next.Answer();
  };
  auto eventually = [&](absl::string_view start) {
    for (int i = 0; i < 200; ++i) {
      if (absl::StartsWith(next_answer(), start)) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  };
  {
    Client silent(port());
    ASSERT_TRUE(silent.Send(absl::StrCat("GET /big/", kBig, " HTTP/1.1\r\n\r\n")));
    ASSERT_TRUE(eventually("HTTP/1.1 429")) << "its answer never counted";
    EXPECT_THAT(next_answer(), HasSubstr("request bodies and unsent answers"));
    // Read whole, it counts no more.
    const std::string answer = silent.Answer(absl::Seconds(60));
    EXPECT_EQ(answer.size() - answer.find("\r\n\r\n") - 4, kBig);
    EXPECT_THAT(next_answer(), StartsWith("HTTP/1.1 200"));
  }
  {
    Client silent(port());
    ASSERT_TRUE(silent.Send(absl::StrCat("GET /big/", kBig, " HTTP/1.1\r\n\r\n")));
    ASSERT_TRUE(eventually("HTTP/1.1 429"));
  }  // Gone without reading: its answer is dropped, and counts no more.
  EXPECT_TRUE(eventually("HTTP/1.1 200"));
}

TEST_F(HttpTransportTest, BodiesHeldAtOnceStayWithinTheBudget) {
  HttpTransportOptions options;
  options.max_body_buffer_bytes = 100;
  Start(options);
  Client first(port());
  ASSERT_TRUE(first.Send("POST /a HTTP/1.1\r\nContent-Length: 60\r\n\r\nstill coming"));
  absl::SleepFor(absl::Milliseconds(200));
  Client second(port());
  ASSERT_TRUE(second.Send("POST /b HTTP/1.1\r\nContent-Length: 60\r\n\r\n"));
  const std::string refused = second.Answer();
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 429"));
  EXPECT_THAT(refused,
              HasSubstr("as many bytes of request bodies and unsent answers as it may (100)"));
  // The first's share comes back once it is answered.
  ASSERT_TRUE(first.Send(std::string(60 - 12, 'x')));
  EXPECT_THAT(first.Answer(), HasSubstr("POST /a still coming"));
  Client third(port());
  ASSERT_TRUE(third.Send(Post("/c", std::string(60, 'y'))));
  EXPECT_THAT(third.Answer(), HasSubstr("POST /c yyy"));
}

TEST_F(HttpTransportTest, AFloodOfHalfSentRequestsCannotKeepAProbeOut) {
  HttpTransportOptions options;
  options.max_connections = 8;
  Start(options);
  std::vector<std::unique_ptr<Client>> flood;
  for (int i = 0; i < 8; ++i) {
    flood.push_back(std::make_unique<Client>(port()));
    ASSERT_TRUE(flood.back()->Send("GET / HTTP/1.1\r\nX: "));
  }
  absl::SleepFor(absl::Milliseconds(300));
  Client probe(port());
  ASSERT_TRUE(probe.Send("GET /probe HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(probe.Answer(absl::Seconds(5)), HasSubstr("alive"));
  // The one that waited longest made room.
  EXPECT_TRUE(flood.front()->Closed(absl::Seconds(1)));
}

TEST_F(HttpTransportTest, ExpectContinueGetsTheGoAheadBeforeTheBody) {
  Start();
  Client client(port());
  ASSERT_TRUE(client.Send("POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"));
  EXPECT_THAT(client.Answer(), StartsWith("HTTP/1.1 100 Continue"));
  ASSERT_TRUE(client.Send("body"));
  EXPECT_THAT(client.Answer(), HasSubstr("POST /a body"));
}

TEST_F(HttpTransportTest, AHandlerThatThrowsGetsA500WithoutItsText) {
  Start();
  Client client(port());
  ASSERT_TRUE(client.Send(Post("/throw", "")));
  const std::string answer = client.Answer();
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 500"));
  EXPECT_THAT(answer, Not(HasSubstr("secret detail")));
  ASSERT_TRUE(client.Send(Post("/a", "next")));
  EXPECT_THAT(client.Answer(), HasSubstr("POST /a next"));
}

TEST_F(HttpTransportTest, StopWaitsForTheRequestsBeingHandledAndClosesTheRest) {
  Start();
  Client busy(port());
  Client idle(port());
  ASSERT_TRUE(busy.Send(Post("/hold", "")));
  handler_.AwaitHolding(1);
  std::thread stopper([this] { transport_->Stop(absl::Now()); });
  EXPECT_TRUE(idle.Closed());
  handler_.Release();
  const std::string answer = busy.Answer();
  EXPECT_THAT(answer, HasSubstr("POST /hold"));
  EXPECT_THAT(answer, HasSubstr("Connection: close"));
  stopper.join();
  Client late(port());
  EXPECT_FALSE(late.connected());
}

// A client sending its request when the stop begins is answered, not cut
// off mid-request (its connection then closes); one that never finishes is
// closed at the stop's deadline.
TEST_F(HttpTransportTest, StopAnswersARequestPartlyReceivedAndClosesOneUnfinishedAtTheDeadline) {
  Start();
  Client sending(port());
  Client stalled(port());
  const std::string request = Post("/a", "the body");
  ASSERT_TRUE(sending.Send(request.substr(0, request.size() - 4)));
  ASSERT_TRUE(stalled.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Le"));
  // Both partial requests are in before the stop begins.
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  std::thread stopper([&] { transport_->Stop(deadline); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(sending.Send(request.substr(request.size() - 4)));
  const std::string answer = sending.Answer();
  EXPECT_THAT(answer, HasSubstr("POST /a the body"));
  EXPECT_THAT(answer, HasSubstr("Connection: close"));
  EXPECT_TRUE(sending.Closed());
  EXPECT_TRUE(stalled.Closed());
  stopper.join();
  EXPECT_GE(absl::Now(), deadline);
}

// A keep-alive client between two requests when the stop begins: its next
// request, sent just after, is answered (the answer closing the connection)
// instead of finding the connection closed under it; a connection that stays
// idle is closed soon after.
TEST_F(HttpTransportTest, StopAnswersTheNextRequestOfAConnectionIdleWhenItBegan) {
  Start();
  Client busy(port());
  Client quiet(port());
  ASSERT_TRUE(busy.Send(Post("/a", "first")));
  EXPECT_THAT(busy.Answer(), HasSubstr("POST /a first"));
  ASSERT_TRUE(quiet.Send(Post("/a", "only")));
  EXPECT_THAT(quiet.Answer(), HasSubstr("POST /a only"));
  std::thread stopper([this] { transport_->Stop(absl::Now() + absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(busy.Send(Post("/a", "next")));
  const std::string answer = busy.Answer();
  EXPECT_THAT(answer, HasSubstr("POST /a next"));
  EXPECT_THAT(answer, HasSubstr("Connection: close"));
  EXPECT_TRUE(busy.Closed());
  EXPECT_TRUE(quiet.Closed());
  stopper.join();
}

}  // namespace
}  // namespace precompile::server
