#include "rendezvous/protocol.h"

#include <algorithm>

#include "rendezvous/framing.h"

namespace ddprun::rdzv {

using nlohmann::json;

json settings_json(const RdzvSettings& s) {
  return {{"min_nodes", s.min_nodes},
          {"max_nodes", s.max_nodes},
          {"nproc_per_node", s.nproc_per_node},
          {"max_restarts", s.max_restarts},
          {"join_timeout_ms", s.join_timeout.count()},
          {"last_call_timeout_ms", s.last_call_timeout.count()},
          {"close_timeout_ms", s.close_timeout.count()},
          {"keep_alive_interval_ms", s.keep_alive_interval.count()},
          {"keep_alive_max_attempt", s.keep_alive_max_attempt},
          {"restart_window_ms", s.restart_window.count()},
          {"crash_loop_limit", s.crash_loop_limit},
          {"fatal_exit_codes", s.fatal_exit_codes},
          {"quarantine_after", s.quarantine_after},
          {"quarantine_cooldown_ms", s.quarantine_cooldown.count()},
          {"quarantine_cooldown_max_ms", s.quarantine_cooldown_max.count()},
          {"restart_backoff_ms", s.restart_backoff.count()},
          {"restart_backoff_max_ms", s.restart_backoff_max.count()}};
}

namespace {

// ---- reading fields without exceptions ------------------------------------------------------

/// Reads typed fields out of one message body, remembering the first problem.
class Reader {
 public:
  Reader(const json& body, std::string type) : body_(body), type_(std::move(type)) {}

  const std::optional<std::string>& error() const { return error_; }

  /// A string of at most `max_bytes` (identifiers: kMaxIdentifierBytes).
  std::string str(const char* key, std::size_t max_bytes = kMaxTextBytes) {
    auto v = field(key);
    if (!v) return {};
    if (!v->is_string()) return fail(key, "a string"), std::string();
    const auto& text = v->get_ref<const std::string&>();
    if (text.size() > max_bytes) {
      fail_value(key, "is " + std::to_string(text.size()) + " bytes long, over the limit of " +
                          std::to_string(max_bytes));
      return {};
    }
    return text;
  }
  /// An identifier (run id, node id, name, address): short, and free of control characters so
  /// that logs and status tables show it as it is.
  std::string id(const char* key) {
    std::string text = str(key, kMaxIdentifierBytes);
    for (const char c : text) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        fail_value(key, "must not contain control characters");
        return {};
      }
    }
    return text;
  }
  int integer(const char* key) {
    auto v = field(key);
    if (!v) return 0;
    if (!v->is_number_integer()) return fail(key, "an integer"), 0;
    const auto n = v->get<std::int64_t>();
    if (n < INT32_MIN || n > INT32_MAX) return fail(key, "a 32-bit integer"), 0;
    return static_cast<int>(n);
  }
  bool boolean(const char* key) {
    auto v = field(key);
    if (!v) return false;
    if (!v->is_boolean()) return fail(key, "true or false"), false;
    return v->get<bool>();
  }
  Millis millis(const char* key) { return Millis(integer(key)); }
  std::vector<std::string> strings(const char* key) {
    std::vector<std::string> out;
    auto v = field(key);
    if (!v) return out;
    if (!v->is_array()) return fail(key, "an array of strings"), out;
    for (const auto& item : *v) {
      if (!item.is_string()) return fail(key, "an array of strings"), out;
      if (item.get_ref<const std::string&>().size() > kMaxTextBytes)
        return fail(key, "an array of strings of at most 4096 bytes"), out;
      out.push_back(item.get<std::string>());
    }
    return out;
  }
  std::vector<int> integers(const char* key) {
    std::vector<int> out;
    auto v = field(key);
    if (!v) return out;
    if (!v->is_array()) return fail(key, "an array of integers"), out;
    for (const auto& item : *v) {
      if (!item.is_number_integer()) return fail(key, "an array of integers"), out;
      const auto n = item.get<std::int64_t>();
      if (n < INT32_MIN || n > INT32_MAX) return fail(key, "an array of 32-bit integers"), out;
      out.push_back(static_cast<int>(n));
    }
    return out;
  }
  bool has(const char* key) const { return body_.contains(key) && !body_.at(key).is_null(); }
  /// A nested object, read with its own Reader (errors are carried back by `adopt`).
  std::optional<Reader> object(const char* key) {
    auto v = field(key);
    if (!v) return std::nullopt;
    if (!v->is_object()) return fail(key, "an object"), std::nullopt;
    return Reader(*v, type_ + "." + key);
  }
  void adopt(const Reader& inner) {
    if (!error_ && inner.error_) error_ = inner.error_;
  }
  void fail_value(const char* key, const std::string& why) {
    if (!error_) error_ = type_ + " field \"" + key + "\" " + why;
  }

 private:
  const json* field(const char* key) {
    auto it = body_.find(key);
    if (it == body_.end()) {
      if (!error_) error_ = type_ + " has no \"" + key + "\" field";
      return nullptr;
    }
    return &*it;
  }
  void fail(const char* key, const char* expected) {
    if (!error_) error_ = type_ + " field \"" + key + "\" must be " + expected;
  }

  const json& body_;
  std::string type_;
  std::optional<std::string> error_;
};

RdzvSettings read_settings(Reader& r) {
  RdzvSettings s;
  s.min_nodes = r.integer("min_nodes");
  s.max_nodes = r.integer("max_nodes");
  s.nproc_per_node = r.integer("nproc_per_node");
  s.max_restarts = r.integer("max_restarts");
  s.join_timeout = r.millis("join_timeout_ms");
  s.last_call_timeout = r.millis("last_call_timeout_ms");
  s.close_timeout = r.millis("close_timeout_ms");
  s.keep_alive_interval = r.millis("keep_alive_interval_ms");
  s.keep_alive_max_attempt = r.integer("keep_alive_max_attempt");
  // The failure policy's settings came later: a peer that sends none has the defaults (the
  // rendezvous enforces them; such a peer's failures say nothing of progress, so they are
  // never a crash loop).
  if (r.has("restart_window_ms")) s.restart_window = r.millis("restart_window_ms");
  if (r.has("crash_loop_limit")) s.crash_loop_limit = r.integer("crash_loop_limit");
  if (r.has("fatal_exit_codes")) {
    s.fatal_exit_codes = r.integers("fatal_exit_codes");
    // Sorted and unique, as the rendezvous looks codes up: a peer's list may be neither.
    std::sort(s.fatal_exit_codes.begin(), s.fatal_exit_codes.end());
    s.fatal_exit_codes.erase(std::unique(s.fatal_exit_codes.begin(), s.fatal_exit_codes.end()),
                             s.fatal_exit_codes.end());
  }
  // Quarantine came later still: a peer without it runs with the flag's defaults.
  s.quarantine_after =
      r.has("quarantine_after") ? r.integer("quarantine_after") : kDefaultQuarantineAfter;
  if (r.has("quarantine_cooldown_ms")) s.quarantine_cooldown = r.millis("quarantine_cooldown_ms");
  if (r.has("quarantine_cooldown_max_ms"))
    s.quarantine_cooldown_max = r.millis("quarantine_cooldown_max_ms");
  // The back-off came last: a peer without it pauses as the flag's defaults say.
  if (r.has("restart_backoff_ms")) s.restart_backoff = r.millis("restart_backoff_ms");
  if (r.has("restart_backoff_max_ms")) s.restart_backoff_max = r.millis("restart_backoff_max_ms");
  // Only the types: which settings a job may run with is admission's (admission.h).
  return s;
}

json claim_json(const RoundClaim& c) {
  return {{"round", c.round},
          {"group_rank", c.group_rank},
          {"group_world_size", c.group_world_size},
          {"restart_count", c.restart_count},
          {"master_addr", c.master_addr},
          {"master_port", c.master_port},
          {"succeeded", c.succeeded}};
}

RoundClaim read_claim(Reader& r) {
  RoundClaim c;
  c.round = r.integer("round");
  c.group_rank = r.integer("group_rank");
  c.group_world_size = r.integer("group_world_size");
  c.restart_count = r.integer("restart_count");
  c.master_addr = r.id("master_addr");
  c.master_port = r.integer("master_port");
  c.succeeded = r.boolean("succeeded");
  // Whether the claimed round is possible is admission's (admission.h): only types here.
  return c;
}

using common::enum_from;
using common::name_of;

// ---- to_json --------------------------------------------------------------------------------

struct AgentToJson {
  json operator()(const Join& m) const {
    json j = {{"type", "join"},
              {"run_id", m.run_id},
              {"node_id", m.node_id},
              {"name", m.name},
              {"addr", m.addr},
              {"master_port", m.master_port},
              {"node_rank", m.node_rank ? json(*m.node_rank) : json(nullptr)},
              {"settings", settings_json(m.settings)},
              {"restart_count", m.restart_count}};
    j["resume"] = m.resume ? claim_json(*m.resume) : json(nullptr);
    // Only when set: a server that predates it never sees the field (it would place the node).
    if (!m.kept_out.empty()) j["kept_out"] = m.kept_out;
    return j;
  }
  json operator()(const Heartbeat&) const { return {{"type", "heartbeat"}}; }
  json operator()(const WorkersFailed& m) const {
    return {{"type", "workers_failed"}, {"round", m.round},       {"description", m.description},
            {"exit_code", m.exit_code}, {"signal", m.signal},     {"rank", m.rank},
            {"exception", m.exception}, {"progress", m.progress}, {"culprit", m.culprit}};
  }
  json operator()(const WorkersSucceeded& m) const {
    return {{"type", "workers_succeeded"}, {"round", m.round}};
  }
  json operator()(const Leave& m) const { return {{"type", "leave"}, {"reason", m.reason}}; }
  json operator()(const StatusQuery& m) const {
    json j = {{"type", "status"}, {"run_id", m.run_id ? json(*m.run_id) : json(nullptr)}};
    if (m.after) j["after"] = *m.after;
    return j;
  }
};

struct ServerToJson {
  json operator()(const Waiting& m) const {
    return {{"type", "waiting"},
            {"round", m.round},
            {"joined", m.joined.get()},
            {"joined_count", m.joined_count},
            {"min_nodes", m.min_nodes},
            {"max_nodes", m.max_nodes},
            {"missing_node_ranks", m.missing_node_ranks.get()},
            {"waited_ms", m.waited.count()},
            {"join_timeout_ms", m.join_timeout.count()},
            {"wait_listed", m.wait_listed},
            {"quarantined", m.quarantined},
            {"quarantine_left_ms", m.quarantine_left.count()},
            {"job_running", m.job_running}};
  }
  json operator()(const RoundReady& m) const {
    return {{"type", "round"},
            {"round", m.round},
            {"group_rank", m.group_rank},
            {"group_world_size", m.group_world_size},
            {"master_addr", m.master_addr},
            {"master_port", m.master_port},
            {"restart_count", m.restart_count},
            {"participants", m.participants.get()}};
  }
  json operator()(const Restart& m) const {
    json j = {{"type", "restart"},
              {"next_round", m.next_round},
              {"reason", m.reason.get()},
              {"counted", m.counted},
              {"restart_count", m.restart_count},
              {"quarantine_ms", m.quarantine.count()},
              {"repeat", m.repeat},
              {"window_restarts", m.window_restarts},
              {"window_ms", m.window.count()}};
    if (m.failures_in_a_row) {
      j["failures_in_a_row"] = *m.failures_in_a_row;
      j["pause_ms"] = m.pause.count();
    }
    return j;
  }
  json operator()(const Closed& m) const {
    return {{"type", "closed"},     {"outcome", std::string(name_of(m.outcome, kJobOutcomeNames))},
            {"message", m.message}, {"exit_code", m.exit_code},
            {"signal", m.signal},   {"do_not_requeue", m.do_not_requeue}};
  }
  json operator()(const Refused& m) const {
    return {{"type", "refused"},
            {"kind", std::string(name_of(m.kind, kRefusalNames))},
            {"message", m.message}};
  }
  json operator()(const StatusReply& m) const {
    json j = {{"type", "status_reply"}, {"jobs", m.jobs}};
    if (m.next) j["next"] = *m.next;
    return j;
  }
};

/// The message's type; the error says why there is none.
common::Result<std::string> type_of(const json& body) {
  if (!body.is_object()) return common::Error{"message is not a JSON object"};
  auto it = body.find("type");
  if (it == body.end() || !it->is_string()) return common::Error{"message has no string \"type\""};
  return it->get<std::string>();
}

common::Result<AgentMessage> read_agent(const std::string& type, Reader& r) {
  if (type == "join") {
    Join m;
    m.run_id = r.id("run_id");
    m.node_id = r.id("node_id");
    m.name = r.id("name");
    m.addr = r.id("addr");
    m.master_port = r.integer("master_port");
    if (r.has("node_rank")) m.node_rank = r.integer("node_rank");
    m.restart_count = r.integer("restart_count");
    if (auto s = r.object("settings")) {
      m.settings = read_settings(*s);
      r.adopt(*s);
    }
    if (r.has("resume")) {
      if (auto c = r.object("resume")) {
        m.resume = read_claim(*c);
        r.adopt(*c);
      }
    }
    if (r.has("kept_out")) m.kept_out = r.str("kept_out");
    if (!r.error() && (m.run_id.empty() || m.node_id.empty()))
      r.fail_value("run_id", "and node_id must not be empty");
    if (!r.error() && (m.master_port < 0 || m.master_port > 65535))
      r.fail_value("master_port", "must lie in 0..65535");
    // node_rank, restart_count, settings and resume are read as types only: whether the job
    // can take them is admission's (admission.h), which words the refusal for the user.
    if (r.error()) return common::Error{*r.error()};
    return AgentMessage{std::move(m)};
  }
  if (type == "heartbeat") return AgentMessage{Heartbeat{}};
  if (type == "workers_failed") {
    WorkersFailed m;
    m.round = r.integer("round");
    m.description = r.str("description");
    m.exit_code = r.integer("exit_code");
    m.signal = r.integer("signal");
    // Read when present: an older agent sends none (then its failures are never a crash loop).
    if (r.has("rank")) m.rank = r.integer("rank");
    if (r.has("exception")) m.exception = r.str("exception", kMaxIdentifierBytes);
    m.progress = r.has("progress") ? r.boolean("progress") : true;
    m.culprit = r.has("culprit") ? r.boolean("culprit") : true;
    if (r.error()) return common::Error{*r.error()};
    return AgentMessage{std::move(m)};
  }
  if (type == "workers_succeeded") {
    WorkersSucceeded m;
    m.round = r.integer("round");
    if (r.error()) return common::Error{*r.error()};
    return AgentMessage{std::move(m)};
  }
  if (type == "leave") {
    Leave m;
    m.reason = r.str("reason");
    if (r.error()) return common::Error{*r.error()};
    return AgentMessage{std::move(m)};
  }
  if (type == "status") {
    StatusQuery m;
    if (r.has("run_id")) m.run_id = r.id("run_id");
    if (r.has("after")) m.after = r.id("after");
    if (r.error()) return common::Error{*r.error()};
    return AgentMessage{std::move(m)};
  }
  return common::Error{"unknown message type " + quote_peer_value(type)};
}

common::Result<ServerMessage> read_server(const std::string& type, Reader& r, const json& body) {
  if (type == "waiting") {
    Waiting m;
    m.round = r.integer("round");
    m.joined = r.strings("joined");
    m.joined_count = r.integer("joined_count");
    m.min_nodes = r.integer("min_nodes");
    m.max_nodes = r.integer("max_nodes");
    m.missing_node_ranks = r.integers("missing_node_ranks");
    m.waited = r.millis("waited_ms");
    m.join_timeout = r.millis("join_timeout_ms");
    m.wait_listed = r.boolean("wait_listed");
    if (r.has("quarantined")) m.quarantined = r.str("quarantined", kMaxFrameBytes);
    if (r.has("quarantine_left_ms")) m.quarantine_left = r.millis("quarantine_left_ms");
    // An older server says a round runs only by a wait-listed node's join_timeout of 0, which
    // --rdzv_conf join_timeout=0 gives a forming round too.
    m.job_running = r.has("job_running") ? r.boolean("job_running")
                                         : m.wait_listed && m.join_timeout.count() == 0;
    if (r.error()) return common::Error{*r.error()};
    return ServerMessage{std::move(m)};
  }
  if (type == "round") {
    RoundReady m;
    m.round = r.integer("round");
    m.group_rank = r.integer("group_rank");
    m.group_world_size = r.integer("group_world_size");
    m.master_addr = r.id("master_addr");
    m.master_port = r.integer("master_port");
    m.restart_count = r.integer("restart_count");
    m.participants = r.strings("participants");
    if (!r.error() &&
        (m.group_world_size < 1 || m.group_rank < 0 || m.group_rank >= m.group_world_size))
      r.fail_value("group_rank", "must lie in 0..group_world_size-1");
    if (!r.error() && (m.master_port < 1 || m.master_port > 65535))
      r.fail_value("master_port", "must lie in 1..65535");
    if (r.error()) return common::Error{*r.error()};
    return ServerMessage{std::move(m)};
  }
  if (type == "restart") {
    Restart m;
    m.next_round = r.integer("next_round");
    m.reason = r.str("reason", kMaxFrameBytes);
    m.counted = r.boolean("counted");
    m.restart_count = r.integer("restart_count");
    if (r.has("quarantine_ms")) m.quarantine = r.millis("quarantine_ms");
    if (r.has("repeat")) m.repeat = r.boolean("repeat");
    if (r.has("window_ms")) {
      m.window = r.millis("window_ms");
      m.window_restarts = r.integer("window_restarts");
    }
    if (r.has("failures_in_a_row")) {
      m.failures_in_a_row = r.integer("failures_in_a_row");
      m.pause = r.millis("pause_ms");
      if (!r.error() && *m.failures_in_a_row < 0)
        r.fail_value("failures_in_a_row", "must be 0 or more");
      if (!r.error() && (m.pause < Millis{0} || m.pause > kMaxRestartBackoff))
        r.fail_value("pause_ms", "must lie in 0..86400000");
    }
    if (r.error()) return common::Error{*r.error()};
    return ServerMessage{std::move(m)};
  }
  if (type == "closed") {
    Closed m;
    const std::string outcome = r.str("outcome");
    m.message = r.str("message", kMaxFrameBytes);
    m.exit_code = r.integer("exit_code");
    m.signal = r.integer("signal");
    if (r.has("do_not_requeue")) m.do_not_requeue = r.boolean("do_not_requeue");
    if (r.error()) return common::Error{*r.error()};
    auto kind = enum_from(outcome, kJobOutcomeNames);
    if (!kind)
      return common::Error{"closed field \"outcome\" has an unknown value " +
                           quote_peer_value(outcome)};
    m.outcome = *kind;
    return ServerMessage{std::move(m)};
  }
  if (type == "refused") {
    Refused m;
    const std::string kind = r.str("kind");
    m.message = r.str("message", kMaxFrameBytes);
    if (r.error()) return common::Error{*r.error()};
    auto k = enum_from(kind, kRefusalNames);
    if (!k)
      return common::Error{"refused field \"kind\" has an unknown value " + quote_peer_value(kind)};
    m.kind = *k;
    return ServerMessage{std::move(m)};
  }
  if (type == "status_reply") {
    if (!body.contains("jobs") || !body.at("jobs").is_array())
      return common::Error{"status_reply field \"jobs\" must be an array"};
    StatusReply m{body.at("jobs"), std::nullopt};
    if (r.has("next")) m.next = r.id("next");
    if (r.error()) return common::Error{*r.error()};
    return ServerMessage{std::move(m)};
  }
  return common::Error{"unknown message type " + quote_peer_value(type)};
}

}  // namespace

json to_json(const AgentMessage& message) { return std::visit(AgentToJson{}, message); }
json to_json(const ServerMessage& message) { return std::visit(ServerToJson{}, message); }

common::Result<AgentMessage> parse_agent_message(const json& body) {
  auto type = type_of(body);
  if (!type) return type.error();
  Reader r(body, *type);
  return read_agent(*type, r);
}

common::Result<RdzvSettings> parse_settings(const json& body, const std::string& what) {
  if (!body.is_object()) return common::Error{what + " must be an object"};
  Reader r(body, what);
  RdzvSettings settings = read_settings(r);
  if (r.error()) return common::Error{*r.error()};
  return settings;
}

common::Result<ServerMessage> parse_server_message(const json& body) {
  auto type = type_of(body);
  if (!type) return type.error();
  Reader r(body, *type);
  return read_server(*type, r, body);
}

json make_hello(const std::string& role) {
  return {{"type", "hello"}, {"protocol", kProtocolVersion}, {"role", role}};
}

}  // namespace ddprun::rdzv
