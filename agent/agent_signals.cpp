#include "agent/agent_signals.h"

#include <pthread.h>

#include <algorithm>
#include <csignal>

#include "common/log.h"
#include "common/signals.h"

namespace ddprun::agent {

void handle_agent_signals(boost::asio::signal_set& set, const std::vector<int>& to_handle,
                          bool sigchld) {
  boost::system::error_code ec;
  if (sigchld) set.add(SIGCHLD, ec);
  std::vector<int> sigs = to_handle;
  // Left to their default action the notices would kill the agent, and with it (PDEATHSIG)
  // every worker.
  for (int notice : {SIGUSR1, SIGUSR2})
    if (std::find(sigs.begin(), sigs.end(), notice) == sigs.end()) sigs.push_back(notice);
  for (int sig : sigs) {
    set.add(sig, ec);
    if (ec) spdlog::warn("cannot handle {}: {}", common::signal_name(sig), ec.message());
  }
  sigset_t notices;
  sigemptyset(&notices);
  sigaddset(&notices, SIGUSR1);
  sigaddset(&notices, SIGUSR2);
  pthread_sigmask(SIG_UNBLOCK, &notices, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
}

}  // namespace ddprun::agent
