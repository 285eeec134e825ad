#pragma once
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "etcd/codec.h"
#include "rendezvous/tls.h"

// An asynchronous etcd v3 client over the JSON gateway, on the caller's io_context and thread
// (the agent is single-threaded Asio: nothing here blocks). docs/design.md#rendezvous-on-etcd-v3
// describes failover, authentication and the watch's resumption.
//
//   caller --call()--> Client --one attempt per member--> [idle connections per member]
//                        |  ^                                 |
//                        |  +---- reply or "all failed" ------+
//                        +--authenticate (once, shared by the calls waiting for a token)
//   caller --watch()--> Watch --own connection, chunked stream--> JsonStreamDecoder
//                        ^  |   broken: next member, from the revision after the last seen
//                        +--+
//   LeaseKeeper: a timer at a third of the TTL, each tick a keep-alive call.

namespace ddprun::etcd {

/// One etcd member's client URL, as host and port.
struct Member {
  std::string host;
  int port = 2379;
  std::string text() const;
};

/// Members from "host:port[,host:port...]" (port 2379 when left out); the error names the bad
/// entry.
common::Result<std::vector<Member>> parse_members(const std::string& endpoints);

/// A user and password for etcd's authentication.
struct Credentials {
  std::string user;
  std::string password;
};

/// The user and the password read from `password_file` (--rdzv_conf etcd_user=...,
/// etcd_password_file=...): a regular file readable by its owner only (mode 600 or 400) whose
/// content, trailing white space removed, is the password. The error names the file and the fix.
common::Result<Credentials> read_credentials(const std::string& user,
                                             const std::string& password_file);

struct ClientSettings {
  std::vector<Member> members;
  /// Everything one call may take, all attempts on all members included.
  std::chrono::milliseconds request_timeout{10000};
  /// One attempt on one member (connect, send, answer).
  std::chrono::milliseconds attempt_timeout{3000};
  std::optional<Credentials> credentials;
  rdzv::TlsContext tls;  ///< null: plain HTTP
  std::size_t max_response_bytes = 64u << 20;
  std::size_t max_watch_message_bytes = 16u << 20;
  std::size_t max_idle_per_member = 4;
};

/// The answer's JSON, or what went wrong, worded for the user and naming the member(s).
using Reply = common::Result<nlohmann::json>;
using ReplyHandler = std::function<void(Reply)>;

class Watch;

/// The client. Create it with make_shared; close() ends everything it started (handlers of
/// calls still in flight get an error), after which the io_context can run out.
class Client : public std::enable_shared_from_this<Client> {
 public:
  Client(boost::asio::io_context& io, ClientSettings settings);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Sends one request; the handler runs once, on the io_context.
  void call(Request request, ReplyHandler handler);

  /// Calls and decodes: `decode` turns the JSON into T (decode_range, decode_txn, ...).
  template <typename T, typename Decode>
  void call_as(Request request, Decode decode, std::function<void(common::Result<T>)> handler) {
    call(std::move(request), [decode, handler = std::move(handler)](Reply reply) {
      if (!reply) return handler(reply.error());
      handler(decode(*reply));
    });
  }

  /// Opens a watch; see Watch.
  std::shared_ptr<Watch> watch(WatchOptions options,
                               std::function<void(const WatchResponse&)> on_response,
                               std::function<void(const common::Error&)> on_end,
                               std::function<void(const std::string&)> on_notice = {});

  /// Cancels every call and watch and closes every connection.
  void close();

  /// The member the next call goes to first (it moves on failover).
  const Member& current_member() const { return settings_.members[current_]; }
  const ClientSettings& settings() const { return settings_; }

 private:
  friend class Watch;
  friend class LeaseKeeper;
  struct Connection;
  struct Call;

  void start(const std::shared_ptr<Call>& call);
  void attempt(const std::shared_ptr<Call>& call);
  void on_attempt_failed(const std::shared_ptr<Call>& call, std::size_t member, bool sent,
                         const std::string& why, bool timed_out);
  /// Moves every watch stream open on `member` to the next member (from its revision): a
  /// member that held a request past its attempt's time (stopped, overloaded, cut off) would
  /// hold them silently too.
  void leave_member(std::size_t member, const std::string& why);
  void on_answer(const std::shared_ptr<Call>& call, std::size_t member,
                 std::shared_ptr<Connection> connection, unsigned status, const std::string& body,
                 bool keep_alive);
  void finish(const std::shared_ptr<Call>& call, Reply reply);
  void authenticate_then(const std::shared_ptr<Call>& call);
  std::shared_ptr<Connection> take_idle(std::size_t member);
  void connect(std::size_t member, std::chrono::steady_clock::time_point deadline,
               std::function<void(std::shared_ptr<Connection>, std::string)> done);
  std::string token_header() const { return token_; }

  boost::asio::io_context& io_;
  ClientSettings settings_;
  std::size_t current_ = 0;
  std::vector<std::deque<std::shared_ptr<Connection>>> idle_;
  std::set<std::shared_ptr<Call>> in_flight_;
  std::vector<std::weak_ptr<Watch>> watches_;
  std::string token_;
  bool authenticating_ = false;
  std::vector<std::shared_ptr<Call>> waiting_for_token_;
  bool closed_ = false;
};

/// A prefix (or key) watch that survives member failures: after a broken stream it opens a new
/// one on the next member from the revision after the last it delivered, so every change is
/// delivered once, in revision order. It ends (on_end) when cancelled, closed, or when the
/// revision it needs was compacted away (the message names both revisions).
class Watch : public std::enable_shared_from_this<Watch> {
 public:
  Watch(std::shared_ptr<Client> client, WatchOptions options,
        std::function<void(const WatchResponse&)> on_response,
        std::function<void(const common::Error&)> on_end,
        std::function<void(const std::string&)> on_notice);
  ~Watch();
  void start();
  /// Ends the watch; on_end runs with "cancelled".
  void cancel();
  /// The revision the watch would resume from (0 until known).
  std::int64_t next_revision() const { return next_revision_; }
  /// The member its stream is (or will be) on.
  std::size_t member() const { return member_; }

 private:
  friend class Client;  // leave_member() moves streams off a member that stopped answering
  struct Stream;
  void open();
  void renew_token_and_open();
  void read_stream(const std::shared_ptr<Stream>& stream);
  void on_stream_read(const std::shared_ptr<Stream>& stream, boost::system::error_code ec);
  void on_message(const nlohmann::json& message);
  void on_broken(const std::string& why);
  void end(common::Error error);

  std::shared_ptr<Client> client_;
  WatchOptions options_;
  std::function<void(const WatchResponse&)> on_response_;
  std::function<void(const common::Error&)> on_end_;
  std::function<void(const std::string&)> on_notice_;
  std::int64_t next_revision_ = 0;
  std::size_t member_ = 0;
  std::chrono::milliseconds backoff_{50};
  std::shared_ptr<Stream> stream_;
  boost::asio::steady_timer retry_timer_;
  bool ended_ = false;
  bool reauthenticated_ = false;
};

/// Keeps one lease alive: a keep-alive call every third of the TTL. on_lost runs once when etcd
/// says the lease is gone, or when no renewal succeeded for a whole TTL.
class LeaseKeeper : public std::enable_shared_from_this<LeaseKeeper> {
 public:
  LeaseKeeper(std::shared_ptr<Client> client, std::int64_t lease, std::chrono::seconds ttl,
              std::function<void(const common::Error&)> on_lost);
  void start();
  void stop();
  /// Renewals etcd acknowledged so far.
  int renewals() const { return renewals_; }
  /// Whether etcd itself said the lease is gone (not merely unreachable for a TTL).
  bool gone() const { return gone_; }

 private:
  void tick();
  std::shared_ptr<Client> client_;
  std::int64_t lease_;
  std::chrono::seconds ttl_;
  std::function<void(const common::Error&)> on_lost_;
  boost::asio::steady_timer timer_;
  std::chrono::steady_clock::time_point last_ok_;
  int renewals_ = 0;
  bool stopped_ = false;
  bool gone_ = false;
};

}  // namespace ddprun::etcd
