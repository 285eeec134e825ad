#pragma once
// What every executor of the rendezvous client's state machine (rdzv_client.h) carries out the
// same way, whatever its transport (NetworkRendezvous for c10d, etcd's EtcdRendezvous): its
// four timers and its log lines.
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>

#include "rendezvous/rdzv_client.h"

namespace ddprun::rdzv {

class ClientTimers {
 public:
  explicit ClientTimers(boost::asio::io_context& io);

  /// Arms `effect.timer` (again); when it expires, `due` gets its event (RetryDue, HeartbeatDue,
  /// StatusDue or GreetingDue). `due` must check that its executor is still there.
  void arm(const ArmClientTimer& effect, std::function<void(const ClientEvent&)> due);
  void disarm(ClientTimer timer);

 private:
  boost::asio::steady_timer& timer(ClientTimer which);
  std::array<boost::asio::steady_timer, 4> timers_;  ///< by ClientTimer
};

/// Writes the client's log line at its level.
void log_client_line(const ClientLog& line);

}  // namespace ddprun::rdzv
