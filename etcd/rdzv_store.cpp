#include "etcd/rdzv_store.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "common/enum_names.h"
#include "rendezvous/admission.h"
#include "rendezvous/limits.h"
#include "rendezvous/protocol.h"

namespace ddprun::etcd {

using nlohmann::json;
using rdzv::JobState;
using std::chrono::milliseconds;

namespace {

/// Version of the `state` value's layout; a value of another version is refused by name.
/// 2: a node may be `kept_out` (an agent of format 1 driving would place it in a round).
constexpr int kStateFormat = 2;

/// --restart_window keeps at most --max_restarts times; this many is no job's.
constexpr std::size_t kMaxWindowRestarts = 1'000'000;

/// Ten years, in milliseconds: a stored time further than this from now is corrupt.
constexpr std::int64_t kMaxTimeSkewMs = 10LL * 365 * 24 * 3600 * 1000;

/// Reads fields of one JSON object, remembering the first problem with its path.
class Fields {
 public:
  Fields(const json& object, std::string path, std::optional<std::string>& error)
      : o_(object), path_(std::move(path)), error_(error) {
    if (!o_.is_object()) fail(path_ + " must be an object");
  }

  const json* get(const char* key, bool required = true) {
    if (!o_.is_object()) return nullptr;
    auto it = o_.find(key);
    if (it == o_.end() || it->is_null()) {
      if (required) fail(where(key) + " is missing");
      return nullptr;
    }
    return &*it;
  }
  std::int64_t integer(const char* key, std::int64_t lo, std::int64_t hi) {
    const json* v = get(key);
    if (!v) return lo;
    if (!v->is_number_integer()) return fail(where(key) + " must be an integer"), lo;
    const auto n = v->get<std::int64_t>();
    if (n < lo || n > hi)
      return fail(where(key) + " is " + std::to_string(n) + ", outside " + std::to_string(lo) +
                  ".." + std::to_string(hi)),
             lo;
    return n;
  }
  int int32(const char* key, int lo = 0) {
    return static_cast<int>(integer(key, lo, std::numeric_limits<int>::max()));
  }
  bool has(const char* key) const {
    return o_.is_object() && o_.contains(key) && !o_.at(key).is_null();
  }
  std::string text(const char* key, bool required = true) {
    const json* v = get(key, required);
    if (!v) return {};
    if (!v->is_string()) return fail(where(key) + " must be a string"), std::string();
    if (v->get_ref<const std::string&>().size() > rdzv::kMaxTextBytes)
      return fail(where(key) + " is longer than " + std::to_string(rdzv::kMaxTextBytes) + " bytes"),
             std::string();
    return v->get<std::string>();
  }
  bool boolean(const char* key) {
    const json* v = get(key, false);
    if (!v) return false;
    if (!v->is_boolean()) return fail(where(key) + " must be true or false"), false;
    return v->get<bool>();
  }
  std::optional<common::TimePoint> time(const char* key, const TimeAnchor& anchor, bool required) {
    const json* v = get(key, required);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) return fail(where(key) + " must be an integer"), std::nullopt;
    const auto ms = v->get<std::int64_t>();
    if (ms < anchor.wall_ms - kMaxTimeSkewMs || ms > anchor.wall_ms + kMaxTimeSkewMs)
      return fail(where(key) + " (" + std::to_string(ms) +
                  " ms since the epoch) is more than ten years from now"),
             std::nullopt;
    return anchor.to_steady(ms);
  }
  const json* container(const char* key, bool object, std::size_t max) {
    const json* v = get(key, false);
    if (!v) return nullptr;
    if (object ? !v->is_object() : !v->is_array())
      return fail(where(key) + (object ? " must be an object" : " must be an array")), nullptr;
    if (v->size() > max)
      return fail(where(key) + " holds " + std::to_string(v->size()) + " entries, more than " +
                  std::to_string(max)),
             nullptr;
    return v;
  }
  template <typename Enum, std::size_t N>
  Enum name(const char* key, const std::array<common::EnumName<Enum>, N>& table) {
    const std::string t = text(key);
    if (auto e = common::enum_from(t, table)) return *e;
    fail(where(key) + " has the unknown value \"" + t + "\"");
    return table[0].value;
  }
  void fail(std::string why) {
    if (!error_) error_ = std::move(why);
  }
  bool ok() const { return !error_; }
  std::string where(const std::string& key) const { return path_ + "." + key; }

 private:
  const json& o_;
  std::string path_;
  std::optional<std::string>& error_;
};

json job_to_json(const JobState& s, const TimeAnchor& a) {
  json nodes = json::object();
  json previous_ranks = json::object();
  for (const auto& [id, node] : s.nodes) {
    if (node.previous_rank >= 0) previous_ranks[id] = node.previous_rank;
    nodes[id] = {
        {"join", rdzv::to_json(rdzv::AgentMessage{rdzv::join_message(s, id, node.request)})},
        {"state", std::string(common::name_of(node.state, rdzv::kNodeStateNames))},
        {"group_rank", node.group_rank}};
  }
  json j = {{"run_id", s.run_id},
            {"settings", rdzv::settings_json(s.settings)},
            {"settings_from", s.settings_from},
            {"phase", std::string(common::name_of(s.phase, rdzv::kJobPhaseNames))},
            {"round", s.round},
            {"restart_count", s.restart_count},
            {"nodes", std::move(nodes)},
            {"previous_ranks", std::move(previous_ranks)},
            {"round_started_ms", a.to_wall(s.round_started)},
            {"waiting_dirty", s.waiting_dirty},
            {"dropped_ids", s.dropped_ids}};
  const auto time = [&](const char* key, const std::optional<common::TimePoint>& t) {
    if (t) j[key] = a.to_wall(*t);
  };
  time("last_call_ms", s.last_call);
  time("adopt_deadline_ms", s.adopt_deadline);
  time("closed_at_ms", s.closed_at);
  time("waiting_quiet_until_ms", s.waiting_quiet_until);
  if (s.closed) j["closed"] = rdzv::to_json(rdzv::ServerMessage{*s.closed});
  if (!s.window_restarts.empty()) {
    json times = json::array();
    for (const auto t : s.window_restarts) times.push_back(a.to_wall(t));
    j["window_restarts_ms"] = std::move(times);
  }
  if (!s.repeated_failure.empty()) {
    j["repeated_failure"] = s.repeated_failure;
    j["failure_repeats"] = s.failure_repeats;
  }
  if (s.pause_count > 0) j["pause_count"] = s.pause_count;
  if (!s.standing.empty()) {
    json standing = json::object();
    for (const auto& [identity, st] : s.standing) {
      json entry = {{"failures_in_a_row", st.failures_in_a_row},
                    {"quarantines", st.quarantines},
                    {"why", st.why}};
      if (st.until) entry["until_ms"] = a.to_wall(*st.until);
      if (st.relapse_armed) entry["relapse_armed"] = true;
      standing[identity] = std::move(entry);
    }
    j["standing"] = std::move(standing);
  }
  return j;
}

JobState job_from_json(const json& j, const TimeAnchor& a, common::TimePoint now,
                       std::optional<std::string>& error) {
  JobState s;
  Fields f(j, "job", error);
  s.run_id = f.text("run_id");
  s.settings_from = f.text("settings_from");
  if (const json* settings = f.get("settings")) {
    // Read as a join's settings are, and held to the same rules: a job cannot run with others.
    auto parsed = rdzv::parse_settings(*settings, "job.settings");
    if (!parsed) {
      f.fail(parsed.error().message);
    } else if (auto bad = rdzv::check_settings(
                   *parsed, s.settings_from.empty() ? "(unnamed)" : s.settings_from)) {
      f.fail("job.settings are no job's: " + bad->message);
    } else {
      s.settings = std::move(*parsed);
    }
  }
  s.phase = f.name("phase", rdzv::kJobPhaseNames);
  s.round = f.int32("round");
  s.restart_count = f.int32("restart_count");
  if (const json* nodes = f.container("nodes", true, kMaxNodesInState)) {
    for (const auto& [id, record] : nodes->items()) {
      if (!f.ok()) break;
      Fields n(record, "job.nodes[" + id + "]", error);
      rdzv::NodeRecord node;
      if (const json* join = n.get("join")) {
        auto parsed = rdzv::parse_agent_message(*join);
        if (!parsed) {
          n.fail(n.where("join") + ": " + parsed.error().message);
        } else if (const auto* request = std::get_if<rdzv::Join>(&*parsed)) {
          node.request = rdzv::node_join(*request);
        } else {
          n.fail(n.where("join") + " is not a join");
        }
      }
      node.state = n.name("state", rdzv::kNodeStateNames);
      node.group_rank = static_cast<int>(n.integer("group_rank", -1, kMaxNodesInState));
      node.last_seen = now;
      s.nodes.emplace(id, std::move(node));
    }
  }
  if (const json* ranks = f.container("previous_ranks", true, kMaxNodesInState)) {
    for (const auto& [id, rank] : ranks->items()) {
      if (!rank.is_number_integer() || rank.get<std::int64_t>() < 0 ||
          rank.get<std::int64_t>() >= static_cast<std::int64_t>(kMaxNodesInState)) {
        f.fail("job.previous_ranks[" + id + "] must be a group rank");
        break;
      }
      // Only a node of the job has one (the rank of a node gone is never read).
      if (auto node = s.nodes.find(id); node != s.nodes.end())
        node->second.previous_rank = rank.get<int>();
    }
  }
  rdzv::reindex(s);  // step() keeps the index from here on
  s.round_started = f.time("round_started_ms", a, true).value_or(now);
  s.last_call = f.time("last_call_ms", a, false);
  s.adopt_deadline = f.time("adopt_deadline_ms", a, false);
  s.closed_at = f.time("closed_at_ms", a, false);
  s.waiting_quiet_until = f.time("waiting_quiet_until_ms", a, false);
  s.waiting_dirty = f.boolean("waiting_dirty");
  if (const json* dropped = f.container("dropped_ids", false, rdzv::kMaxDroppedIds)) {
    for (const json& id : *dropped) {
      if (!id.is_string()) {
        f.fail("job.dropped_ids must hold strings");
        break;
      }
      s.dropped_ids.push_back(id.get<std::string>());
    }
  }
  if (const json* times = f.container("window_restarts_ms", false, kMaxWindowRestarts)) {
    for (const json& t : *times) {
      const auto at = Fields(json{{"t", t}}, "job.window_restarts_ms", error).time("t", a, true);
      if (!at) break;
      s.window_restarts.push_back(*at);
    }
  }
  s.repeated_failure = f.text("repeated_failure", false);
  if (f.has("failure_repeats")) s.failure_repeats = f.int32("failure_repeats");
  if (f.has("pause_count")) s.pause_count = f.int32("pause_count");
  if (const json* standing = f.container("standing", true, kMaxNodesInState)) {
    for (const auto& [identity, entry] : standing->items()) {
      if (!f.ok()) break;
      Fields n(entry, "job.standing[" + identity + "]", error);
      rdzv::NodeStanding st;
      st.failures_in_a_row = n.int32("failures_in_a_row");
      st.quarantines = n.int32("quarantines");
      st.why = n.text("why", false);
      st.until = n.time("until_ms", a, false);
      st.relapse_armed = n.has("relapse_armed") && n.boolean("relapse_armed");
      s.standing.emplace(identity, std::move(st));
    }
  }
  if (const json* closed = f.get("closed", false)) {
    auto parsed = rdzv::parse_server_message(*closed);
    if (!parsed)
      f.fail("job.closed: " + parsed.error().message);
    else if (const auto* c = std::get_if<rdzv::Closed>(&*parsed))
      s.closed = *c;
    else
      f.fail("job.closed is not a closed message");
  }
  return s;
}

/// The part of `key` after the job's `prefix` + `dir`, or nullopt.
std::optional<std::string> id_under(const std::string& key, const std::string& prefix,
                                    const char* dir) {
  const std::string head = prefix + dir;
  if (key.size() <= head.size() || key.compare(0, head.size(), head) != 0) return std::nullopt;
  return key.substr(head.size());
}

}  // namespace

std::string job_prefix(const std::string& run_id) { return "/ddprun/" + run_id + "/"; }
std::string state_key(const std::string& prefix) { return prefix + "state"; }
std::string node_key(const std::string& prefix, const std::string& node_id) {
  return nodes_dir(prefix) + node_id;
}
std::string nodes_dir(const std::string& prefix) { return prefix + "nodes/"; }
std::string reports_end(const std::string& prefix) { return prefix_end(prefix + "reports/"); }

std::string messages_key(const std::string& prefix, const std::string& node_id) {
  std::uint32_t hash = 2166136261u;  // FNV-1a, 32 bits: the same on every host and build
  for (unsigned char c : node_id) hash = (hash ^ c) * 16777619u;
  const unsigned bucket = hash % static_cast<unsigned>(kMessageKeys);
  const char digits[] = "0123456789";
  return prefix + "messages/" + digits[bucket / 10] + digits[bucket % 10];
}
std::string report_key(const std::string& prefix, const std::string& node_id) {
  return prefix + "reports/" + node_id;
}

std::int64_t TimeAnchor::to_wall(common::TimePoint t) const {
  return wall_ms + std::chrono::duration_cast<milliseconds>(t - steady).count();
}

common::TimePoint TimeAnchor::to_steady(std::int64_t wall) const {
  return steady + milliseconds(wall - wall_ms);
}

std::string encode_state(const StoredState& state, const TimeAnchor& anchor) {
  json applied = json::object();
  for (const auto& [id, a] : state.applied) applied[id] = {a.join, a.report};
  return json{{"format", kStateFormat},
              {"job", job_to_json(state.job, anchor)},
              {"applied", std::move(applied)}}
      .dump();
}

std::string encode_notices(rdzv::JobPhase phase, const std::vector<rdzv::Outgoing>& messages) {
  json list = json::array();
  for (const rdzv::Outgoing& out : messages)
    list.push_back({{"node", out.node_id}, {"message", rdzv::to_json(out.message)}});
  return json{{"format", kStateFormat},
              {"phase", std::string(common::name_of(phase, rdzv::kJobPhaseNames))},
              {"messages", std::move(list)}}
      .dump();
}

std::map<std::string, std::string> notices_by_key(const std::string& prefix, rdzv::JobPhase phase,
                                                  const std::vector<rdzv::Outgoing>& messages) {
  std::map<std::string, std::vector<rdzv::Outgoing>> grouped;
  for (const rdzv::Outgoing& out : messages)
    grouped[messages_key(prefix, out.node_id.str())].push_back(out);
  std::map<std::string, std::string> values;
  for (const auto& [key, list] : grouped) values[key] = encode_notices(phase, list);
  return values;
}

namespace {

common::Error malformed(const std::string& key, const std::string& why) {
  // The job's prefix "/ddprun/<run_id>/" of a key that may lie deeper (messages/NN).
  const std::size_t run_id_end = key.find('/', job_prefix("").size());
  const std::string prefix = run_id_end == std::string::npos ? key.substr(0, key.rfind('/') + 1)
                                                             : key.substr(0, run_id_end + 1);
  return common::Error{"the rendezvous state in etcd at " + key + " is malformed: " + why +
                       "; delete the job's keys (etcdctl del --prefix " + prefix +
                       ") or pick another --rdzv_id"};
}

/// The value as JSON with its format checked, or the error naming the key.
common::Result<json> parse_state(const std::string& value, const std::string& key) {
  if (value.size() > kMaxStateBytes)
    return malformed(
        key, std::to_string(value.size()) + " bytes, more than " + std::to_string(kMaxStateBytes));
  json j = json::parse(value, nullptr, false);
  if (j.is_discarded()) return malformed(key, "not JSON");
  std::optional<std::string> error;
  Fields f(j, "state", error);
  const auto format = f.integer("format", 0, 1'000'000);
  if (error) return malformed(key, *error);
  if (format != kStateFormat)
    return malformed(key, "format " + std::to_string(format) + ", this ddprun reads format " +
                              std::to_string(kStateFormat) +
                              " (every node must run the same ddprun)");
  return j;
}

}  // namespace

common::Result<Notices> decode_notices(const std::string& value, const std::string& key,
                                       const std::string& node_id) {
  auto parsed = parse_state(value, key);
  if (!parsed) return parsed.error();
  const json& j = *parsed;
  std::optional<std::string> error;
  Notices out;
  Fields f(j, "state", error);
  out.phase = f.name("phase", rdzv::kJobPhaseNames);
  if (const json* messages = f.container("messages", false, kMaxMessagesInState)) {
    for (const json& m : *messages) {
      Fields mf(m, "messages[]", error);
      if (mf.text("node") != node_id) continue;
      if (const json* body = mf.get("message")) {
        auto message = rdzv::parse_server_message(*body);
        if (!message)
          mf.fail("messages[]: " + message.error().message);
        else
          out.messages.push_back(*std::move(message));
      }
      if (!mf.ok()) break;
    }
  }
  if (error) return malformed(key, *error);
  return out;
}

common::Result<StoredState> decode_state(const std::string& value, const std::string& key,
                                         const TimeAnchor& anchor, common::TimePoint now) {
  auto parsed = parse_state(value, key);
  if (!parsed) return parsed.error();
  const json& j = *parsed;
  std::optional<std::string> error;
  StoredState out;
  Fields f(j, "state", error);
  if (const json* job = f.get("job")) out.job = job_from_json(*job, anchor, now, error);
  if (const json* applied = f.container("applied", true, 2 * kMaxNodesInState)) {
    for (const auto& [id, pair] : applied->items()) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() ||
          !pair[1].is_number_integer()) {
        f.fail("state.applied[" + id + "] must be [join revision, report revision]");
        break;
      }
      out.applied[id] = Applied{pair[0].get<std::int64_t>(), pair[1].get<std::int64_t>()};
    }
  }
  if (error) return malformed(key, *error);
  return out;
}

void apply_event(View& view, const Event& event) {
  const std::string& key = event.kv.key;
  const bool put = event.type == Event::Type::Put;
  if (key == state_key(view.prefix)) {
    // A driver keeps what it wrote ahead of the watch; an older put arriving later is no news.
    if (put && view.state && event.kv.mod_revision < view.state->mod_revision) return;
    if (put)
      view.state = event.kv;
    else
      view.state.reset();
    return;
  }
  for (auto [dir, map] : {std::pair{"nodes/", &view.nodes}, std::pair{"reports/", &view.reports}}) {
    if (auto id = id_under(key, view.prefix, dir)) {
      if (put)
        (*map)[*id] = event.kv;
      else
        map->erase(*id);
      return;
    }
  }
}

void load_range(View& view, const std::vector<KeyValue>& kvs) {
  view.state.reset();
  view.nodes.clear();
  view.reports.clear();
  for (const KeyValue& kv : kvs) apply_event(view, Event{Event::Type::Put, kv, std::nullopt});
}

std::optional<std::string> driver_of(const View& view) {
  std::optional<std::string> best;
  std::int64_t lowest = 0;
  for (const auto& [id, kv] : view.nodes) {
    if (!best || kv.create_revision < lowest) {
      best = id;
      lowest = kv.create_revision;
    }
  }
  return best;
}

std::string encode_message(const rdzv::AgentMessage& message) {
  return rdzv::to_json(message).dump();
}

namespace {

/// The refusal of a join that would take the job past kMaxNodesOnEtcd.
rdzv::Refused too_many_nodes(const rdzv::JobState& job, const rdzv::AgentMessage& message) {
  const auto& join = std::get<rdzv::Join>(message);
  return rdzv::Refused{
      rdzv::RefusalKind::Mismatch,
      "node " + join.name + " cannot join job '" + job.run_id + "': it holds " +
          std::to_string(job.nodes.size()) +
          " nodes, the most one job's state can hold in etcd v3 (about " +
          std::to_string(kMaxStateBytes) +
          " bytes, under etcd's 1.5 MiB request limit); run jobs this large on ddprun-rdzvd "
          "(--rdzv_backend c10d --rdzv_endpoint HOST:PORT)"};
}

/// The Leave in reports/<id> when the driver has not applied that put yet.
std::optional<rdzv::Leave> unapplied_leave(const View& view,
                                           const std::map<std::string, Applied>& applied,
                                           const std::string& id) {
  auto report = view.reports.find(id);
  if (report == view.reports.end()) return std::nullopt;
  auto seen = applied.find(id);
  if (seen != applied.end() && seen->second.report == report->second.mod_revision)
    return std::nullopt;
  json body = json::parse(report->second.value, nullptr, false);
  if (body.is_discarded()) return std::nullopt;
  auto message = rdzv::parse_agent_message(body);
  if (!message) return std::nullopt;
  if (const auto* leave = std::get_if<rdzv::Leave>(&*message)) return *leave;
  return std::nullopt;
}

}  // namespace

DriveResult drive(StoredState current, const View& view, common::TimePoint now) {
  DriveResult r;
  const json job_before = job_to_json(current.job, TimeAnchor{});
  const auto applied_before = current.applied;
  StoredState& s = r.next;
  s.job = std::move(current.job);
  s.applied = std::move(current.applied);

  const auto run = [&](const rdzv::Event& event) {
    // Liveness is the lease's: every node whose key exists is alive now.
    rdzv::mark_all_seen(s.job, now);
    rdzv::StepResult step = rdzv::step(std::move(s.job), event, now);
    s.job = std::move(step.state);
    for (auto& out : step.messages) s.messages.push_back(std::move(out));
    r.wake_at = step.wake_at;
    if (step.erase) {
      if (s.job.phase == rdzv::JobPhase::Closed) r.erase = true;
      // [none] -> [forgotten]: a refused first join leaves no job, as on the server.
      s.job = rdzv::new_job(s.job.run_id, now);
    }
  };

  // Closed -> [erased] before a join: a job whose tombstone expired while no agent ran (every
  // node exited before close_timeout) is forgotten, so a new job under the same run id starts
  // afresh instead of being refused as closed. Without a join, the Tick below erases it.
  const bool newcomer = std::any_of(view.nodes.begin(), view.nodes.end(), [&](const auto& node) {
    auto it = s.applied.find(node.first);
    return it == s.applied.end() || it->second.join != node.second.mod_revision;
  });
  if (newcomer && s.job.phase == rdzv::JobPhase::Closed && s.job.closed_at &&
      now >= *s.job.closed_at + s.job.settings.close_timeout) {
    s.job = rdzv::new_job(s.job.run_id, now);
    s.applied.clear();
  }

  // Nodes whose key is gone: their lease expired or was revoked.
  std::vector<std::string> gone;
  for (const auto& [id, a] : s.applied)
    if (!view.nodes.count(id)) gone.push_back(id);
  for (const auto& [node_id, node] : s.job.nodes) {
    std::string id = node_id.str();  // etcd's view and the applied puts are keyed by string
    if (!view.nodes.count(id) && !s.applied.count(id)) gone.push_back(std::move(id));
  }
  for (const std::string& id : gone) {
    // A node that left put its Leave in the txn that deleted its key: it left, and was not lost.
    std::optional<rdzv::Leave> leave = unapplied_leave(view, s.applied, id);
    s.applied.erase(id);
    if (leave) {
      rdzv::FromNode from;
      from.node_id = id;
      from.message = *std::move(leave);
      run(from);
    }
    run(rdzv::Disconnected{id});
  }

  // Puts not yet applied, in the order etcd made them.
  struct Pending {
    std::int64_t revision;
    std::string id;
    bool is_join;
    const KeyValue* kv;
  };
  std::vector<Pending> pending;
  for (const auto& [id, kv] : view.nodes) {
    auto it = s.applied.find(id);
    if (it == s.applied.end() || it->second.join != kv.mod_revision)
      pending.push_back({kv.mod_revision, id, true, &kv});
  }
  for (const auto& [id, kv] : view.reports) {
    if (!view.nodes.count(id)) continue;  // its node is gone; the delete follows
    auto it = s.applied.find(id);
    if (it == s.applied.end() || it->second.report != kv.mod_revision)
      pending.push_back({kv.mod_revision, id, false, &kv});
  }
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return std::tie(a.revision, a.is_join) < std::tie(b.revision, b.is_join);
  });
  for (const Pending& p : pending) {
    Applied& applied = s.applied[p.id];
    (p.is_join ? applied.join : applied.report) = p.kv->mod_revision;
    const std::string where = p.kv->key;
    json body = json::parse(p.kv->value, nullptr, false);
    std::string problem;
    std::optional<rdzv::AgentMessage> message;
    if (body.is_discarded()) {
      problem = "not JSON";
    } else {
      auto parsed = rdzv::parse_agent_message(body);
      if (!parsed)
        problem = parsed.error().message;
      else
        message = *std::move(parsed);
    }
    if (message) {
      const auto* join = std::get_if<rdzv::Join>(&*message);
      if (p.is_join && (!join || join->node_id != p.id || join->run_id != s.job.run_id))
        problem = "not a join of node " + p.id + " for job " + s.job.run_id;
      if (!p.is_join && !std::holds_alternative<rdzv::WorkersFailed>(*message) &&
          !std::holds_alternative<rdzv::WorkersSucceeded>(*message) &&
          !std::holds_alternative<rdzv::Leave>(*message))
        problem = "not a report (workers_failed, workers_succeeded or leave)";
    }
    if (!problem.empty()) {
      s.messages.push_back(rdzv::Outgoing{
          rdzv::NodeId(p.id),
          rdzv::Refused{rdzv::RefusalKind::Protocol, "the rendezvous cannot read " + where +
                                                         " in etcd: " + problem +
                                                         " (every node must run the same ddprun)"},
          true});
      continue;
    }
    if (p.is_join && !s.job.nodes.count(p.id) && s.job.nodes.size() >= kMaxNodesOnEtcd) {
      s.messages.push_back(
          rdzv::Outgoing{rdzv::NodeId(p.id), too_many_nodes(s.job, *message), true});
      continue;
    }
    // Built field by field: GCC 12 takes the moved-from variant in a braced FromNode for one
    // that may be uninitialized (-Wmaybe-uninitialized).
    rdzv::FromNode from;
    from.node_id = p.id;
    from.message = *message;
    run(from);
  }
  run(rdzv::Tick{});

  // The anchor does not matter for the comparison, only that both sides use the same one.
  r.changed = !s.messages.empty() || s.applied != applied_before ||
              job_to_json(s.job, TimeAnchor{}) != job_before;
  return r;
}

}  // namespace ddprun::etcd
