#pragma once
#include <functional>
#include <string>
#include <variant>

#include "rendezvous/protocol.h"

namespace ddprun::rdzv {

/// What one completed rendezvous round tells an agent: its place in the job and where the
/// workers' process-group store lives.
struct RendezvousInfo {
  int group_rank = 0;
  int group_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  /// The job's restart count as held by the rendezvous (equal on every node).
  int restart_count = 0;
  /// The rendezvous round this is (rounds that are not restarts count too).
  int round = 0;
};

/// torchelastic's four meanings of a failed rendezvous, and ddprun's Rejoin: no failure, the
/// rendezvous asks the node to check itself and join again (its quarantine is over).
enum class RendezvousErrorKind { Closed, Timeout, Connection, State, Rejoin };

/// A rendezvous that did not complete, with a message a user can act on.
struct RendezvousError {
  RendezvousErrorKind kind = RendezvousErrorKind::State;
  std::string message;
};

using RendezvousResult = std::variant<RendezvousInfo, RendezvousError>;

/// What the rendezvous tells a node between rounds: stop the workers and join again
/// (Restart), the job is over (Closed), or the rendezvous is lost (RendezvousError).
using Notice = std::variant<Restart, Closed, RendezvousError>;

/// Joins rounds of a rendezvous and reports how this node's workers did. Everything completes
/// asynchronously on the agent's event loop, so the single-node handler and the networked one
/// look the same to the agent. The rendezvous, not the agent, holds the restart budget.
class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  /// Joins the next round; `done` is called once with the round's result.
  virtual void next_rendezvous(std::function<void(RendezvousResult)> done) = 0;
  /// Where notices go; set once, before the first round.
  virtual void set_notice_handler(std::function<void(Notice)> handler) = 0;
  /// A worker of this node failed in the current round; a Restart or Closed notice follows.
  virtual void report_failure(const WorkersFailed& failure) = 0;
  /// Every worker of this node exited 0; Closed(Succeeded) follows once the whole job is done
  /// (or Restart, when another node failed meanwhile).
  virtual void report_success() = 0;
  /// This node's --health_check failed (`why`): the rendezvous holds it out of every round,
  /// lists it in status and tells it the job's end (a Closed notice). next_rendezvous joins it
  /// again once a check passes. Called between rounds only, after each failed check.
  virtual void keep_out(const std::string& why) = 0;
  /// This node leaves the job (signal, error); no callback runs after this.
  virtual void leave(const std::string& reason) = 0;
  /// The backend name as torchrun reports it ("static", "c10d").
  virtual std::string backend() const = 0;
  /// The job's run id (TORCHELASTIC_RUN_ID).
  virtual std::string run_id() const = 0;
};

}  // namespace ddprun::rdzv
