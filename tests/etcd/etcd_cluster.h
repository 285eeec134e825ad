#pragma once
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "etcd/client.h"
#include "tests/support/subprocess.h"

// A real etcd cluster on 127.0.0.1 for the client's tests: each member started by the test
// on free ports with its data in a temporary directory, and killed by pid at the end.

namespace ddprun::testing {

/// TLS on the members' client URLs: their certificate and key, and the CA whose certificates
/// they require of clients (empty: none required). The client side's files for tests.
struct EtcdTls {
  std::string server_cert;
  std::string server_key;
  std::string client_ca;
  std::string ca;
  std::string client_cert;
  std::string client_key;
};

/// A CA, a member certificate for 127.0.0.1, a client certificate of the same CA and a second
/// CA that signed nothing here, made with openssl in a temporary directory; keys of mode 600.
struct EtcdPki {
  TempDir dir;
  std::string path(const std::string& name) const { return dir.path() + "/" + name; }
  EtcdPki();
  /// The members' TLS with client certificates required, as EtcdCluster takes it.
  EtcdTls tls() const {
    return EtcdTls{path("server.pem"), path("server.key"), path("ca.pem"),
                   path("ca.pem"),     path("client.pem"), path("client.key")};
  }
};

class EtcdCluster {
 public:
  /// `flags`: more etcd flags for every member ("--auth-token-ttl", "1").
  explicit EtcdCluster(int members = 3, std::optional<EtcdTls> tls = std::nullopt,
                       std::vector<std::string> flags = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(client_ports_.size()); }
  std::vector<etcd::Member> members() const;
  /// "127.0.0.1:p1,127.0.0.1:p2,...", as --rdzv_endpoint would give them.
  std::string endpoints() const;
  /// Starts member i (again: its data directory is kept, so it rejoins the cluster).
  void start(int i);
  /// SIGKILL to member i, then waits for it (bounded).
  void kill(int i);
  /// SIGSTOP or SIGCONT to member i: a member that holds its connections and answers nothing.
  void pause(int i);
  void resume(int i);
  /// Settings reaching every member (with the test client's certificate under TLS).
  etcd::ClientSettings client_settings() const;
  bool running(int i) const { return processes_[i] != nullptr; }
  /// Runs etcdctl against the cluster with `args`; its stdout, or a failed check.
  CommandResult etcdctl(const std::vector<std::string>& args) const;
  /// Turns authentication on: user root, and user "ann" (password "annpw") who may read and
  /// write /ddprun/. The first etcdctl command that failed, or the last one.
  CommandResult enable_auth() const;
  /// The index of the member that leads now, or -1 when none answers within `limit`.
  int leader(std::chrono::milliseconds limit = std::chrono::seconds(20)) const;
  /// True once every running member answers and one leads, within `limit`.
  bool wait_ready(std::chrono::milliseconds limit = std::chrono::seconds(30)) const;
  /// The members' logs so far, for a failure's message.
  std::string logs() const;

 private:
  TempDir dir_;
  std::vector<int> client_ports_;
  std::vector<int> peer_ports_;
  std::string token_;
  std::optional<EtcdTls> tls_;
  std::vector<std::string> flags_;
  std::vector<std::unique_ptr<Subprocess>> processes_;
};

/// Runs `io` in slices of 10 ms until `done()` or `limit` (always bounded); returns done().
bool run_until(boost::asio::io_context& io, const std::function<bool()>& done,
               std::chrono::milliseconds limit);

/// Sends one request and waits for its reply (bounded by `limit`).
etcd::Reply call_sync(boost::asio::io_context& io, etcd::Client& client, etcd::Request request,
                      std::chrono::milliseconds limit = std::chrono::seconds(30));

}  // namespace ddprun::testing
