#include "base/tls_server.h"

#include <openssl/bio.h>
#include <openssl/pem.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace precompile {
namespace {

// Selects the one protocol the context was made for (its ALPN wire form is
// the callback's argument), or refuses the handshake.
int SelectAlpn(SSL*, const unsigned char** out, unsigned char* out_length, const unsigned char* in,
               unsigned int in_length, void* wanted) {
  const auto* protocol = static_cast<const std::string*>(wanted);
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(
          &selected, out_length, reinterpret_cast<const unsigned char*>(protocol->data()),
          static_cast<unsigned int>(protocol->size()), in, in_length) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

absl::StatusOr<SslContext> MakeTlsServerContext(const TlsServerFiles& files,
                                                absl::string_view serving,
                                                bool require_client_certificate,
                                                absl::string_view alpn) {
  SslContext ctx(SSL_CTX_new(TLS_server_method()));
  if (ctx == nullptr) return absl::InternalError("cannot make a TLS context");
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), files.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot serve ", serving, ": cannot use the TLS certificate ", files.cert_file));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), files.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot serve ", serving,
                                                   ": cannot use the TLS key ", files.key_file,
                                                   " with the certificate ", files.cert_file));
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // Renegotiation costs the server a handshake per request of the client's.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (!files.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), files.client_ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot serve ", serving, ": cannot read the client CA ", files.client_ca_file));
    }
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.client_ca_file.c_str())) {
      SSL_CTX_set_client_CA_list(ctx.get(), names);
    }
    SSL_CTX_set_verify(
        ctx.get(),
        SSL_VERIFY_PEER | (require_client_certificate ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
        nullptr);
  }
  if (!alpn.empty()) {
    // Kept with the context, which the callback's argument must outlive.
    static const int index = SSL_CTX_get_ex_new_index(
        0, nullptr, nullptr, nullptr, [](void*, void* kept, CRYPTO_EX_DATA*, int, long, void*) {
          delete static_cast<std::string*>(kept);
        });
    auto* protocol = new std::string(alpn);
    SSL_CTX_set_ex_data(ctx.get(), index, protocol);
    SSL_CTX_set_alpn_select_cb(ctx.get(), SelectAlpn, protocol);
  }
  return ctx;
}

std::string PeerCertificatePem(SSL* ssl) {
  X509* peer = SSL_get0_peer_certificate(ssl);
  if (peer == nullptr) return {};
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), peer) != 1) return {};
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return size > 0 ? std::string(data, static_cast<size_t>(size)) : std::string();
}

}  // namespace precompile
