// TLS for the server's own transports (the HTTP port, the gRPC port's front):
// one way to make the context and to read a client's certificate, so that a
// client reads the same over both.
#ifndef PRECOMPILE_BASE_TLS_SERVER_H_
#define PRECOMPILE_BASE_TLS_SERVER_H_

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace precompile {

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
using SslContext = std::unique_ptr<SSL_CTX, SslCtxFree>;
using SslConnection = std::unique_ptr<SSL, SslFree>;

struct TlsServerFiles {
  // PEM files.
  std::string cert_file;
  std::string key_file;
  // Empty: clients are not asked for a certificate.
  std::string client_ca_file;
};

// TLS 1.2 or later, no renegotiation, partial writes from a buffer that may
// move. With a client CA, client certificates are asked for and checked when
// given, and refused at the handshake if `require_client_certificate`.
// `alpn`: the protocol to select (in ALPN's wire form, e.g. "\x02h2"), which
// a client must offer; empty for none. Errors name `serving` ("HTTPS").
absl::StatusOr<SslContext> MakeTlsServerContext(const TlsServerFiles& files,
                                                absl::string_view serving,
                                                bool require_client_certificate,
                                                absl::string_view alpn = {});

// The certificate the client presented, written as gRPC writes its clients'
// (x509_pem_cert); empty without one.
std::string PeerCertificatePem(SSL* ssl);

}  // namespace precompile

#endif  // PRECOMPILE_BASE_TLS_SERVER_H_
