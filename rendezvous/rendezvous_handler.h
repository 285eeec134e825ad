#pragma once
#include <functional>
#include <string>
#include <variant>

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
};

/// torchelastic's four meanings of a failed rendezvous.
enum class RendezvousErrorKind { Closed, Timeout, Connection, State };

/// A rendezvous that did not complete, with a message a user can act on.
struct RendezvousError {
  RendezvousErrorKind kind = RendezvousErrorKind::State;
  std::string message;
};

using RendezvousResult = std::variant<RendezvousInfo, RendezvousError>;

/// Joins rounds of a rendezvous. Calls complete asynchronously through the callback so that
/// network-backed handlers and the single-node handler look the same to the agent.
class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  /// Joins the next round; `done` is called once with the round's result.
  virtual void next_rendezvous(int restart_count, std::function<void(RendezvousResult)> done) = 0;
  /// The backend name as torchrun reports it ("static", "c10d").
  virtual std::string backend() const = 0;
  /// The job's run id (TORCHELASTIC_RUN_ID).
  virtual std::string run_id() const = 0;
};

}  // namespace ddprun::rdzv
