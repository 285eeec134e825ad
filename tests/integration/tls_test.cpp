// TLS on the rendezvous connection (docs/operations.md#tls), with a CA and certificates the
// test makes with the openssl command: jobs train through the daemon and through an agent that
// hosts the rendezvous; a peer without TLS, with a certificate of another CA or none, or at a
// name the certificate does not carry is refused with a message that says which, on both sides.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "tests/integration/ddprun_runs.h"
#include "tests/integration/rdzv_fixtures.h"

using namespace ddprun::testing;
using namespace std::chrono_literals;

namespace {

/// A CA, a server certificate for 127.0.0.1 and localhost, a client certificate from the
/// same CA, and a second CA that signed nothing of this job; keys of mode 600.
struct Pki {
  TempDir dir;
  std::string ca = dir.path() + "/ca.pem";
  std::string other_ca = dir.path() + "/other-ca.pem";
  std::string server_cert = dir.path() + "/server.pem";
  std::string server_key = dir.path() + "/server.key";
  std::string client_cert = dir.path() + "/client.pem";
  std::string client_key = dir.path() + "/client.key";

  Pki() {
    const std::string script = R"(set -e
umask 077
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key; key other-ca.key; key server.key; key client.key
openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj "/CN=ddprun test CA"
openssl req -x509 -new -key other-ca.key -out other-ca.pem -days 2 -subj "/CN=another CA"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > server.ext
openssl req -new -key server.key -subj "/CN=rendezvous" -out server.csr
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.pem 2>/dev/null
openssl req -new -key client.key -subj "/CN=node" -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -out client.pem 2>/dev/null
chmod 644 ca.pem other-ca.pem server.pem client.pem
)";
    auto r = run_command({"/bin/bash", "-c", "cd '" + dir.path() + "' && " + script});
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
  }

  std::vector<std::string> daemon_flags(bool client_certificates) const {
    std::vector<std::string> flags{"--tls_cert", server_cert, "--tls_key", server_key};
    if (client_certificates) flags.insert(flags.end(), {"--tls_ca", ca});
    return flags;
  }
  /// ",tls_ca=...,tls_cert=...,tls_key=..." for an agent's --rdzv_conf.
  std::string agent_conf(const std::string& cert, const std::string& key) const {
    return ",tls_ca=" + ca + ",tls_cert=" + cert + ",tls_key=" + key;
  }
  std::vector<std::string> status_flags() const {
    return {"--tls_ca", ca, "--tls_cert", client_cert, "--tls_key", client_key};
  }
};

CommandResult status_at(const std::string& endpoint, const std::vector<std::string>& flags) {
  std::vector<std::string> argv{DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return run_command(argv);
}

}  // namespace

TEST_CASE("a job trains over TLS through a daemon that requires client certificates",
          "[integration][security][tls]") {
  Pki pki;
  Daemon daemon(pki.daemon_flags(true));
  CHECK(contains(daemon.process->err_so_far(), "TLS with client certificates"));
  // Client certificates authenticate peers: no "anyone can reach this port" warning.
  CHECK_FALSE(contains(daemon.process->err_so_far(), "anyone who can reach"));
  const std::string endpoint = "127.0.0.1:" + std::to_string(daemon.port);
  auto nodes =
      start_two_nodes(endpoint, {"--nnodes", "2"}, {"print=started", "sleep=500", "env=RANK"},
                      pki.agent_conf(pki.client_cert, pki.client_key));
  REQUIRE(nodes[0]->wait_for_output("started", kJobLimit));
  auto status = status_at(endpoint, pki.status_flags());
  INFO(status.err);
  CHECK(status.exit_code == 0);
  CHECK(contains(status.out, "job job"));
  std::string ranks;
  for (auto& node : nodes) {
    const auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    ranks += r.out;
  }
  CHECK(contains(ranks, "RANK=0"));
  CHECK(contains(ranks, "RANK=1"));
}

TEST_CASE("peers without TLS or with the wrong certificates are refused saying why",
          "[integration][security][tls]") {
  Pki pki;
  Daemon daemon(pki.daemon_flags(true));
  const std::string endpoint = "127.0.0.1:" + std::to_string(daemon.port);

  auto plain = status_at(endpoint, {});
  auto other_ca = status_at(endpoint, {"--tls_ca", pki.other_ca});
  auto no_cert = status_at(endpoint, {"--tls_ca", pki.ca});
  INFO("no TLS: " << plain.err << "\nanother CA: " << other_ca.err
                  << "\nno certificate: " << no_cert.err);
  CHECK(plain.exit_code == 69);
  // The server answers a client without TLS with a TLS alert, so it is told at once.
  CHECK(contains(plain.err, endpoint + " speaks TLS and this side does not"));
  CHECK(other_ca.exit_code == 69);
  CHECK(contains(other_ca.err, "certificate verify failed"));
  CHECK(contains(other_ca.err, "check --tls_ca, --tls_cert and --tls_key"));
  CHECK(no_cert.exit_code == 69);
  CHECK(contains(no_cert.err, "certificate required"));

  // An agent without a client certificate stops at once (no retry cures it), exit 69.
  auto agent = run_command(
      ddprun_fake({"--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                   "--rdzv_id", "job", "--rdzv_conf", "connect_timeout=30,tls_ca=" + pki.ca},
                  {"print=should-not-run"}),
      {}, kJobLimit);
  INFO(agent.out << agent.err);
  CHECK(agent.exit_code == 69);
  CHECK(contains(agent.err,
                 "certificate required; check --rdzv_conf tls_ca, tls_cert and "
                 "tls_key against the server's TLS settings"));
  CHECK_FALSE(contains(agent.out, "should-not-run"));

  // The daemon's side: one warning per refused connection.
  const std::string log = daemon.process->err_so_far();
  CHECK(contains(log, "wrong version number"));
  CHECK(contains(log, "peer did not return a certificate"));
  CHECK(contains(log, "alert unknown ca"));
}

TEST_CASE("a server certificate for another name is refused naming the mismatch",
          "[integration][security][tls]") {
  Pki pki;
  // Listening on every address: 127.0.0.2 reaches it, and the certificate names 127.0.0.1.
  const int port = free_port();
  Subprocess daemon({RDZVD_BIN, "--port", std::to_string(port), "--tls_cert", pki.server_cert,
                     "--tls_key", pki.server_key});
  REQUIRE(wait_until([&] { return contains(daemon.err_so_far(), "listening on"); }, 10s));
  CHECK(contains(daemon.err_so_far(), "(rendezvous protocol 1, TLS)"));
  auto by_ip = status_at("127.0.0.2:" + std::to_string(port), {"--tls_ca", pki.ca});
  CHECK(by_ip.exit_code == 69);
  CHECK(contains(by_ip.err, "certificate verify failed (IP address mismatch)"));
  auto by_name = status_at("localhost:" + std::to_string(port), {"--tls_ca", pki.ca});
  CHECK(by_name.exit_code == 0);
  daemon.send(SIGTERM);
  daemon.wait(10s);
}

TEST_CASE("a TLS client of a server without TLS is told so and the server says why",
          "[integration][security][tls]") {
  Pki pki;
  Daemon daemon;
  const std::string endpoint = "127.0.0.1:" + std::to_string(daemon.port);
  auto r = status_at(endpoint, {"--tls_ca", pki.ca});
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err,
                 "the peer answered without TLS (wrong version number): it has no TLS "
                 "configured"));
  CHECK(contains(daemon.process->err_so_far(), "speaks TLS and this side does not"));
  // An agent stops at once too (exit 69), where a bare close would be retried for the whole
  // connect_timeout: 600 s here, past the command's limit.
  auto agent =
      run_command(ddprun_fake({"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                               endpoint, "--rdzv_conf", "connect_timeout=600,tls_ca=" + pki.ca},
                              {"print=should-not-run"}),
                  {}, kJobLimit);
  INFO(agent.out << agent.err);
  CHECK(agent.exit_code == 69);
  CHECK(contains(agent.err, "the peer answered without TLS"));
  // And an agent without TLS facing a daemon with TLS.
  Daemon tls_daemon(pki.daemon_flags(false));
  auto plain_agent =
      run_command(ddprun_fake({"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                               "127.0.0.1:" + std::to_string(tls_daemon.port), "--rdzv_conf",
                               "connect_timeout=600"},
                              {"print=should-not-run"}),
                  {}, kJobLimit);
  INFO(plain_agent.out << plain_agent.err);
  CHECK(plain_agent.exit_code == 69);
  CHECK(contains(plain_agent.err, "speaks TLS and this side does not"));
}

TEST_CASE("an agent hosting the rendezvous over TLS with a secret trains and refuses others",
          "[integration][security][tls]") {
  Pki pki;
  const std::string secret = secret_file(pki.dir, "secret", "s3cret-0123456789abcdef");
  // One certificate serves as the hosted server's and as the node's client certificate.
  HostingAgent agent(
      {"--rdzv_conf", "secret_file=" + secret + pki.agent_conf(pki.server_cert, pki.server_key)});
  auto plain = status_at(agent.endpoint, {"--secret_file", secret});
  CHECK(plain.exit_code == 69);
  auto no_secret = status_at(agent.endpoint, pki.status_flags());
  CHECK(no_secret.exit_code == 69);
  CHECK(contains(no_secret.err, "authentication failed"));
  std::vector<std::string> both = pki.status_flags();
  both.insert(both.end(), {"--secret_file", secret});
  auto ok = status_at(agent.endpoint, both);
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(contains(ok.out, "job job"));
  agent.finish();
}

TEST_CASE("bad TLS files are refused before anything starts naming the file and the fix",
          "[integration][security][tls]") {
  Pki pki;
  const std::string missing = pki.dir.path() + "/missing.pem";
  // The daemon: a missing certificate, a key that is not the certificate's, a key others can
  // read, a CA without a certificate.
  auto no_file = run_command({RDZVD_BIN, "--port", std::to_string(free_port()), "--tls_cert",
                              missing, "--tls_key", pki.server_key});
  CHECK(no_file.exit_code == 64);
  CHECK(contains(no_file.err, "--tls_cert " + missing + ": No such file or directory"));
  auto mismatch = run_command({RDZVD_BIN, "--port", std::to_string(free_port()), "--tls_cert",
                               pki.server_cert, "--tls_key", pki.client_key});
  CHECK(mismatch.exit_code == 64);
  CHECK(contains(mismatch.err, "--tls_key " + pki.client_key + " does not belong to --tls_cert " +
                                   pki.server_cert));
  ::chmod(pki.client_key.c_str(), 0644);
  auto readable = run_command({RDZVD_BIN, "--port", std::to_string(free_port()), "--tls_cert",
                               pki.client_cert, "--tls_key", pki.client_key});
  CHECK(readable.exit_code == 64);
  CHECK(
      contains(readable.err, "is readable by others (mode 644): run chmod o-r " + pki.client_key));
  auto ca_only =
      run_command({RDZVD_BIN, "--port", std::to_string(free_port()), "--tls_ca", pki.ca});
  CHECK(ca_only.exit_code == 64);
  CHECK(contains(ca_only.err, "TLS needs both --tls_cert and --tls_key"));
  // An agent: a certificate without the CA to check the server with; a PEM that is not one.
  auto agent = run_command(
      ddprun_fake({"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:1",
                   "--rdzv_conf", "tls_cert=" + pki.server_cert + ",tls_key=" + pki.server_key},
                  {"print=x"}));
  CHECK(agent.exit_code == 64);
  CHECK(contains(agent.err, "TLS needs --rdzv_conf tls_ca"));
  auto not_pem =
      run_command(ddprun_fake({"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                               "127.0.0.1:1", "--rdzv_conf", "tls_ca=" + pki.server_key},
                              {"print=x"}));
  CHECK(not_pem.exit_code == 64);
  CHECK(contains(not_pem.err,
                 "--rdzv_conf tls_ca " + pki.server_key + ": cannot load it as PEM certificates"));
  auto status = status_at("127.0.0.1:1", {"--tls_cert", pki.client_cert});
  CHECK(status.exit_code == 64);
  CHECK(contains(status.err, "TLS needs --tls_ca"));
}

TEST_CASE("a certificate past its end is refused at start, one not valid yet is a warning",
          "[integration][security][tls]") {
  TempDir dir;
  // openssl ca, unlike openssl x509, takes a start and end date of our choosing.
  const std::string script = R"(set -e
umask 077
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out node.key 2>/dev/null
openssl req -new -key node.key -subj "/CN=node" -out node.csr
mkdir db; touch db/index; echo 01 > db/serial; echo unique_subject=no > db/index.attr
printf '[ca]\ndefault_ca=d\n[d]\ndatabase=db/index\nserial=db/serial\nnew_certs_dir=db\n'\
'default_md=sha256\npolicy=p\n[p]\ncommonName=supplied\n' > ca.cnf
sign() { openssl ca -batch -config ca.cnf -selfsign -keyfile node.key -in node.csr \
  -startdate "$1" -enddate "$2" -out "$3" 2>/dev/null; }
sign 20200101000000Z 20200102000000Z old.pem
sign 20990101000000Z 20990102000000Z future.pem
)";
  auto made = run_command({"/bin/bash", "-c", "cd '" + dir.path() + "' && " + script});
  INFO(made.out << made.err);
  REQUIRE(made.exit_code == 0);
  const std::string key = dir.path() + "/node.key";
  const std::string old_cert = dir.path() + "/old.pem";
  auto daemon = run_command(
      {RDZVD_BIN, "--port", std::to_string(free_port()), "--tls_cert", old_cert, "--tls_key", key});
  CHECK(daemon.exit_code == 64);
  CHECK(contains(daemon.err, "--tls_cert " + old_cert + " expired on 2020-01-02 00:00 UTC"));
  auto agent = run_command(ddprun_fake(
      {"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:1", "--rdzv_conf",
       "tls_ca=" + old_cert + ",tls_cert=" + old_cert + ",tls_key=" + key},
      {"print=x"}));
  CHECK(agent.exit_code == 64);
  CHECK(contains(agent.err, "--rdzv_conf tls_cert " + old_cert + " expired on"));
  // Not valid until 2099: the daemon starts (this machine's clock may be the wrong one), warning.
  const std::string future_cert = dir.path() + "/future.pem";
  Subprocess future({RDZVD_BIN, "--port", std::to_string(free_port()), "--tls_cert", future_cert,
                     "--tls_key", key});
  REQUIRE(wait_until([&] { return contains(future.err_so_far(), "listening on"); }, 20s));
  CHECK(
      contains(future.err_so_far(), "--tls_cert " + future_cert +
                                        " is valid only from 2099-01-01 00:00 UTC, later than this "
                                        "machine's clock"));
  future.send(SIGTERM);
  CHECK(future.wait(20s).exit_code == 0);
}

namespace {

/// The shared objects of OpenSSL the process `pid` has mapped, and whether its maps could be
/// read at all (libc is always there).
struct OpenSslMapped {
  bool read = false;
  bool openssl = false;
};

OpenSslMapped openssl_mapped(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  OpenSslMapped out;
  for (std::string line; std::getline(maps, line);) {
    if (contains(line, "/libc.so")) out.read = true;
    if (contains(line, "/libssl.so") || contains(line, "/libcrypto.so")) out.openssl = true;
  }
  return out;
}

}  // namespace

TEST_CASE("an agent loads OpenSSL only when its job uses TLS or a secret",
          "[integration][security][tls]") {
  // Without: the worker reads its agent's maps (the agent is its parent).
  auto plain = run_command(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "1", "--no_python", "/bin/sh", "-c",
       "echo libc=$(grep -c /libc.so /proc/$PPID/maps) "
       "openssl=$(grep -c -e /libssl.so -e /libcrypto.so /proc/$PPID/maps)"},
      {}, kJobLimit);
  INFO(plain.out << plain.err);
  REQUIRE(plain.exit_code == 0);
  CHECK_FALSE(contains(plain.out, "libc=0"));
  CHECK(contains(plain.out, "openssl=0\n"));

  // Nor does a c10d job hosting its rendezvous (its node id is random too).
  {
    HostingAgent c10d;
    const auto mapped = openssl_mapped(c10d.process->pid());
    CHECK(mapped.read);
    CHECK_FALSE(mapped.openssl);
    c10d.finish();
  }

  // With TLS and a secret: loaded, and the job trains.
  Pki pki;
  TempDir dir;
  const std::string secret = secret_file(dir, "secret", "s3cret-0123456789abcdef");
  HostingAgent agent(
      {"--rdzv_conf", "secret_file=" + secret + pki.agent_conf(pki.server_cert, pki.server_key)});
  const auto mapped = openssl_mapped(agent.process->pid());
  CHECK(mapped.read);
  CHECK(mapped.openssl);
  agent.finish();
}

TEST_CASE("without libssl3 a job without TLS runs and TLS is refused naming the package",
          "[integration][security][tls]") {
  if (::geteuid() != 0) {
    WARN("skipped: hiding libssl.so.3 in a mount namespace needs root");
    return;
  }
  // libssl.so.3 made unloadable (/dev/null over it) in a mount namespace of this test's own.
  const std::string script =
      "set -e; lib=$(/sbin/ldconfig -p | awk '/libssl\\.so\\.3 /{print $NF; exit}'); "
      "test -n \"$lib\"; mount --bind /dev/null \"$lib\"; "
      "\"$0\" --standalone --nproc_per_node 1 --no_python /bin/echo ran-without-openssl; "
      "\"$0\" status --rdzv_endpoint 127.0.0.1:1 --tls_ca /etc/hostname || echo status-exit=$?";
  auto r = run_command({"/usr/bin/unshare", "--mount", "/bin/sh", "-c", script, DDPRUN_BIN}, {},
                       kJobLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "ran-without-openssl"));
  CHECK(contains(r.out, "status-exit=64"));
  CHECK(contains(r.err, "cannot load OpenSSL (libssl.so.3), which TLS (--tls_ca) needs"));
  CHECK(contains(r.err, "install Debian's libssl3 package"));
}
