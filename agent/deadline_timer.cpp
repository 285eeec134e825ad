#include "agent/deadline_timer.h"

#include <algorithm>
#include <utility>

#include <boost/asio/steady_timer.hpp>

namespace ddprun::agent {
namespace {

class SteadyDeadlineTimer final : public DeadlineTimer {
 public:
  SteadyDeadlineTimer(boost::asio::io_context& io, const common::Clock& clock)
      : timer_(io), clock_(clock) {}

  void arm(common::TimePoint at, std::function<void()> fired) override {
    // Re-arming cancels the wait before: its handler sees operation_aborted.
    timer_.expires_after(std::max(common::Duration{0}, at - clock_.now()));
    timer_.async_wait([fired = std::move(fired)](const boost::system::error_code& ec) {
      if (!ec) fired();
    });
  }

  void cancel() override { timer_.cancel(); }

 private:
  boost::asio::steady_timer timer_;
  const common::Clock& clock_;
};

class SteadyDeadlineTimers final : public DeadlineTimers {
 public:
  SteadyDeadlineTimers(boost::asio::io_context& io, const common::Clock& clock)
      : io_(io), clock_(clock) {}
  std::unique_ptr<DeadlineTimer> make() override {
    return std::make_unique<SteadyDeadlineTimer>(io_, clock_);
  }

 private:
  boost::asio::io_context& io_;
  const common::Clock& clock_;
};

}  // namespace

std::unique_ptr<DeadlineTimers> steady_deadline_timers(boost::asio::io_context& io,
                                                       const common::Clock& clock) {
  return std::make_unique<SteadyDeadlineTimers>(io, clock);
}

}  // namespace ddprun::agent
