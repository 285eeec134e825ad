#include "rendezvous/status_page.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <array>
#include <cctype>
#include <vector>

namespace ddprun::rdzv {

namespace {

using metrics::HttpRequest;
using metrics::HttpResponse;

std::array<unsigned char, SHA256_DIGEST_LENGTH> digest_of(std::string_view text) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> out{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), out.data());
  return out;
}

/// Base64 (RFC 4648, padded) to bytes; nullopt when it is not.
std::optional<std::string> decode_base64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0 || text.size() > 4096) return std::nullopt;
  std::vector<unsigned char> out(text.size() / 4 * 3);
  const int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  std::size_t size = static_cast<std::size_t>(n);
  // EVP_DecodeBlock counts the padding as zero bytes.
  for (std::size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) --size;
  return std::string(reinterpret_cast<const char*>(out.data()), size);
}

bool starts_with_word(std::string_view header, std::string_view scheme) {
  if (header.size() <= scheme.size() || header[scheme.size()] != ' ') return false;
  for (std::size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != scheme[i]) return false;
  return true;
}

HttpResponse unauthorized(const char* scheme) {
  HttpResponse r{401,
                 "text/plain; charset=utf-8",
                 "this ddprun-rdzvd asks for its rendezvous secret: send it as a bearer token "
                 "(Authorization: Bearer <secret>) or as the password of HTTP Basic\n",
                 {}};
  r.headers.emplace_back("WWW-Authenticate", std::string(scheme) + " realm=\"ddprun-rdzvd\"");
  r.headers.emplace_back("Cache-Control", "no-store");
  return r;
}

}  // namespace

bool authorized(const std::string& authorization, const Secret& secret) {
  std::string_view header = authorization;
  std::optional<std::string> candidate;
  if (starts_with_word(header, "bearer")) {
    candidate = std::string(header.substr(7));
  } else if (starts_with_word(header, "basic")) {
    auto decoded = decode_base64(header.substr(6));
    if (!decoded) return false;
    const auto colon = decoded->find(':');
    if (colon == std::string::npos) return false;
    candidate = decoded->substr(colon + 1);
  } else {
    return false;
  }
  const auto want = digest_of(secret.bytes);
  const auto got = digest_of(*candidate);
  return CRYPTO_memcmp(want.data(), got.data(), want.size()) == 0;
}

metrics::HttpServer::Handler status_page_handler(metrics::HttpServer::Handler metrics,
                                                 std::function<nlohmann::json()> document,
                                                 StatusPageOptions options) {
  return [metrics = std::move(metrics), document = std::move(document),
          options = std::move(options)](const HttpRequest& request) -> HttpResponse {
    const std::string path = request.target.substr(0, request.target.find('?'));
    const bool page = path == "/" || path == "/index.html";
    const bool status = path == "/status";
    const auto refuse = [&](const char* scheme) {
      if (!request.authorization.empty() && options.wrong_secret) options.wrong_secret(request);
      return unauthorized(scheme);
    };
    if (!page && !status) {
      if (path == "/metrics" && options.protect_metrics && options.secret &&
          !authorized(request.authorization, *options.secret))
        return refuse("Bearer");
      return metrics(request);  // /metrics, or its 404
    }
    if (request.method != "GET" && request.method != "HEAD")
      return HttpResponse{405, "text/plain; charset=utf-8", "only GET and HEAD\n", {}};
    // Basic: a browser asks its user for the secret and sends it with the page's fetches too.
    if (options.secret && !authorized(request.authorization, *options.secret))
      return refuse("Basic");
    HttpResponse r;
    r.headers.emplace_back("Cache-Control", "no-store");
    if (page) {
      r.content_type = "text/html; charset=utf-8";
      r.body = std::string(status_page_html());
      // The page runs its own inline script and talks to this origin only.
      r.headers.emplace_back("Content-Security-Policy",
                             "default-src 'none'; script-src 'unsafe-inline'; style-src "
                             "'unsafe-inline'; connect-src 'self'; img-src 'self' data:");
      r.headers.emplace_back("X-Content-Type-Options", "nosniff");
      return r;
    }
    r.content_type = "application/json";
    r.body = document().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return r;
  };
}

}  // namespace ddprun::rdzv
