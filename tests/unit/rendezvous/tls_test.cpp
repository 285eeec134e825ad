#include "rendezvous/tls.h"

#include <catch2/catch.hpp>
#include <variant>

using namespace ddprun::rdzv;

namespace {

std::string error_of(const ddprun::common::Result<TlsContext>& made) {
  return made ? std::string("(no error)") : made.error().message;
}

}  // namespace

TEST_CASE("a TLS record is told from a frame by its first three bytes", "[rdzv][unit]") {
  CHECK(looks_like_tls(std::string("\x16\x03\x01\x02\x00", 5)));  // a ClientHello
  CHECK(looks_like_tls(std::string("\x15\x03\x03\x00\x02", 5)));  // an alert
  // A frame's length prefix: a body under 16 MiB starts with a zero byte.
  CHECK_FALSE(looks_like_tls(std::string("\x00\x00\x00\x2a{", 5)));
  CHECK_FALSE(looks_like_tls(std::string("\x16\x03", 2)));
  CHECK_FALSE(looks_like_tls("GET / HTTP/1.1"));
}

TEST_CASE("TLS settings that cannot work are refused naming the missing file", "[rdzv][unit]") {
  CHECK(error_of(make_server_tls({"ca.pem", "", ""}, "--tls_")) ==
        "TLS needs both --tls_cert and --tls_key on the side that serves the rendezvous (the "
        "daemon, or the agent that hosts it)");
  CHECK(error_of(make_client_tls({"", "c.pem", "k.pem"}, "--tls_")) ==
        "TLS needs --tls_ca (the CA that signed the rendezvous server's certificate) besides "
        "--tls_cert and --tls_key");
  CHECK(error_of(make_client_tls({"/nonexistent/ca.pem", "c.pem", ""}, "--rdzv_conf tls_")) ==
        "give --rdzv_conf tls_cert and --rdzv_conf tls_key together (a certificate and its key)");
  CHECK(error_of(make_client_tls({"/nonexistent/ca.pem", "", ""}, "--tls_")) ==
        "--tls_ca /nonexistent/ca.pem: No such file or directory; give the path of a PEM file");
}
