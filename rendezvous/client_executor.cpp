#include "rendezvous/client_executor.h"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <variant>

#include "common/overloaded.h"
#include "rendezvous/auth.h"
#include "rendezvous/free_port.h"
#include "rendezvous/local_host.h"

namespace ddprun::rdzv {

std::string new_node_id() {
  return local_host_name() + ":" + std::to_string(::getpid()) + ":" + make_nonce().substr(0, 32);
}

int master_port_for(const std::optional<int>& fixed, const std::string& addr) {
  if (fixed) return *fixed;
  auto port = find_free_port(addr);
  if (!port.ok()) port = find_free_port("");
  return port.ok() ? *port : 0;
}

ClientExecutor::ClientExecutor(boost::asio::io_context& io, const common::Clock& clock)
    : io_(io), clock_(clock), node_id_(new_node_id()), timers_(io) {}

void ClientExecutor::next_rendezvous(std::function<void(RendezvousResult)> done) {
  done_ = std::move(done);
  step(NextRound{});
}

void ClientExecutor::set_notice_handler(std::function<void(Notice)> handler) {
  on_notice_ = std::move(handler);
}

void ClientExecutor::report_failure(const WorkersFailed& failure) { step(ReportFailure{failure}); }

void ClientExecutor::report_success() { step(ReportSuccess{}); }

void ClientExecutor::keep_out(const std::string& why) { step(KeepOut{why}); }

void ClientExecutor::leave(const std::string& reason) { step(LeaveJob{reason}); }

void ClientExecutor::step(const ClientEvent& event) {
  for (const ClientEffect& effect : rdzv_client_step(state_, event, clock_.now(), spec_))
    apply(effect);
}

void ClientExecutor::apply(const ClientEffect& effect) {
  std::visit(common::Overloaded{
                 [&](const Connect&) { connect(); },
                 [&](const SendJoin& join) { send_join(join.join); },
                 [&](const Send& out) { send(out.message); },
                 [&](const Deliver& deliver) {
                   auto done = std::move(done_);
                   done_ = nullptr;
                   if (!done) return;
                   if (deliver.posted)
                     // Nothing reaches an agent that left in between (Detach).
                     boost::asio::post(io_, [this, alive = alive_, done = std::move(done),
                                             result = deliver.result] {
                       if (*alive && !detached_) done(result);
                     });
                   else
                     done(deliver.result);
                 },
                 [&](const Notify& notify) {
                   // A copy: the agent may leave (Detach) from inside its handler.
                   if (auto handler = on_notice_) handler(notify.notice);
                 },
                 [&](const CloseConnection& close) { close_link(close.after_writes); },
                 [&](const RenewNodeId&) {
                   node_id_ = new_node_id();
                   node_id_renewed();
                 },
                 [&](const Detach&) {
                   detached_ = true;
                   done_ = nullptr;
                   on_notice_ = nullptr;
                 },
                 [&](const ArmClientTimer& arm) {
                   timers_.arm(arm, [this, alive = alive_](const ClientEvent& due) {
                     if (*alive) step(due);
                   });
                 },
                 [&](const DisarmClientTimer& disarm) { timers_.disarm(disarm.timer); },
                 [&](const ClientLog& line) { log_line(line); },
             },
             effect);
}

}  // namespace ddprun::rdzv
