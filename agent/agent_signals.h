#pragma once
#include <vector>

#include <boost/asio/signal_set.hpp>

namespace ddprun::agent {

/// Makes `set` deliver what the agent acts on: SIGCHLD (reap; unless `sigchld` is false, when
/// the process launcher says itself that a child ended), the stop signals in
/// `to_handle` (--signals_to_handle), and always the preemption notices SIGUSR1 and SIGUSR2,
/// which launch() blocked while ddprun started (one that came meanwhile is delivered now).
/// SIGPIPE and SIGXFSZ are ignored: a closed console or a log file past RLIMIT_FSIZE must not
/// kill the agent while it has workers to stop; the failed write is reported instead.
void handle_agent_signals(boost::asio::signal_set& set, const std::vector<int>& to_handle,
                          bool sigchld = true);

}  // namespace ddprun::agent
