// What the gRPC front's relay threads can move (server/grpc/http2_front.h),
// against loopback TCP without it: HTTP/2 DATA frames of 16 KiB (gRPC's
// frame size) written as fast as a client can, to a sink in gRPC's place that
// reads and drops them, or from such a source to a client that does. Each
// line: direction, connections, route (`loopback`, `frontN` for a front
// relaying on N threads, `frontN+tls` for one ending TLS, the client's
// encryption included), GB/s over `--seconds`.
//
//   bazel build --config=opt //bench:front_relay_bench
//   bazel-bin/bench/front_relay_bench [--seconds=3] [--connections=1,4,16]
//       [--relay_threads=1,4] [--tls]
//
// The client threads, the sink threads and the relay share the machine's
// cores: on 2 cores it gives a lower bound on the relay's ceiling.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/tls_server.h"
#include "server/grpc/http2_front.h"
#include "server/grpc/http2_test_frames.h"

ABSL_FLAG(int, seconds, 3, "Seconds per measurement");
ABSL_FLAG(std::vector<std::string>, connections, std::vector<std::string>({"1", "4", "16"}),
          "Connections moving bytes at once, one measurement each");
ABSL_FLAG(std::vector<std::string>, relay_threads, std::vector<std::string>({"1"}),
          "The fronts measured: each relays on this many threads");
ABSL_FLAG(bool, tls, false, "Each front also ending TLS (a self-signed P-256 certificate)");

namespace {

using precompile::server::testing::Frame;
using precompile::server::testing::kPreface;

// 64 DATA frames of 16 KiB on stream 1: what a large ModelInfer request or
// answer looks like on the wire, 1 MiB a write.
const std::string& DataFrames() {
  static const std::string* frames = [] {
    auto* s = new std::string;
    for (int i = 0; i < 64; ++i) *s += Frame(0, 0, 1, std::string(16384, 'x'));
    return s;
  }();
  return *frames;
}

// One end of a connection: its socket, and TLS over it on a TLS client's.
// Each is used by one thread at a time.
struct End {
  int fd = -1;
  SSL* ssl = nullptr;
  ssize_t Write(const char* data, size_t size) const {
    return ssl != nullptr ? SSL_write(ssl, data, static_cast<int>(size))
                          : send(fd, data, size, MSG_NOSIGNAL);
  }
  ssize_t Read(char* into, size_t room) const {
    return ssl != nullptr ? SSL_read(ssl, into, static_cast<int>(room)) : recv(fd, into, room, 0);
  }
};

bool WriteAll(const End& end, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = end.Write(data, size);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Writes frames until `stop`.
void Source(End end, const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
    if (!WriteAll(end, DataFrames().data(), DataFrames().size())) return;
  }
}

// Reads and drops until the end, counting into `bytes`.
void Sink(End end, std::atomic<int64_t>& bytes) {
  std::unique_ptr<char[]> buffer(new char[1 << 20]);
  for (;;) {
    const ssize_t n = end.Read(buffer.get(), 1 << 20);
    if (n <= 0) return;
    bytes.fetch_add(n, std::memory_order_relaxed);
  }
}

// The server's TLS context (base/tls_server.h, ALPN "h2", as
// server/server.cc makes it for the front), for a self-signed certificate
// made here and written to a directory of its own: the bench needs no files.
precompile::SslContext SelfSignedContext() {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), &X509_free);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_sign(cert.get(), key.get(), EVP_sha256());
  std::string directory = absl::StrCat(getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp",
                                       "/front_relay_bench.XXXXXX");
  if (mkdtemp(directory.data()) == nullptr) return nullptr;
  const precompile::TlsServerFiles files{directory + "/server.crt", directory + "/server.key", ""};
  FILE* cert_file = fopen(files.cert_file.c_str(), "w");
  FILE* key_file = fopen(files.key_file.c_str(), "w");
  const bool written =
      cert_file != nullptr && key_file != nullptr && PEM_write_X509(cert_file, cert.get()) == 1 &&
      PEM_write_PrivateKey(key_file, key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (cert_file != nullptr) fclose(cert_file);
  if (key_file != nullptr) fclose(key_file);
  absl::StatusOr<precompile::SslContext> ctx =
      written ? precompile::MakeTlsServerContext(files, "the bench's front", false,
                                                 absl::string_view("\x02h2", 3))
              : absl::InternalError("cannot write the certificate");
  unlink(files.cert_file.c_str());
  unlink(files.key_file.c_str());
  rmdir(directory.c_str());
  if (!ctx.ok()) {
    fprintf(stderr, "%s\n", std::string(ctx.status().message()).c_str());
    return nullptr;
  }
  return *std::move(ctx);
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return -1;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// The server ends of the connections: handed over by the front, or accepted
// from a plain listener.
class ServerEnds {
 public:
  void Add(int fd) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    std::lock_guard<std::mutex> lock(mu_);
    fds_.push_back(fd);
  }
  std::vector<int> Wait(size_t count) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (fds_.size() >= count || absl::Now() > deadline) {
          std::vector<int> taken;
          taken.swap(fds_);
          return taken;
        }
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

 private:
  std::mutex mu_;
  std::vector<int> fds_;
};

// Moves bytes over `count` connections to `port` for `seconds`, upward
// (client to server end) or downward; returns GB/s.
// With `tls`, the clients speak TLS.
double Measure(int port, ServerEnds& ends, int count, bool upward, absl::Duration seconds,
               SSL_CTX* tls = nullptr) {
  std::vector<End> clients;
  const std::string hello = std::string(kPreface) + Frame(4, 0, 0, "") + Frame(1, 4, 1, "h");
  for (int i = 0; i < count; ++i) {
    End client{Connect(port)};
    if (tls != nullptr) {
      client.ssl = SSL_new(tls);
      SSL_set_fd(client.ssl, client.fd);
      if (SSL_connect(client.ssl) != 1) return -1;
    }
    clients.push_back(client);
    WriteAll(client, hello.data(), hello.size());
  }
  std::vector<int> servers = ends.Wait(clients.size());
  if (servers.size() != clients.size()) return -1;
  for (int fd : servers) {  // The hello, which a sink below would count.
    std::string got(hello.size(), '\0');
    recv(fd, got.data(), got.size(), MSG_WAITALL);
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> bytes{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < clients.size(); ++i) {
    const End server{servers[i]};
    const End from = upward ? clients[i] : server;
    const End to = upward ? server : clients[i];
    threads.emplace_back([from, &stop] { Source(from, stop); });
    threads.emplace_back([to, &bytes] { Sink(to, bytes); });
  }
  absl::SleepFor(absl::Milliseconds(200));  // Under way.
  const int64_t start_bytes = bytes.load();
  const absl::Time start = absl::Now();
  absl::SleepFor(seconds);
  const double gb_per_s = static_cast<double>(bytes.load() - start_bytes) / 1e9 /
                          absl::ToDoubleSeconds(absl::Now() - start);
  stop.store(true);
  for (size_t i = 0; i < clients.size(); ++i) {
    shutdown(clients[i].fd, SHUT_RDWR);
    shutdown(servers[i], SHUT_RDWR);
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < clients.size(); ++i) {
    SSL_free(clients[i].ssl);
    close(clients[i].fd);
    close(servers[i]);
  }
  return gb_per_s;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Duration seconds = absl::Seconds(absl::GetFlag(FLAGS_seconds));

  const precompile::SslContext server_tls = SelfSignedContext();
  if (server_tls == nullptr) return 1;
  const precompile::SslContext client_tls(SSL_CTX_new(TLS_client_method()));
  struct Front {
    std::string route;
    bool tls;
    ServerEnds ends;
    precompile::server::Http2FrontStats stats;
    std::unique_ptr<precompile::server::Http2Front> front;
  };
  std::vector<std::unique_ptr<Front>> fronts;
  for (const std::string& threads_text : absl::GetFlag(FLAGS_relay_threads)) {
    for (bool tls : {false, true}) {
      if (tls && !absl::GetFlag(FLAGS_tls)) continue;
      auto& f = *fronts.emplace_back(std::make_unique<Front>());
      f.route = absl::StrCat("front", threads_text, tls ? "+tls" : "");
      f.tls = tls;
      precompile::server::Http2FrontOptions options;
      options.address = "127.0.0.1:0";
      options.relay_threads = std::stoi(threads_text);
      if (tls) options.tls = server_tls.get();
      auto started = precompile::server::Http2Front::Start(
          options, [ends = &f.ends](int fd) { ends->Add(fd); }, f.stats);
      if (!started.ok()) {
        std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
        return 1;
      }
      f.front = *std::move(started);
    }
  }

  // Plain loopback TCP: a listener whose accepted connections are the
  // server ends.
  ServerEnds direct;
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  socklen_t length = sizeof address;
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(listener, 128) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    std::perror("listen");
    return 1;
  }
  std::thread acceptor([&] {
    for (;;) {
      const int fd = accept(listener, nullptr, nullptr);
      if (fd < 0) return;
      direct.Add(fd);
    }
  });

  std::printf("direction connections route GB/s\n");
  for (const std::string& count_text : absl::GetFlag(FLAGS_connections)) {
    const int count = std::stoi(count_text);
    for (bool upward : {true, false}) {
      const char* direction = upward ? "up" : "down";
      const double plain = Measure(ntohs(address.sin_port), direct, count, upward, seconds);
      std::printf("%s %d loopback %.2f\n", direction, count, plain);
      for (auto& f : fronts) {
        const double relayed = Measure(f->front->port(), f->ends, count, upward, seconds,
                                       f->tls ? client_tls.get() : nullptr);
        std::printf("%s %d %s %.2f\n", direction, count, f->route.c_str(), relayed);
      }
      std::fflush(stdout);
    }
  }
  shutdown(listener, SHUT_RDWR);
  close(listener);
  acceptor.join();
  return 0;
}
