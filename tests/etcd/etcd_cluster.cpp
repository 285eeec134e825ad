#include "tests/etcd/etcd_cluster.h"

#include <signal.h>

#include <boost/asio/ip/tcp.hpp>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>

#include "rendezvous/free_port.h"
#include "rendezvous/tls.h"

namespace ddprun::testing {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";
constexpr const char* kEtcdctl = "/usr/bin/etcdctl";

/// `count` distinct ports free on 127.0.0.1 now, outside the ephemeral range.
std::vector<int> free_ports(int count) {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto range = rdzv::parse_port_range(text).value_or(std::pair{32768, 60999});
  std::random_device seed;
  std::vector<int> out;
  asio::io_context io;
  for (int port : rdzv::port_candidates(range, seed(), 400)) {
    if (static_cast<int>(out.size()) == count) break;
    asio::ip::tcp::acceptor probe(io);
    boost::system::error_code ec;
    probe.open(asio::ip::tcp::v4(), ec);
    probe.bind({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
    if (!ec) out.push_back(port);
  }
  if (static_cast<int>(out.size()) != count) throw std::runtime_error("no free ports for etcd");
  return out;
}

std::string url(int port) { return "http://127.0.0.1:" + std::to_string(port); }

}  // namespace

EtcdCluster::EtcdCluster(int members, std::optional<EtcdTls> tls, std::vector<std::string> flags)
    : tls_(std::move(tls)), flags_(std::move(flags)) {
  if (::access(kEtcd, X_OK) != 0)
    throw std::runtime_error("etcd is not installed: run scripts/install-deps.sh (etcd-server)");
  const std::vector<int> ports = free_ports(2 * members);
  for (int i = 0; i < members; ++i) {
    client_ports_.push_back(ports[2 * i]);
    peer_ports_.push_back(ports[2 * i + 1]);
  }
  token_ = "ddprun-test-" + std::to_string(ports[0]);
  processes_.resize(members);
  for (int i = 0; i < members; ++i) start(i);
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i)
    if (processes_[i]) kill(i);
}

std::vector<etcd::Member> EtcdCluster::members() const {
  std::vector<etcd::Member> out;
  for (int port : client_ports_) out.push_back({"127.0.0.1", port});
  return out;
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (int port : client_ports_)
    out += (out.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(port);
  return out;
}

etcd::ClientSettings EtcdCluster::client_settings() const {
  etcd::ClientSettings settings;
  settings.members = members();
  if (tls_) {
    auto context = rdzv::make_client_tls({tls_->ca, tls_->client_cert, tls_->client_key}, "tls_");
    if (!context) throw std::runtime_error(context.error().message);
    settings.tls = *context;
  }
  return settings;
}

void EtcdCluster::pause(int i) {
  if (processes_[i]) processes_[i]->send(SIGSTOP);
}

void EtcdCluster::resume(int i) {
  if (processes_[i]) processes_[i]->send(SIGCONT);
}

void EtcdCluster::start(int i) {
  std::string cluster;
  for (int m = 0; m < size(); ++m)
    cluster += (m == 0 ? "" : ",") + ("m" + std::to_string(m)) + "=" + url(peer_ports_[m]);
  const std::string client_url =
      tls_ ? "https://127.0.0.1:" + std::to_string(client_ports_[i]) : url(client_ports_[i]);
  // Short heartbeats and elections keep a leader's loss to about a second.
  std::vector<std::string> argv = {kEtcd, "--name", "m" + std::to_string(i)};
  for (const auto& flag : std::vector<std::pair<std::string, std::string>>{
           {"--data-dir", dir_.path() + "/m" + std::to_string(i)},
           {"--listen-client-urls", client_url},
           {"--advertise-client-urls", client_url},
           {"--listen-peer-urls", url(peer_ports_[i])},
           {"--initial-advertise-peer-urls", url(peer_ports_[i])},
           {"--initial-cluster", cluster},
           {"--initial-cluster-state", "new"},
           {"--initial-cluster-token", token_},
           {"--heartbeat-interval", "50"},
           {"--election-timeout", "500"},
           {"--logger", "zap"},
           {"--log-level", "warn"}}) {
    argv.push_back(flag.first);
    argv.push_back(flag.second);
  }
  if (tls_) {
    argv.insert(argv.end(), {"--cert-file", tls_->server_cert, "--key-file", tls_->server_key});
    if (!tls_->client_ca.empty())
      argv.insert(argv.end(), {"--client-cert-auth", "--trusted-ca-file", tls_->client_ca});
  }
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  processes_[i] = std::make_unique<Subprocess>(argv);
}

void EtcdCluster::kill(int i) {
  if (!processes_[i]) return;
  processes_[i]->send(SIGKILL);
  processes_[i]->wait(10s);
  processes_[i].reset();
}

CommandResult EtcdCluster::etcdctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {kEtcdctl, "--endpoints", endpoints(), "--command-timeout",
                                   "10s"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, {{"ETCDCTL_API", "3"}}, 30s);
}

CommandResult EtcdCluster::enable_auth() const {
  CommandResult r;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"user", "add", "root:rootpw"},
           {"user", "add", "ann:annpw"},
           {"role", "add", "trainer"},
           {"role", "grant-permission", "trainer", "--prefix=true", "readwrite", "/ddprun/"},
           {"user", "grant-role", "ann", "trainer"},
           {"auth", "enable"}}) {
    r = etcdctl(args);
    if (r.exit_code != 0) {
      r.err = args[0] + " " + args[1] + ": " + r.err;
      return r;
    }
  }
  return r;
}

int EtcdCluster::leader(std::chrono::milliseconds limit) const {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (int attempt = 0; attempt < 1000 && std::chrono::steady_clock::now() < until; ++attempt) {
    asio::io_context io;
    for (int i = 0; i < size(); ++i) {
      if (!processes_[i]) continue;
      etcd::ClientSettings settings = client_settings();
      settings.members = {{"127.0.0.1", client_ports_[i]}};
      settings.request_timeout = 1s;
      settings.attempt_timeout = 1s;
      auto client = std::make_shared<etcd::Client>(io, settings);
      auto reply = call_sync(io, *client, etcd::member_status(), 2s);
      client->close();
      if (!reply) continue;
      auto status = etcd::decode_status(*reply);
      if (status && status->leader != 0 && status->leader == status->header.member_id) return i;
    }
    std::this_thread::sleep_for(100ms);
  }
  return -1;
}

bool EtcdCluster::wait_ready(std::chrono::milliseconds limit) const {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (int attempt = 0; attempt < 1000 && std::chrono::steady_clock::now() < until; ++attempt) {
    if (leader(1s) < 0) continue;
    bool all = true;
    asio::io_context io;
    for (int i = 0; i < size() && all; ++i) {
      if (!processes_[i]) continue;
      etcd::ClientSettings settings = client_settings();
      settings.members = {{"127.0.0.1", client_ports_[i]}};
      settings.request_timeout = 2s;
      auto client = std::make_shared<etcd::Client>(io, settings);
      // A linearizable read answers only once the member has a leader and has caught up.
      all = call_sync(io, *client, etcd::range({"ready", "", 0, 0, false}), 3s).ok();
      client->close();
    }
    if (all) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

std::string EtcdCluster::logs() const {
  std::string out;
  for (int i = 0; i < size(); ++i)
    if (processes_[i])
      out += "--- m" + std::to_string(i) + "\n" + processes_[i]->err_so_far().substr(0, 4000);
  return out;
}

bool run_until(asio::io_context& io, const std::function<bool()>& done,
               std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < until) {
    if (io.stopped()) io.restart();
    io.run_for(10ms);
  }
  return done();
}

etcd::Reply call_sync(asio::io_context& io, etcd::Client& client, etcd::Request request,
                      std::chrono::milliseconds limit) {
  // Shared: a reply that comes after the limit must not write into a returned frame.
  auto out = std::make_shared<std::optional<etcd::Reply>>();
  client.call(std::move(request), [out](etcd::Reply reply) { *out = std::move(reply); });
  if (!run_until(
          io, [&] { return out->has_value(); }, limit))
    return common::Error{"test: no reply within the test's limit"};
  return std::move(**out);
}

EtcdPki::EtcdPki() {
  const std::string script = R"(set -e
umask 077
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key; key other-ca.key; key server.key; key client.key
openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj "/CN=ddprun etcd test CA"
openssl req -x509 -new -key other-ca.key -out other-ca.pem -days 2 -subj "/CN=another CA"
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl req -new -key server.key -subj "/CN=etcd" -out server.csr
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.pem 2>/dev/null
openssl req -new -key client.key -subj "/CN=node" -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile client.ext -out client.pem 2>/dev/null
chmod 644 ca.pem other-ca.pem server.pem client.pem
)";
  auto r = run_command({"/bin/bash", "-c", "cd '" + dir.path() + "' && " + script});
  if (r.exit_code != 0)
    throw std::runtime_error("cannot make the test certificates with openssl: " + r.out + r.err);
}

}  // namespace ddprun::testing
