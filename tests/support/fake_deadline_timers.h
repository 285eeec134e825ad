#pragma once
// The agent's deadline timers on a FakeClock: advance() moves the clock on and fires, on the
// event loop, every timer now due, so a test drives a 30 s deadline in no time.
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "agent/deadline_timer.h"
#include "tests/support/fake_clock.h"

namespace ddprun::testing {

class FakeDeadlineTimers final : public agent::DeadlineTimers {
 public:
  FakeDeadlineTimers(FakeClock& clock, boost::asio::io_context& io) : clock_(clock), io_(io) {}
  FakeDeadlineTimers(const FakeDeadlineTimers&) = delete;
  FakeDeadlineTimers& operator=(const FakeDeadlineTimers&) = delete;

  std::unique_ptr<agent::DeadlineTimer> make() override { return std::make_unique<Timer>(*this); }

  /// Moves the clock on by `by` and posts the callback of each timer now due.
  void advance(common::Duration by) {
    clock_.advance(by);
    for (Timer* timer : timers_) timer->fire_if_due(clock_.now());
  }

  /// How many timers are armed now.
  int armed() const {
    int n = 0;
    for (const Timer* timer : timers_) n += timer->armed() ? 1 : 0;
    return n;
  }

 private:
  class Timer final : public agent::DeadlineTimer {
   public:
    explicit Timer(FakeDeadlineTimers& owner) : owner_(owner) { owner_.timers_.insert(this); }
    ~Timer() override {
      *alive_ = false;  // a callback posted before stays stale
      owner_.timers_.erase(this);
    }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;

    void arm(common::TimePoint at, std::function<void()> fired) override {
      ++generation_;
      at_ = at;
      fired_ = std::move(fired);
      fire_if_due(owner_.clock_.now());  // a deadline already past fires at once, as asio's
    }
    void cancel() override {
      ++generation_;
      at_.reset();
    }
    bool armed() const { return at_.has_value(); }

    /// Posts the callback when due; a cancel() or arm() before it runs stops it.
    void fire_if_due(common::TimePoint now) {
      if (!at_ || *at_ > now) return;
      at_.reset();
      boost::asio::post(owner_.io_,
                        [this, fired = fired_, generation = generation_, alive = alive_] {
                          if (*alive && generation == generation_) fired();
                        });
    }

   private:
    FakeDeadlineTimers& owner_;
    std::optional<common::TimePoint> at_;
    std::function<void()> fired_;
    unsigned long generation_ = 0;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  };

  FakeClock& clock_;
  boost::asio::io_context& io_;
  std::set<Timer*> timers_;
};

}  // namespace ddprun::testing
