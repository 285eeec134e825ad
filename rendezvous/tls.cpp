#include "rendezvous/tls.h"

#include "rendezvous/openssl_loader.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <boost/asio/ssl/context.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "common/log.h"

namespace ddprun::rdzv {

namespace ssl = boost::asio::ssl;

namespace {

/// A failed call's reason in OpenSSL's words (Asio keeps OpenSSL's error code as the value);
/// clears what else OpenSSL queued so the next call starts clean.
std::string openssl_reason(const boost::system::error_code& ec) {
  ::ERR_clear_error();
  if (ec.category() == boost::asio::error::get_ssl_category()) {
    if (const char* text = ::ERR_reason_error_string(static_cast<unsigned long>(ec.value())))
      return text;
  }
  return ec.message();
}

/// Checks that `path` names a readable regular file before OpenSSL reads it, so the usual
/// mistakes get a message about the file rather than about PEM parsing.
std::optional<std::string> check_file(const std::string& option, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return option + " " + path + ": " + std::strerror(errno) + "; give the path of a PEM file";
  if (!S_ISREG(st.st_mode)) return option + " " + path + ": not a regular file";
  return std::nullopt;
}

/// A private key others can read is not private: refused, naming the fix.
std::optional<std::string> check_key_mode(const std::string& option, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%o", static_cast<unsigned>(st.st_mode & 0777));
    return option + " " + path + " is readable by others (mode " + mode + "): run chmod o-r " +
           path;
  }
  return std::nullopt;
}

/// A context of the given method with TLS 1.2 as the oldest version.
TlsContext new_context(ssl::context::method method) {
  auto context = std::make_shared<ssl::context>(method);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                       ssl::context::single_dh_use);
  return context;
}

std::optional<std::string> load_ca(ssl::context& context, const std::string& flag,
                                   const std::string& path) {
  const std::string option = flag + "ca";
  if (auto why = check_file(option, path)) return why;
  boost::system::error_code ec;
  context.load_verify_file(path, ec);
  if (ec)
    return option + " " + path + ": cannot load it as PEM certificates: " + openssl_reason(ec);
  return std::nullopt;
}

/// An ASN.1 time as "2026-01-02 03:04 UTC", or "?" when OpenSSL cannot read it.
std::string utc(const ASN1_TIME* time) {
  std::tm tm{};
  if (time == nullptr || ::ASN1_TIME_to_tm(time, &tm) != 1) return "?";
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &tm);
  return text;
}

/// A certificate past its end is refused: every peer would refuse it at each handshake, which
/// they report as a failed connection, far from the file at fault. One not valid yet is only a
/// warning, since this machine's clock may be the one that is wrong.
std::optional<std::string> check_dates(ssl::context& context, const std::string& flag,
                                       const std::string& path) {
  const X509* leaf = ::SSL_CTX_get0_certificate(context.native_handle());
  if (leaf == nullptr) return std::nullopt;
  const ASN1_TIME* not_after = ::X509_get0_notAfter(leaf);
  if (not_after != nullptr && ::X509_cmp_current_time(not_after) < 0)
    return flag + "cert " + path + " expired on " + utc(not_after) +
           ": peers refuse it; renew it (openssl x509 -noout -dates -in " + path +
           " shows its dates)";
  const ASN1_TIME* not_before = ::X509_get0_notBefore(leaf);
  if (not_before != nullptr && ::X509_cmp_current_time(not_before) > 0)
    spdlog::warn(
        "{}cert {} is valid only from {}, later than this machine's clock: peers whose clock "
        "agrees "
        "refuse it until then (a certificate made on a machine whose clock is ahead?)",
        flag, path, utc(not_before));
  return std::nullopt;
}

std::optional<std::string> load_identity(ssl::context& context, const std::string& flag,
                                         const TlsFiles& files) {
  const std::string cert = flag + "cert";
  const std::string key = flag + "key";
  if (auto why = check_file(cert, files.cert)) return why;
  if (auto why = check_file(key, files.key)) return why;
  if (auto why = check_key_mode(key, files.key)) return why;
  boost::system::error_code ec;
  context.use_certificate_chain_file(files.cert, ec);
  if (ec)
    return cert + " " + files.cert + ": cannot load it as a PEM certificate: " + openssl_reason(ec);
  context.use_private_key_file(files.key, ssl::context::pem, ec);
  // Asio takes OpenSSL's error off the queue into the error code's value.
  const bool mismatch =
      ec && ec.category() == boost::asio::error::get_ssl_category() &&
      ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH;
  if (mismatch || (!ec && ::SSL_CTX_check_private_key(context.native_handle()) != 1)) {
    ::ERR_clear_error();
    return key + " " + files.key + " does not belong to " + cert + " " + files.cert +
           ": give the key the certificate was made for";
  }
  if (ec)
    return key + " " + files.key + ": cannot load it as a PEM private key: " + openssl_reason(ec);
  return check_dates(context, flag, files.cert);
}

}  // namespace

common::Result<TlsContext> make_server_tls(const TlsFiles& files, const std::string& flag) {
  if (auto error = load_openssl("TLS (" + flag + "cert)")) return *error;
  if (files.cert.empty() || files.key.empty())
    return common::Error{
        "TLS needs both " + flag + "cert and " + flag +
        "key on the side that serves the rendezvous (the daemon, or the agent that hosts it)"};
  TlsContext context = new_context(ssl::context::tls_server);
  if (auto why = load_identity(*context, flag, files)) return common::Error{*why};
  if (!files.ca.empty()) {
    if (auto why = load_ca(*context, flag, files.ca)) return common::Error{*why};
    // Clients must show a certificate of this CA; the list tells them which one.
    if (STACK_OF(X509_NAME)* names = ::SSL_load_client_CA_file(files.ca.c_str()))
      ::SSL_CTX_set_client_CA_list(context->native_handle(), names);
    context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  return context;
}

common::Result<TlsContext> make_client_tls(const TlsFiles& files, const std::string& flag) {
  if (auto error = load_openssl("TLS (" + flag + "ca)")) return *error;
  if (files.ca.empty())
    return common::Error{"TLS needs " + flag +
                         "ca (the CA that signed the rendezvous server's certificate)" +
                         (files.cert.empty() && files.key.empty()
                              ? ""
                              : " besides " + flag + "cert and " + flag + "key")};
  if (files.cert.empty() != files.key.empty())
    return common::Error{"give " + flag + "cert and " + flag +
                         "key together (a certificate and its key)"};
  TlsContext context = new_context(ssl::context::tls_client);
  if (auto why = load_ca(*context, flag, files.ca)) return common::Error{*why};
  context->set_verify_mode(ssl::verify_peer);
  if (!files.cert.empty()) {
    if (auto why = load_identity(*context, flag, files)) return common::Error{*why};
  }
  return context;
}

bool looks_like_tls(const std::string& bytes) {
  // A record header: content type (21 alert, 22 handshake), then version 3.x.
  if (bytes.size() < 3) return false;
  const auto type = static_cast<unsigned char>(bytes[0]);
  const auto major = static_cast<unsigned char>(bytes[1]);
  const auto minor = static_cast<unsigned char>(bytes[2]);
  return (type == 21 || type == 22) && major == 3 && minor <= 4;
}

}  // namespace ddprun::rdzv
