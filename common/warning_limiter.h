#pragma once
// Warnings that a stranger can cause (refused connections, bad frames, store requests over a
// limit) are logged at most `burst` per `interval`, so a flood cannot flood the log or the job's
// console with it; the rest are counted, and the count is logged when the interval ends (from a
// timer, so a flood that stops is still told) and when the limiter goes (the server stops).
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/log.h"

namespace ddprun::common {

class WarningLimiter {
 public:
  /// `about` ends the count's line: "<n> more warning(s) about <about> were not logged".
  WarningLimiter(boost::asio::io_context& io, std::string about, int burst = 20,
                 std::chrono::milliseconds interval = std::chrono::seconds(10))
      : timer_(io), about_(std::move(about)), burst_(burst), interval_(interval) {}
  WarningLimiter(const WarningLimiter&) = delete;
  WarningLimiter& operator=(const WarningLimiter&) = delete;
  ~WarningLimiter() { log_dropped(); }

  /// Logs `text` as a warning, or counts it when `burst` were logged in this interval.
  void warn(const std::string& text) {
    if (stopped_) {
      // Draining after stop(): no timer is armed again; the destructor tells the count.
      if (logged_ < burst_) {
        ++logged_;
        spdlog::warn("{}", text);
      } else {
        ++dropped_;
      }
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!started_ || now - since_ >= interval_) {
      log_dropped();
      since_ = now;
      started_ = true;
      logged_ = 0;
    }
    if (logged_ >= burst_) {
      if (dropped_++ == 0) {
        // The first one held back: its count is told when this interval ends.
        timer_.expires_at(since_ + interval_);
        timer_.async_wait(
            [this, alive = std::weak_ptr<bool>(alive_)](boost::system::error_code ec) {
              if (!ec && alive.lock()) log_dropped();
            });
      }
      return;
    }
    ++logged_;
    spdlog::warn("{}", text);
  }

  /// The owner stops: the count is told now, and nothing stays pending on the io_context.
  void stop() {
    stopped_ = true;
    timer_.cancel();
    log_dropped();
  }

  /// Logs the count of warnings held back so far (nothing when there are none).
  void log_dropped() {
    if (dropped_ == 0) return;
    spdlog::warn("{} more warning(s) about {} were not logged", dropped_, about_);
    dropped_ = 0;
  }

 private:
  boost::asio::steady_timer timer_;
  std::string about_;
  int burst_;
  std::chrono::steady_clock::duration interval_;
  bool started_ = false;
  std::chrono::steady_clock::time_point since_{};
  int logged_ = 0;
  std::uint64_t dropped_ = 0;
  bool stopped_ = false;
  /// Gone with the limiter: a timer completion already queued then does nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ddprun::common
