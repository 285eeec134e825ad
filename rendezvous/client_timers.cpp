#include "rendezvous/client_timers.h"

#include "common/log.h"

namespace ddprun::rdzv {

ClientTimers::ClientTimers(boost::asio::io_context& io)
    : timers_{boost::asio::steady_timer(io), boost::asio::steady_timer(io),
              boost::asio::steady_timer(io), boost::asio::steady_timer(io)} {}

boost::asio::steady_timer& ClientTimers::timer(ClientTimer which) {
  return timers_[static_cast<size_t>(which)];
}

void ClientTimers::arm(const ArmClientTimer& effect, std::function<void(const ClientEvent&)> due) {
  auto& t = timer(effect.timer);
  t.expires_after(effect.after);
  t.async_wait([which = effect.timer, due = std::move(due)](boost::system::error_code ec) {
    if (ec) return;
    switch (which) {
      case ClientTimer::Retry:
        return due(RetryDue{});
      case ClientTimer::Heartbeat:
        return due(HeartbeatDue{});
      case ClientTimer::Status:
        return due(StatusDue{});
      case ClientTimer::Greeting:
        return due(GreetingDue{});
    }
  });
}

void ClientTimers::disarm(ClientTimer which) { timer(which).cancel(); }

void log_client_line(const ClientLog& line) {
  switch (line.level) {
    case ClientLogLevel::Debug:
      return spdlog::debug("{}", line.text);
    case ClientLogLevel::Info:
      return spdlog::info("{}", line.text);
    case ClientLogLevel::Warn:
      return spdlog::warn("{}", line.text);
  }
}

}  // namespace ddprun::rdzv
