#include "rendezvous/auth.h"

#include "rendezvous/openssl_loader.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "rendezvous/framing.h"
#include "rendezvous/protocol.h"

namespace ddprun::rdzv {

using nlohmann::json;

namespace {

/// The smallest secret accepted: `openssl rand -hex 32` makes 64 characters.
constexpr std::size_t kMinSecretBytes = 16;
/// A peer's nonce is 16 to 128 characters (ours are 64).
constexpr std::size_t kMinNonceChars = 16;
constexpr std::size_t kMaxNonceChars = 128;

constexpr const char* kHowToCreate = "create one with: (umask 077; openssl rand -hex 32 > FILE)";

std::string hex(const unsigned char* data, std::size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (std::size_t i = 0; i < size; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 0xf]);
  }
  return out;
}

/// The string field `key` of `body` when it is a string of at most `max` bytes.
std::optional<std::string> short_string(const json& body, const char* key, std::size_t max) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_string()) return std::nullopt;
  const auto& text = it->get_ref<const std::string&>();
  if (text.size() > max) return std::nullopt;
  return text;
}

bool same_mac(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string type_of(const json& body) {
  auto it = body.find("type");
  return it != body.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

common::Result<Secret> read_secret_file(const std::string& path) {
  // The handshake's HMAC and nonces are OpenSSL's.
  if (auto error = load_openssl("the secret file " + path)) return *error;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return common::Error{"secret file " + path + ": " + std::strerror(errno) + "; " + kHowToCreate};
  if (!S_ISREG(st.st_mode)) return common::Error{"secret file " + path + " is not a regular file"};
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return common::Error{"secret file " + path + " is readable by group or others (mode " + mode +
                         "): run chmod 600 " + path};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return common::Error{"secret file " + path + ": " + std::strerror(errno)};
  std::ostringstream content;
  content << in.rdbuf();
  std::string bytes = content.str();
  const std::size_t in_all = bytes.size();
  // Trailing whitespace (the newline an editor or echo adds) is not part of the secret.
  while (!bytes.empty() && std::isspace(static_cast<unsigned char>(bytes.back()))) bytes.pop_back();
  if (bytes.size() < kMinSecretBytes)
    return common::Error{
        "secret file " + path + " holds " + std::to_string(bytes.size()) + " bytes" +
        (bytes.size() < in_all
             ? " before its trailing whitespace (" + std::to_string(in_all) + " in all)"
             : std::string()) +
        "; at least " + std::to_string(kMinSecretBytes) + " are needed: " + kHowToCreate};
  return Secret{std::move(bytes)};
}

std::string make_nonce() {
  // The kernel's generator, which OpenSSL's seeds itself from: a node id needs a nonce too, and
  // a job without a secret or TLS then never loads OpenSSL (openssl_loader.h).
  unsigned char bytes[32];
  std::size_t filled = 0;
  for (int attempt = 0; attempt < 100 && filled < sizeof bytes; ++attempt) {
    const ssize_t n = ::getrandom(bytes + filled, sizeof bytes - filled, 0);
    if (n > 0)
      filled += static_cast<std::size_t>(n);
    else if (n < 0 && errno != EINTR)
      break;
  }
  if (filled < sizeof bytes) {
    // No entropy at all; a predictable nonce would defeat the handshake: stop loudly.
    std::fprintf(stderr, "ddprun: the kernel's random generator failed: %s\n",
                 std::strerror(errno));
    std::abort();
  }
  return hex(bytes, sizeof bytes);
}

std::string handshake_mac(const Secret& secret, const std::string& side, const std::string& role,
                          const std::string& client_nonce, const std::string& server_nonce) {
  // Length-prefixed fields, so that no two different tuples give the same input.
  std::string input = "ddprun-rdzv-auth-v1";
  for (const std::string* field : {&side, &role, &client_nonce, &server_nonce}) {
    input += '|' + std::to_string(field->size()) + ':' + *field;
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), secret.bytes.data(), static_cast<int>(secret.bytes.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &size);
  return hex(mac, size);
}

// ---- server ---------------------------------------------------------------------------------

ServerHandshake::ServerHandshake(std::optional<Secret> secret, std::string server_nonce)
    : secret_(std::move(secret)), server_nonce_(std::move(server_nonce)) {}

HandshakeStep ServerHandshake::on_message(const json& body) {
  HandshakeStep out;
  if (!challenged_) {
    if (auto bad = check_hello(body)) {
      out.error = common::Error{bad->message};
      return out;
    }
    role_ = short_string(body, "role", 32).value_or("");
    if (!secret_) {
      out.send = make_hello("server");
      out.done = true;
      return out;
    }
    auto nonce = short_string(body, "nonce", kMaxNonceChars);
    if (!nonce || nonce->size() < kMinNonceChars) {
      out.error = common::Error{
          "authentication failed: this rendezvous server requires the shared secret; give "
          "every node the server's secret file (--rdzv_conf secret_file=PATH, or " +
          std::string(kSecretFileVariable) + "=PATH)"};
      out.unauthorized = true;
      return out;
    }
    client_nonce_ = *nonce;
    challenged_ = true;
    out.send = json{{"type", "challenge"}, {"nonce", server_nonce_}};
    return out;
  }
  auto mac = short_string(body, "mac", 128);
  if (type_of(body) != "auth" || !mac) {
    out.error = common::Error{
        "authentication failed: expected the answer to the challenge, got another message"};
    out.unauthorized = true;
    return out;
  }
  if (!same_mac(*mac, handshake_mac(*secret_, "client", role_, client_nonce_, server_nonce_))) {
    out.error = common::Error{
        "authentication failed: wrong secret; every node, ddprun status and the server need "
        "the same secret file"};
    out.unauthorized = true;
    return out;
  }
  json hello = make_hello("server");
  hello["mac"] = handshake_mac(*secret_, "server", role_, client_nonce_, server_nonce_);
  out.send = std::move(hello);
  out.done = true;
  return out;
}

// ---- client ---------------------------------------------------------------------------------

ClientHandshake::ClientHandshake(std::optional<Secret> secret, std::string role,
                                 std::string client_nonce)
    : secret_(std::move(secret)), role_(std::move(role)), client_nonce_(std::move(client_nonce)) {}

json ClientHandshake::hello() const {
  json hello = make_hello(role_);
  hello["nonce"] = client_nonce_;
  return hello;
}

HandshakeStep ClientHandshake::on_message(const json& body) {
  HandshakeStep out;
  const std::string type = type_of(body);
  if (type == "refused") {
    auto message = short_string(body, "message", kMaxFrameBytes);
    out.error = common::Error{"the rendezvous server refused this connection: " +
                              message.value_or(std::string("no reason given"))};
    // A refusal of kind "unauthorized" already says "authentication failed: ...".
    if (message && short_string(body, "kind", 32) == std::optional<std::string>("unauthorized"))
      out.error = common::Error{*message};
    return out;
  }
  if (type == "challenge") {
    auto nonce = short_string(body, "nonce", kMaxNonceChars);
    if (!secret_) {
      out.error = common::Error{
          "authentication failed: the rendezvous server requires a shared secret; give the "
          "server's secret file with --rdzv_conf secret_file=PATH (ddprun status: "
          "--secret_file PATH), or " +
          std::string(kSecretFileVariable) + "=PATH"};
      return out;
    }
    if (!nonce || nonce->size() < kMinNonceChars || !server_nonce_.empty()) {
      out.error = common::Error{"authentication failed: the server's challenge is malformed"};
      return out;
    }
    server_nonce_ = *nonce;
    out.send =
        json{{"type", "auth"},
             {"mac", handshake_mac(*secret_, "client", role_, client_nonce_, server_nonce_)}};
    return out;
  }
  if (auto bad = check_hello(body)) {
    out.error = common::Error{"not a ddprun rendezvous server of this version: " + bad->message};
    out.not_ddprun = true;
    return out;
  }
  if (secret_) {
    auto mac = short_string(body, "mac", 128);
    if (server_nonce_.empty() || !mac ||
        !same_mac(*mac, handshake_mac(*secret_, "server", role_, client_nonce_, server_nonce_))) {
      out.error = common::Error{
          "authentication failed: the rendezvous server did not prove that it holds the secret "
          "(is it started without --secret_file, or with another secret?)"};
      return out;
    }
  }
  out.done = true;
  return out;
}

}  // namespace ddprun::rdzv
