#pragma once
// A Clock whose time moves only when a test says so.
#include "common/clock.h"

namespace ddprun::testing {

class FakeClock final : public common::Clock {
 public:
  common::TimePoint now() const override { return now_; }
  void advance(common::Duration by) { now_ += by; }

 private:
  common::TimePoint now_{std::chrono::hours(1)};
};

}  // namespace ddprun::testing
