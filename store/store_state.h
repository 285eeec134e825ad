#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "store/codec.h"

// The workers' key-value store as a pure state: requests in, bytes out, no sockets and no clock
// (docs/design.md#the-agent-store). The server (store/server.h) delivers what apply() returns.

namespace ddprun::store {

/// A connection, named by the server.
using ConnId = std::uint64_t;

/// Bytes to write to a connection, shared: a watch push goes to every watcher of a key as one
/// buffer, so N watchers of a big value cost one copy of it, not N.
using SharedBytes = std::shared_ptr<const std::string>;

/// What one request or disconnect leads to.
struct Effects {
  /// Bytes to write, in order, each to its connection (the requester's reply, a waiter woken,
  /// a watcher's push).
  std::vector<std::pair<ConnId, SharedBytes>> sends;

  /// Queues `bytes` for `conn`.
  void send(ConnId conn, std::string bytes) {
    sends.emplace_back(conn, std::make_shared<const std::string>(std::move(bytes)));
  }
  /// Set when the requesting connection must be closed, with why (the request was invalid).
  std::optional<std::string> close;
};

/// Keys and values (opaque bytes, one map for both dialects), parked WAITs and 1.13 watches.
class StoreState {
 public:
  /// What one parked key of a WAIT, or one watch, is counted as beyond its key's bytes (the
  /// map and set entries that hold it).
  static constexpr std::size_t kParkedEntryBytes = 96;

  /// `max_parked_bytes`: parked WAITs and watches of all connections together, counted as
  /// parked_bytes() does; a WAIT or WATCH_KEY that would go over closes its connection.
  explicit StoreState(std::size_t max_parked_bytes = 64u << 20)
      : max_parked_bytes_(max_parked_bytes) {}

  /// Applies one request from `conn`. Replies come in request order; a WAIT on missing keys is
  /// parked and answered when the last of them appears.
  Effects apply(ConnId conn, const Request& request);

  /// Forgets `conn`'s parked waits and watches.
  void disconnect(ConnId conn);

  /// The agent joins a new rendezvous round: every key and queue goes. No worker of the next
  /// group can run yet (the round needs this node's join first), and the workers of the last
  /// group must not find their keys: a round after a membership change keeps the restart
  /// count, and so torch's "/worker/attempt_<n>" prefix, and torch 2.6+ uses no prefix.
  void clear();

  /// Number of keys (GETNUMKEYS's count).
  std::size_t size() const { return data_.size(); }

  /// Bytes held in keys and values.
  std::size_t bytes() const { return bytes_; }

  /// Connections with a parked WAIT.
  std::size_t parked() const { return pending_.size(); }

  /// Memory held by parked WAITs and watches: each key a WAIT waits on counts twice (the key's
  /// waiters, the connection's missing keys), each watch once, as its bytes and
  /// kParkedEntryBytes.
  std::size_t parked_bytes() const { return parked_bytes_; }

 private:
  /// A key got a value (created or changed): wakes its waiters; pushes to its watchers.
  void changed(const std::string& key, const std::optional<std::string>& old_value, Effects& out);
  void put(const std::string& key, std::string value, Effects& out);
  void erase_key(std::map<std::string, std::string>::iterator it);
  bool present(const std::string& key) const;
  void wake(const std::string& key, Effects& out);
  void disconnect_waits(ConnId conn);

  std::map<std::string, std::string> data_;
  std::map<std::string, std::deque<std::string>> queues_;
  std::map<std::string, std::set<ConnId>> waiters_;   ///< missing key -> connections waiting
  std::map<ConnId, std::set<std::string>> pending_;   ///< connection -> keys still missing
  std::map<std::string, std::set<ConnId>> watchers_;  ///< key -> 1.13 callback connections
  std::size_t bytes_ = 0;
  std::size_t max_parked_bytes_;
  std::size_t parked_bytes_ = 0;
  static std::size_t entry_bytes(const std::string& key) { return key.size() + kParkedEntryBytes; }
};

}  // namespace ddprun::store
