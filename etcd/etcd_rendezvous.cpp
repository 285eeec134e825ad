#include "etcd/etcd_rendezvous.h"

#include <algorithm>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/post.hpp>
#include <utility>

#include "common/log.h"
#include "common/strings.h"
#include "rendezvous/local_host.h"

namespace ddprun::etcd {

namespace asio = boost::asio;
using boost::system::error_code;
using namespace rdzv;  // NOLINT: the client machine's vocabulary throughout

namespace {

/// etcd's text for a request over its --max-request-bytes (ErrRequestTooLarge).
constexpr std::string_view kEtcdTooLarge = "request is too large";

/// What to fix when etcd's answer to this node's first request is a refusal that no retry can
/// cure (authentication, permissions, certificates), or nullopt for anything that may pass.
std::optional<std::string> final_refusal_fix(const std::string& why) {
  const auto has = [&why](std::string_view text) { return why.find(text) != std::string::npos; };
  if (has("user name is empty"))
    return "etcd has authentication on: give --rdzv_conf etcd_user and etcd_password_file";
  if (has("invalid user ID or password"))
    return "check --rdzv_conf etcd_user and the password in etcd_password_file";
  if (has("permission denied"))
    return "etcd_user's role must allow reading and writing keys under /ddprun/ (etcdctl role "
           "grant-permission ROLE --prefix=true readwrite /ddprun/)";
  if (has(kNotEtcdApi))
    return "the endpoint answers HTTP but is no etcd member: give each member's client URL in "
           "--rdzv_endpoint (etcd's --advertise-client-urls, port 2379 by default)";
  if (has("certificate verify failed") || has("bad certificate") || has("certificate required") ||
      has("unknown ca"))
    return "check --rdzv_conf tls_ca, tls_cert and tls_key against the etcd members' TLS "
           "settings";
  return std::nullopt;
}

/// The local address of the interface that reaches `member`, once its name is resolved (a UDP
/// socket sends nothing when connected), made publishable by advertised_address(); the host
/// name when that fails.
std::string address_towards(asio::io_context& io,
                            const asio::ip::udp::resolver::results_type& member) {
  if (!member.empty()) {
    error_code ec;
    asio::ip::udp::socket socket(io);
    socket.connect(member.begin()->endpoint(), ec);
    if (!ec) {
      auto local = socket.local_endpoint(ec);
      if (!ec) return advertised_address(local.address().to_string());
    }
  }
  return fully_qualified_host_name();
}

std::string members_text(const std::vector<Member>& members) {
  std::vector<std::string> texts;
  for (const Member& m : members) texts.push_back(m.text());
  return common::join(texts, ",");
}

}  // namespace

EtcdRendezvous::EtcdRendezvous(asio::io_context& io, const common::Clock& clock,
                               EtcdRendezvousOptions options)
    : ClientExecutor(io, clock),
      opt_(std::move(options)),
      prefix_(job_prefix(opt_.run_id)),
      client_(std::make_shared<Client>(io, opt_.client)),
      drive_timer_(io) {
  spec_.run_id = opt_.run_id;
  spec_.endpoint = members_text(opt_.client.members);
  spec_.server = "etcd cluster";
  spec_.unreachable_advice =
      "check --rdzv_endpoint (every etcd member's client URL) and that the etcd members run; "
      "see docs/operations.md#troubleshooting";
  spec_.name = opt_.name;
  spec_.node_rank = opt_.node_rank;
  spec_.settings = opt_.settings;
  spec_.connect_timeout = opt_.connect_timeout;
  spec_.status_interval = opt_.status_interval;
  // The lease carries the keep-alive: a node silent for the whole window loses its keys.
  const auto window = std::chrono::duration_cast<std::chrono::seconds>(
      opt_.settings.keep_alive_window() + std::chrono::milliseconds(999));
  lease_ttl_ = std::max(window, std::chrono::seconds(2));
  // Long enough for the next driver to take the job's lease over after a driver died (its own
  // lease must expire first), short enough that a dead job does not linger.
  job_lease_ttl_ = 2 * lease_ttl_ + std::chrono::seconds(10);
  anchor_.steady = clock_.now();
  anchor_.wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  view_.prefix = prefix_;
  if (opt_.settings.max_nodes > static_cast<int>(kMaxNodesOnEtcd))
    spdlog::warn(
        "--nnodes allows {} nodes, but one job on etcd v3 holds at most {}: the joins beyond are "
        "refused; run jobs this large on ddprun-rdzvd (--rdzv_backend c10d)",
        opt_.settings.max_nodes, kMaxNodesOnEtcd);
}

EtcdRendezvous::~EtcdRendezvous() {
  *alive_ = false;
  if (keeper_) keeper_->stop();
  if (job_keeper_) job_keeper_->stop();
  if (watch_) watch_->cancel();
  if (role_watch_) role_watch_->cancel();
  client_->close();
}

void EtcdRendezvous::send(const AgentMessage& message) {
  // Heartbeats are the lease's keep-alive; a leave goes out with the link's close (close_link).
  if (const auto* leave = std::get_if<Leave>(&message)) {
    leave_ = *leave;
    return;
  }
  if (std::holds_alternative<WorkersFailed>(message) ||
      std::holds_alternative<WorkersSucceeded>(message))
    send_report(message);
}

void EtcdRendezvous::close_link(bool after_writes) {
  // A leave: the lease goes, and with it this node's keys (the driver sees them deleted). A
  // Leave sent before is put first, so the driver reads that this node left rather than lost it.
  std::optional<Leave> leave = std::exchange(leave_, std::nullopt);
  if (after_writes && leave && linked_ && lease_ != 0 && my_create_revision_ != 0)
    leave_then_revoke(*leave);
  else if (after_writes)
    revoke_lease({});
  drop_link();
}

void EtcdRendezvous::leave_then_revoke(const Leave& leave) {
  if (keeper_) keeper_->stop();
  keeper_.reset();
  const std::int64_t lease = std::exchange(lease_, 0);
  const std::int64_t created = std::exchange(my_create_revision_, 0);
  leaving_ = true;
  // The Leave report and the delete of this node's key in one txn: the driver sees both at one
  // revision, whenever it reads. The report lives on a lease of its own as long as the job's
  // (a driver that died meanwhile is replaced within it), then goes by itself.
  const std::string key = node_key(prefix_, node_id_);
  const std::string report = report_key(prefix_, node_id_);
  client_->call_as<LeaseGrantResponse>(
      lease_grant(job_lease_ttl_.count()), decode_lease_grant,
      [this, alive = alive_, lease, created, key, report,
       value = encode_message(leave)](common::Result<LeaseGrantResponse> granted) {
        if (!*alive) return;
        if (!granted) return left(lease);
        Compare mine{key, CompareTarget::CreateRevision, CompareResult::Equal, created, {}};
        client_->call_as<TxnResponse>(
            txn({mine}, {PutOp{report, value, granted->id, false}, DeleteOp{key, {}, false}}, {}),
            decode_txn,
            [this, alive, lease, report_lease = granted->id](common::Result<TxnResponse> done) {
              if (!*alive) return;
              // Not put (this node's key was gone already): the report's lease is not needed.
              if (!done || !done->succeeded)
                client_->call(lease_revoke(report_lease), [](Reply) {});
              left(lease);
            });
      });
}

void EtcdRendezvous::left(std::int64_t lease) {
  client_->call(lease_revoke(lease), [this, alive = alive_](Reply) {
    if (!*alive) return;
    leaving_ = false;
    for (auto& waiting : std::exchange(after_leave_, {})) waiting();
  });
}

void EtcdRendezvous::lost(const std::string& why) {
  // A refusal no retry cures (authentication, permissions, certificates) ends the node now,
  // where a retry until connect_timeout would only delay the same answer.
  if (auto fix = final_refusal_fix(why)) {
    if (state_.phase != ClientPhase::Done)
      step(ServerUnusable{RendezvousError{RendezvousErrorKind::Connection,
                                          "etcd refused this node: " + why + "; " + *fix}});
    return;
  }
  step(ConnectionLost{why});
}

void EtcdRendezvous::node_id_renewed() { my_create_revision_ = 0; }

void EtcdRendezvous::drop_link() {
  ++generation_;
  linked_ = false;
  reset_role();
  if (watch_) {
    auto watch = std::move(watch_);
    watch->cancel();
  }
}

void EtcdRendezvous::reset_role() {
  ++role_generation_;
  role_ = Role::Unknown;
  view_ready_ = false;
  drive_timer_.cancel();
  if (job_keeper_) job_keeper_->stop();
  job_keeper_.reset();
  job_lease_ = 0;
  if (role_watch_) {
    auto watch = std::move(role_watch_);
    watch->cancel();
  }
}

void EtcdRendezvous::connect() {
  drop_link();
  const std::uint64_t generation = generation_;
  // Connecting: a lease (unless this node holds one), a read of the job's keys, a watch from the
  // revision after the read; then the link is ready and the join goes out.
  if (lease_ != 0) {
    // The lease outlived an outage of etcd (leases are extended when a new leader is elected):
    // renew it again; if etcd says it is gone, this node joins again as a new one.
    if (!keeper_) keep_lease_alive();
    return read_and_watch(generation);
  }
  client_->call_as<LeaseGrantResponse>(
      lease_grant(lease_ttl_.count()), decode_lease_grant,
      [this, generation, alive = alive_](common::Result<LeaseGrantResponse> granted) {
        if (*alive) on_lease_granted(generation, std::move(granted));
      });
}

void EtcdRendezvous::on_lease_granted(std::uint64_t generation,
                                      common::Result<LeaseGrantResponse> granted) {
  if (!granted) {
    if (generation == generation_) lost(granted.error().message);
    return;
  }
  if (lease_ != 0 || generation != generation_) {
    // Not needed any more (a newer connect holds one, or the link was dropped): let it go.
    spdlog::debug("etcd: lease {} not needed any more; revoking it", granted->id);
    client_->call(lease_revoke(granted->id), [](Reply) {});
    return;
  }
  lease_ = granted->id;
  spdlog::debug("etcd: lease {} granted for {} s", lease_, granted->ttl);
  keep_lease_alive();
  read_and_watch(generation);
}

void EtcdRendezvous::read_and_watch(std::uint64_t generation) {
  // This node's messages key: the revision now, then a watch from the next one. The join goes
  // out after, so no message answering it can be missed.
  inbox_key_ = messages_key(prefix_, node_id_);
  RangeOp now{inbox_key_};
  now.count_only = true;
  client_->call_as<RangeResponse>(
      range(now), decode_range,
      [this, generation, alive = alive_](common::Result<RangeResponse> read) {
        if (*alive) on_read(generation, std::move(read));
      });
}

void EtcdRendezvous::on_read(std::uint64_t generation, common::Result<RangeResponse> read) {
  if (generation != generation_) {
    spdlog::debug("etcd: a read of job '{}' from an older connection is dropped", opt_.run_id);
    return;
  }
  if (!read) return lost(read.error().message);
  WatchOptions options;
  // Only this node's messages key: it carries the messages to about N / kMessageKeys nodes.
  // Joins, reports and `state` reach the driver only.
  options.key = inbox_key_;
  options.start_revision = read->header.revision + 1;
  watch_ = client_->watch(
      options,
      [this, generation, alive = alive_](const WatchResponse& response) {
        if (*alive) on_watch(generation, response);
      },
      [this, generation, alive = alive_](const common::Error& error) {
        if (!*alive || generation != generation_) return;
        lost("the watch of " + inbox_key_ + " ended: " + error.message);
      });
  linked_ = true;
  step(Connected{true});
  step(Greeted{});
  if (unsent_report_ && linked_) {
    auto report = std::move(*unsent_report_);
    unsent_report_.reset();
    send_report(report);
  }
  elect();
}

void EtcdRendezvous::keep_lease_alive() {
  const std::int64_t lease = lease_;
  keeper_ = std::make_shared<LeaseKeeper>(
      client_, lease, lease_ttl_, [this, alive = alive_, lease](const common::Error& error) {
        if (!*alive) return;
        const bool gone = keeper_ && keeper_->gone();
        on_lease_lost(lease, error.message, gone);
      });
  keeper_->start();
}

void EtcdRendezvous::on_lease_lost(std::int64_t lease, const std::string& why, bool gone) {
  if (lease != lease_) return;
  keeper_.reset();
  if (!gone) {
    // etcd did not answer for a whole TTL: the workers keep running while the client
    // reconnects (for connect_timeout); the lease is renewed again once etcd answers.
    if (state_.phase != ClientPhase::Done) lost(why);
    return;
  }
  lease_ = 0;
  my_create_revision_ = 0;
  if (state_.phase == ClientPhase::Done) return;
  // The keys went with the lease: the driver counts this node as lost. Like a node the TCP
  // server dropped, it joins again under a new id (its running workers restart).
  step(FrameReceived{
      Refused{RefusalKind::Dropped,
              "this node's etcd lease " + std::to_string(lease) + " is gone (" + why + ")"}});
}

void EtcdRendezvous::join_as(Join join, bool second_try) {
  if (!linked_ || lease_ == 0) {
    spdlog::debug("etcd: no join sent: {}", linked_ ? "no lease" : "not connected");
    return;
  }
  join.node_id = node_id_;
  if (!opt_.local_addr.empty()) {
    join.addr = opt_.local_addr;
  } else if (advertised_addr_.empty()) {
    // The first join: the address this node is reached at is that of its interface towards
    // the etcd member, whose name is resolved on the event loop, never by blocking it.
    const Member member = client_->current_member();
    auto resolver = std::make_shared<asio::ip::udp::resolver>(io_);
    resolver->async_resolve(
        member.host, std::to_string(member.port),
        [this, alive = alive_, generation = generation_, resolver, join, second_try](
            const error_code& ec, const asio::ip::udp::resolver::results_type& results) {
          if (!*alive) return;
          advertised_addr_ =
              address_towards(io_, ec ? asio::ip::udp::resolver::results_type{} : results);
          if (generation == generation_) join_as(join, second_try);
        });
    return;
  } else {
    join.addr = advertised_addr_;
  }
  join.master_port = rdzv::master_port_for(opt_.master_port, join.addr);
  const std::string key = node_key(prefix_, node_id_);
  // Still this node's own key (created by its first join), or no key yet.
  Compare mine{key, CompareTarget::CreateRevision, CompareResult::Equal, my_create_revision_, {}};
  PutOp put_join{key, encode_message(join), lease_, false};
  const std::uint64_t generation = generation_;
  client_->call_as<TxnResponse>(
      txn({mine}, {put_join}, {RangeOp{key, {}, 0, 0, false}}), decode_txn,
      [this, generation, alive = alive_, join, key,
       second_try](common::Result<TxnResponse> answer) {
        if (!*alive || generation != generation_) return;
        if (!answer) return lost(answer.error().message);
        if (answer->succeeded) {
          if (my_create_revision_ == 0) my_create_revision_ = answer->header.revision;
          spdlog::debug("etcd: joined as {} at revision {}", key, answer->header.revision);
          if (unsent_report_) {
            // A report that waited for this node's key (a reconnect or a new id).
            auto report = std::move(*unsent_report_);
            unsent_report_.reset();
            send_report(report);
          }
          // Which node drives: known once this node's key has its create revision.
          return elect();
        }
        std::optional<KeyValue> found;
        if (!answer->responses.empty())
          if (const auto* r = std::get_if<RangeResponse>(&answer->responses[0]))
            if (!r->kvs.empty()) found = r->kvs[0];
        if (found && found->lease == lease_ && !second_try) {
          // An earlier put whose answer was lost went through: the key is this node's.
          my_create_revision_ = found->create_revision;
          return join_as(join, true);
        }
        if (my_create_revision_ == 0)
          return step(ServerUnusable{RendezvousError{
              RendezvousErrorKind::State,
              "the etcd key " + key + " belongs to another node (lease " +
                  std::to_string(found ? found->lease : 0) + "); node ids must be unique"}});
        // The key is gone: the lease expired while this node still ran.
        on_lease_lost(lease_, "its key " + key + " was deleted", true);
      });
}

void EtcdRendezvous::send_report(const AgentMessage& message) {
  if (!linked_ || lease_ == 0 || my_create_revision_ == 0) {
    unsent_report_ = message;
    return;
  }
  const std::string key = report_key(prefix_, node_id_);
  Compare mine{node_key(prefix_, node_id_),
               CompareTarget::CreateRevision,
               CompareResult::Equal,
               my_create_revision_,
               {}};
  const std::uint64_t generation = generation_;
  client_->call_as<TxnResponse>(
      txn({mine}, {PutOp{key, encode_message(message), lease_, false}}, {}), decode_txn,
      [this, generation, alive = alive_, message](common::Result<TxnResponse> answer) {
        if (!*alive) return;
        if (!answer) {
          // Sent again once etcd answers (the driver applies a report once per revision).
          unsent_report_ = message;
          if (generation == generation_) lost(answer.error().message);
          return;
        }
        if (!answer->succeeded && generation == generation_)
          on_lease_lost(lease_, "its key " + node_key(prefix_, node_id_) + " was deleted", true);
      });
}

void EtcdRendezvous::on_watch(std::uint64_t generation, const WatchResponse& response) {
  if (generation != generation_) return;
  for (const Event& event : response.events) {
    if (generation != generation_) return;  // a callback below reconnected
    if (event.kv.key != inbox_key_) continue;
    if (event.type == Event::Type::Put) {
      auto decoded = decode_notices(event.kv.value, event.kv.key, node_id_);
      if (!decoded) {
        if (state_.phase != ClientPhase::Done)
          step(
              ServerUnusable{RendezvousError{RendezvousErrorKind::State, decoded.error().message}});
        continue;
      }
      last_phase_ = decoded->phase;
      last_messages_revision_ = event.kv.mod_revision;
      for (const ServerMessage& message : decoded->messages) {
        step(FrameReceived{message});
        if (generation != generation_) return;
      }
      continue;
    }
    // The job's keys were deleted: the job ended (its Closed came before) or someone removed
    // them by hand.
    if (last_phase_ != JobPhase::Closed && state_.phase != ClientPhase::Done)
      step(ServerUnusable{RendezvousError{RendezvousErrorKind::Closed,
                                          "the rendezvous state of job '" + opt_.run_id +
                                              "' was deleted from etcd (" + inbox_key_ +
                                              ") while the job ran"}});
  }
}

void EtcdRendezvous::elect() {
  if (!linked_ || my_create_revision_ == 0 || role_ != Role::Unknown) return;
  role_ = Role::Electing;
  const std::uint64_t generation = ++role_generation_;
  // etcd's election recipe: the node key created last before this node's. None: this node's
  // is the oldest, it drives. Keys only, one at most: a few hundred bytes whatever N.
  RangeOp before{nodes_dir(prefix_), prefix_end(nodes_dir(prefix_))};
  before.limit = 1;
  before.keys_only = true;
  before.sort = RangeSort::NewestCreatedFirst;
  before.max_create_revision = std::max<std::int64_t>(1, my_create_revision_ - 1);
  client_->call_as<RangeResponse>(
      range(before), decode_range,
      [this, generation, alive = alive_](common::Result<RangeResponse> read) {
        if (!*alive || generation != role_generation_) return;
        role_ = Role::Unknown;
        if (!read) return lost(read.error().message);
        if (read->kvs.empty()) return become_driver();
        follow(read->kvs[0].key, read->header.revision);
      });
}

void EtcdRendezvous::follow(const std::string& key, std::int64_t revision) {
  role_ = Role::Follower;
  const std::uint64_t generation = role_generation_;
  spdlog::debug("etcd: {} waits for {} to go before it may drive", node_id_, key);
  WatchOptions options;
  options.key = key;
  options.start_revision = revision + 1;
  role_watch_ = client_->watch(
      options,
      [this, generation, alive = alive_](const WatchResponse& response) {
        if (!*alive || generation != role_generation_) return;
        for (const Event& event : response.events) {
          if (event.type != Event::Type::Delete) continue;
          // The node before this one is gone: this one may be the oldest now.
          reset_role();
          return elect();
        }
      },
      [this, generation, key, alive = alive_](const common::Error& error) {
        if (!*alive || generation != role_generation_) return;
        lost("the watch of " + key + " ended: " + error.message);
      });
}

void EtcdRendezvous::become_driver() {
  role_ = Role::Driver;
  const std::uint64_t generation = role_generation_;
  spdlog::info("this node drives the rendezvous of job '{}' in etcd", opt_.run_id);
  // `state`, nodes/ and reports/ at one revision: the range from nodes/ to just after `state`
  // (messages/ sorts before it).
  RangeOp all{nodes_dir(prefix_), state_key(prefix_) + std::string(1, '\0')};
  client_->call_as<RangeResponse>(
      range(all), decode_range,
      [this, generation, alive = alive_](common::Result<RangeResponse> read) {
        if (*alive) on_driver_read(generation, std::move(read));
      });
}

void EtcdRendezvous::on_driver_read(std::uint64_t generation, common::Result<RangeResponse> read) {
  if (generation != role_generation_) return;
  if (!read) return lost(read.error().message);
  load_range(view_, read->kvs);
  spdlog::debug("etcd: the driver read {} key(s) of job '{}' at revision {}", read->kvs.size(),
                opt_.run_id, read->header.revision);
  WatchOptions options;
  // Joins and reports, not `state`: it grows with the job and is put on every change; the
  // driver keeps what it wrote and reads it again when its compare fails.
  options.key = nodes_dir(prefix_);
  options.range_end = reports_end(prefix_);
  options.start_revision = read->header.revision + 1;
  role_watch_ = client_->watch(
      options,
      [this, generation, alive = alive_](const WatchResponse& response) {
        if (!*alive || generation != role_generation_) return;
        for (const Event& event : response.events) apply_event(view_, event);
        maybe_drive();
      },
      [this, generation, alive = alive_](const common::Error& error) {
        if (!*alive || generation != role_generation_) return;
        lost("the watch of " + nodes_dir(prefix_) + " ended: " + error.message);
      });
  view_ready_ = true;
  maybe_drive();
}

void EtcdRendezvous::maybe_drive() {
  if (role_ != Role::Driver || !view_ready_) return;
  if (driver_of(view_) != node_id_) {
    // This node's key is gone (its lease expired): it drives no more, and joins again under a
    // new id once its lease's loss is known.
    spdlog::debug("etcd: {} is no longer the oldest node of job '{}'", node_id_, opt_.run_id);
    return reset_role();
  }
  if (writing_ || granting_job_lease_) {
    drive_again_ = true;
    return;
  }
  // The job's own lease: `state` and `messages/` live on it, and the driver keeps it alive, so a
  // job whose every agent died disappears from etcd when it runs out.
  const std::int64_t job_lease = view_.state ? view_.state->lease : 0;
  if (job_lease != 0 && (job_lease != job_lease_ || !job_keeper_)) keep_job_lease(job_lease);
  if (job_lease == 0 && job_lease_ == 0) return grant_job_lease();
  StoredState current;
  if (view_.state) {
    auto decoded = decode_state(view_.state->value, view_.state->key, anchor_, clock_.now());
    if (!decoded) {
      if (state_.phase != ClientPhase::Done)
        step(ServerUnusable{RendezvousError{RendezvousErrorKind::State, decoded.error().message}});
      return;
    }
    current = std::move(*decoded);
  } else {
    current.job = new_job(opt_.run_id, clock_.now());
  }
  current.messages.clear();
  DriveResult result = drive(std::move(current), view_, clock_.now());
  drive_timer_.cancel();
  if (result.wake_at) {
    drive_timer_.expires_at(*result.wake_at);
    drive_timer_.async_wait([this, alive = alive_](error_code ec) {
      if (!ec && *alive) maybe_drive();
    });
  }
  if (result.changed || result.erase) write_state(result);
}

void EtcdRendezvous::grant_job_lease() {
  granting_job_lease_ = true;
  const std::uint64_t generation = generation_;
  client_->call_as<LeaseGrantResponse>(
      lease_grant(job_lease_ttl_.count()), decode_lease_grant,
      [this, generation, alive = alive_](common::Result<LeaseGrantResponse> granted) {
        if (!*alive) return;
        granting_job_lease_ = false;
        drive_again_ = false;
        if (!granted) {
          spdlog::warn("could not write the rendezvous state of job '{}' to etcd: {}", opt_.run_id,
                       granted.error().message);
        } else if (generation == generation_ && role_ == Role::Driver) {
          keep_job_lease(granted->id);
          return maybe_drive();
        } else {
          client_->call(lease_revoke(granted->id), [](Reply) {});
        }
        drive_timer_.expires_after(std::chrono::milliseconds(200));
        drive_timer_.async_wait([this, alive](error_code ec) {
          if (!ec && *alive) maybe_drive();
        });
      });
}

void EtcdRendezvous::keep_job_lease(std::int64_t lease) {
  if (job_keeper_) job_keeper_->stop();
  job_lease_ = lease;
  job_keeper_ = std::make_shared<LeaseKeeper>(
      client_, lease, job_lease_ttl_, [this, alive = alive_, lease](const common::Error& error) {
        if (!*alive || lease != job_lease_) return;
        // Gone: `state` went with it (the next pass starts the job afresh); unreachable: the
        // next pass, once etcd answers, keeps it again.
        spdlog::debug("etcd: the job's lease {}: {}", lease, error.message);
        job_keeper_.reset();
        job_lease_ = 0;
      });
  job_keeper_->start();
}

void EtcdRendezvous::write_state(const DriveResult& result) {
  const std::string key = state_key(prefix_);
  std::vector<Compare> compares;
  // The fence: the state this pass started from is still the newest, and this node still holds
  // its key (a driver whose lease expired is no longer first).
  if (view_.state)
    compares.push_back(
        {key, CompareTarget::ModRevision, CompareResult::Equal, view_.state->mod_revision, {}});
  else
    compares.push_back({key, CompareTarget::CreateRevision, CompareResult::Equal, 0, {}});
  compares.push_back({node_key(prefix_, node_id_),
                      CompareTarget::CreateRevision,
                      CompareResult::Equal,
                      my_create_revision_,
                      {}});
  std::vector<Op> ops;
  std::string value;
  if (result.erase) {
    // Closed -> [erased]: close_timeout after the end, the job's keys go.
    ops.push_back(DeleteOp{prefix_, prefix_end(prefix_), false});
  } else {
    value = encode_state(result.next, anchor_);
    if (value.size() > kMaxStateBytes) {
      spdlog::error(
          "the rendezvous state of job '{}' would take {} bytes in etcd, more than {}: too many "
          "nodes for one etcd key",
          opt_.run_id, value.size(), kMaxStateBytes);
      return;
    }
    ops.push_back(PutOp{key, value, job_lease_, false});
    // Each message goes to its node's messages key: a node's watch carries only its own key.
    for (auto& [messages, notices] :
         notices_by_key(prefix_, result.next.job.phase, result.next.messages))
      ops.push_back(PutOp{messages, std::move(notices), job_lease_, false});
  }
  writing_ = true;
  const std::uint64_t generation = generation_;
  client_->call_as<TxnResponse>(
      txn(compares, ops, {}), decode_txn,
      [this, generation, alive = alive_, value](common::Result<TxnResponse> answer) {
        if (!*alive) return;
        writing_ = false;
        if (generation != generation_) return;
        if (!answer && answer.error().message.find(kEtcdTooLarge) != std::string::npos) {
          // etcd's answer to a request over its --max-request-bytes: the same write can never
          // pass, so retrying would only wait forever (and hold every other node waiting).
          if (state_.phase != ClientPhase::Done)
            step(ServerUnusable{RendezvousError{
                RendezvousErrorKind::State,
                "etcd refuses the rendezvous state of job '" + opt_.run_id + "' (" +
                    std::to_string(value.size()) + " bytes, with the nodes' messages) as too " +
                    "large (" + answer.error().message +
                    "): raise --max-request-bytes on every etcd member (1.5 MiB by default)"}});
          return;
        }
        if (!answer) {
          // Outcome unknown or etcd unreachable: the watch shows what happened; try again then.
          spdlog::warn("could not write the rendezvous state of job '{}' to etcd: {}", opt_.run_id,
                       answer.error().message);
          drive_timer_.expires_after(std::chrono::milliseconds(200));
          drive_timer_.async_wait([this, alive](error_code ec) {
            if (!ec && *alive) maybe_drive();
          });
          return;
        }
        if (answer->succeeded && !value.empty()) {
          // Ahead of the watch: the next pass starts from what was written.
          KeyValue written;
          written.key = state_key(prefix_);
          written.value = value;
          written.mod_revision = answer->header.revision;
          written.lease = job_lease_;
          written.create_revision =
              view_.state ? view_.state->create_revision : answer->header.revision;
          view_.state = written;
        }
        if (!answer->succeeded) {
          // A failed compare: another driver wrote (this one's copy of `state` is old), or this
          // node's key is gone (the watch shows the delete).
          drive_again_ = false;
          return refresh_state();
        }
        if (drive_again_) {
          drive_again_ = false;
          maybe_drive();
        }
      });
}

void EtcdRendezvous::refresh_state() {
  const std::uint64_t generation = generation_;
  const std::int64_t had = view_.state ? view_.state->mod_revision : 0;
  client_->call_as<RangeResponse>(
      range({state_key(prefix_), {}, 0, 0, false}), decode_range,
      [this, generation, had, alive = alive_](common::Result<RangeResponse> read) {
        if (!*alive || generation != generation_) return;
        std::int64_t now_at = had;
        if (read) {
          if (read->kvs.empty())
            view_.state.reset();
          else
            view_.state = read->kvs[0];
          now_at = view_.state ? view_.state->mod_revision : 0;
        }
        if (read && now_at != had) return maybe_drive();
        // Nothing newer (or etcd did not answer): the watch or a short wait brings the change.
        drive_timer_.expires_after(std::chrono::milliseconds(200));
        drive_timer_.async_wait([this, alive](error_code ec) {
          if (!ec && *alive) maybe_drive();
        });
      });
}

void EtcdRendezvous::revoke_lease(std::function<void()> done) {
  if (keeper_) keeper_->stop();
  keeper_.reset();
  const std::int64_t lease = lease_;
  lease_ = 0;
  my_create_revision_ = 0;
  if (lease == 0) {
    if (done) asio::post(io_, std::move(done));
    return;
  }
  client_->call(lease_revoke(lease), [done = std::move(done)](Reply) {
    if (done) done();
  });
}

void EtcdRendezvous::when_flushed(std::function<void()> done) {
  if (leaving_) {
    // This node's leave is still going out: the flush follows it.
    after_leave_.push_back(
        [this, done = std::move(done)]() mutable { when_flushed(std::move(done)); });
    return;
  }
  drop_link();
  if (job_keeper_) job_keeper_->stop();
  job_keeper_.reset();
  if (last_phase_ != JobPhase::Closed || last_messages_revision_ == 0 || inbox_key_.empty())
    return revoke_lease(std::move(done));
  // The job is over and every node heard so (every node's Closed was put in the same txn, so
  // each watch delivers it before the delete): its keys go now, unless the driver sent messages
  // to this node's key since (then it is not the job this node saw end).
  Compare same{
      inbox_key_, CompareTarget::ModRevision, CompareResult::Equal, last_messages_revision_, {}};
  client_->call(txn({same}, {DeleteOp{prefix_, prefix_end(prefix_), false}}, {}),
                [this, alive = alive_, done = std::move(done)](Reply) mutable {
                  if (!*alive) return;
                  revoke_lease(std::move(done));
                });
}

}  // namespace ddprun::etcd
