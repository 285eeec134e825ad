#pragma once
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "etcd/client.h"
#include "etcd/rdzv_store.h"
#include "rendezvous/client_executor.h"
#include "rendezvous/rdzv_client.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::etcd {

/// Everything a node needs to take part in a rendezvous held in etcd.
struct EtcdRendezvousOptions {
  std::string run_id;
  ClientSettings client;   ///< members, credentials, TLS
  std::string name;        ///< shown to users and used to order ranks (addr or host name)
  std::string local_addr;  ///< --local_addr: MASTER_ADDR when this node is group rank 0
  std::optional<int> node_rank;
  std::optional<int> master_port;  ///< fixed instead of a free port per round
  rdzv::RdzvSettings settings;
  /// How long etcd may stay unreachable before the node gives up.
  rdzv::Millis connect_timeout{60'000};
  rdzv::Millis status_interval{5'000};
};

/// The agent's side of the rendezvous on etcd v3 (docs/design.md#rendezvous-on-etcd-v3). What the
/// node does is decided by the TCP client's pure machine, rdzv_client_step() (rdzv_client.h);
/// what the job does by the server's step(), run by whichever node drives (rdzv_store.h's
/// drive()). This class is the executor of both: it holds the lease, the watches, the requests
/// and the timers. Each node watches two keys or ranges, so what etcd sends grows linearly with N:
///
///   agent --next_rendezvous/report--> rdzv_client_step --SendJoin/Send--> put nodes/ reports/
///
///   etcd --watch of messages/NN (its own)--> the messages for this node --> FrameReceived
///
///   after its join: a read of the node created just before it (etcd's election recipe)
///     +-- one found: watch its nodes/ key; deleted --> read again
///     +-- none: this node drives: read state, nodes/, reports/; watch nodes/ and reports/
///               --> View --> drive() --> txn: if mod_revision(state) == R put state, messages/NN
///   LeaseKeeper: lost --> Refused(Dropped): a new id, join again
class EtcdRendezvous final : public rdzv::ClientExecutor {
 public:
  EtcdRendezvous(boost::asio::io_context& io, const common::Clock& clock,
                 EtcdRendezvousOptions options);
  ~EtcdRendezvous() override;

  std::string backend() const override { return "etcd-v3"; }
  std::string run_id() const override { return opt_.run_id; }

  /// Once the job is over: deletes a closed job's keys, revokes this node's lease and then runs
  /// `done` (posted). Bounded by the client's request timeout; the caller keeps a deadline.
  void when_flushed(std::function<void()> done);

  /// Whether this node drives the job now (lowest create revision).
  bool driving() const { return role_ == Role::Driver; }

 private:
  void connect() override;
  void send_join(rdzv::Join join) override { join_as(std::move(join), false); }
  void send(const rdzv::AgentMessage& message) override;
  void close_link(bool after_writes) override;
  void node_id_renewed() override;
  void on_lease_granted(std::uint64_t generation, common::Result<LeaseGrantResponse> granted);
  void read_and_watch(std::uint64_t generation);
  void on_read(std::uint64_t generation, common::Result<RangeResponse> read);
  void on_watch(std::uint64_t generation, const WatchResponse& response);
  void elect();
  void follow(const std::string& key, std::int64_t revision);
  void become_driver();
  void on_driver_read(std::uint64_t role_generation, common::Result<RangeResponse> read);
  void reset_role();
  void on_lease_lost(std::int64_t lease, const std::string& why, bool gone);
  void keep_lease_alive();
  void drop_link();
  /// The link broke (ConnectionLost), or etcd refused this node for good (authentication,
  /// permissions, certificates: ServerUnusable, naming the fix).
  void lost(const std::string& why);
  /// The join, as this node's key; `second_try`: again after a put whose answer was lost
  /// went through (the key is this node's), never a third time.
  void join_as(rdzv::Join join, bool second_try);
  void send_report(const rdzv::AgentMessage& message);
  void maybe_drive();
  void grant_job_lease();
  void keep_job_lease(std::int64_t lease);
  void write_state(const DriveResult& result);
  void refresh_state();
  void revoke_lease(std::function<void()> done);
  void leave_then_revoke(const rdzv::Leave& leave);
  void left(std::int64_t lease);

  EtcdRendezvousOptions opt_;
  std::string prefix_;
  std::shared_ptr<Client> client_;
  TimeAnchor anchor_;
  std::chrono::seconds lease_ttl_{0};
  std::int64_t lease_ = 0;
  std::shared_ptr<LeaseKeeper> keeper_;
  std::string inbox_key_;         ///< the messages key of this node's id (messages/NN)
  std::shared_ptr<Watch> watch_;  ///< of inbox_key_
  /// Bumped on every connect and drop: callbacks of an older watch or read are ignored.
  std::uint64_t generation_ = 0;
  bool linked_ = false;  ///< the messages key is watched
  /// Follower: watching the nodes/ key created just before this node's; Driver: this node's key
  /// is the oldest, it watches nodes/ and reports/.
  enum class Role { Unknown, Electing, Follower, Driver };
  Role role_ = Role::Unknown;
  /// Bumped on every change of role: callbacks of an older election or watch are ignored.
  std::uint64_t role_generation_ = 0;
  std::shared_ptr<Watch> role_watch_;    ///< the predecessor's key, or (driver) nodes/ and reports/
  bool view_ready_ = false;              ///< (driver) view_ read and watched
  View view_;                            ///< (driver) state, nodes/, reports/
  std::int64_t my_create_revision_ = 0;  ///< of nodes/<node_id_>; 0 before the first join
  std::string advertised_addr_;
  std::optional<rdzv::AgentMessage> unsent_report_;  ///< a report whose put failed
  std::chrono::seconds job_lease_ttl_{0};
  std::int64_t job_lease_ = 0;  ///< the lease `state` and `messages` live on (driver only)
  std::shared_ptr<LeaseKeeper> job_keeper_;
  bool granting_job_lease_ = false;
  bool writing_ = false;  ///< a state txn is in flight
  bool drive_again_ = false;
  boost::asio::steady_timer drive_timer_;
  std::optional<rdzv::JobPhase> last_phase_;        ///< of the last state seen
  std::int64_t last_messages_revision_ = 0;         ///< of the last put of inbox_key_ seen
  std::optional<rdzv::Leave> leave_;                ///< sent, not yet put (close_link puts it)
  bool leaving_ = false;                            ///< the leave's txn or revocation is in flight
  std::vector<std::function<void()>> after_leave_;  ///< when_flushed calls that wait for it
};

}  // namespace ddprun::etcd
