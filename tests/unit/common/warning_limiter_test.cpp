#include "common/warning_limiter.h"

#include <spdlog/sinks/ostream_sink.h>

#include <catch2/catch.hpp>
#include <memory>
#include <sstream>
#include <string>

using ddprun::common::WarningLimiter;

namespace {

/// The default logger writes into `text` while it lives.
struct CapturedLog {
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  CapturedLog() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(text);
    sink->set_pattern("%v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous); }
  int lines_with(const std::string& part) const {
    int n = 0;
    std::istringstream lines(text.str());
    for (std::string line; std::getline(lines, line);) n += line.find(part) != std::string::npos;
    return n;
  }
};

}  // namespace

TEST_CASE("a flood of warnings logs a burst, then their count once the interval is over",
          "[common][unit][security]") {
  CapturedLog log;
  boost::asio::io_context io;
  WarningLimiter limiter(io, "test peers", 3, std::chrono::milliseconds(200));
  for (int i = 0; i < 10; ++i) limiter.warn("stranger " + std::to_string(i));
  CHECK(log.lines_with("stranger") == 3);
  CHECK(log.lines_with("not logged") == 0);
  // Nothing else comes: the count is told when the interval ends, by the timer.
  io.run_for(std::chrono::seconds(2));
  CHECK(log.lines_with("7 more warning(s) about test peers were not logged") == 1);
  // A new interval logs a new burst.
  limiter.warn("stranger again");
  CHECK(log.lines_with("stranger again") == 1);
}

TEST_CASE("warnings still counted when their owner stops are told then",
          "[common][unit][security]") {
  CapturedLog log;
  boost::asio::io_context io;
  {
    WarningLimiter limiter(io, "test peers", 1, std::chrono::seconds(60));
    limiter.warn("a");
    limiter.warn("b");
    limiter.warn("c");
    limiter.stop();
    CHECK(log.lines_with("2 more warning(s) about test peers were not logged") == 1);
    // Warnings while the owner drains arm no timer again (the io_context runs out of work);
    // the limiter's end tells their count.
    limiter.warn("d");
    io.run_for(std::chrono::milliseconds(500));  // returns at once when nothing is pending
    CHECK(io.stopped());
  }
  CHECK(log.lines_with("1 more warning(s) about test peers were not logged") == 1);
  CHECK(log.lines_with("not logged") == 2);
}
