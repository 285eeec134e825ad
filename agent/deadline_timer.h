#pragma once
// The agent's deadlines (AgentTimer: the stop deadline, the restart pause, the health check's
// next try...) as one-shot timers on the agent's clock: steady timers on the event loop in
// production; in a test, timers that fire when the test moves its fake clock on
// (tests/support/fake_deadline_timers.h), so a 30 s deadline takes no 30 s.
#include <functional>
#include <memory>

#include <boost/asio/io_context.hpp>

#include "common/clock.h"

namespace ddprun::agent {

/// One timer. arm() replaces whatever was armed; `fired` runs on the agent's event loop at
/// or after `at` (the clock's time), unless cancel() or another arm() came first.
class DeadlineTimer {
 public:
  virtual ~DeadlineTimer() = default;
  virtual void arm(common::TimePoint at, std::function<void()> fired) = 0;
  virtual void cancel() = 0;
};

/// Where the agent's timers come from.
class DeadlineTimers {
 public:
  virtual ~DeadlineTimers() = default;
  virtual std::unique_ptr<DeadlineTimer> make() = 0;
};

/// Steady timers on `io` that wait until `clock` says `at` (both must outlive the timers).
std::unique_ptr<DeadlineTimers> steady_deadline_timers(boost::asio::io_context& io,
                                                       const common::Clock& clock);

}  // namespace ddprun::agent
