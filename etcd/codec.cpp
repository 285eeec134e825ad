#include "etcd/codec.h"

#include <openssl/evp.h>

#include <charconv>
#include <limits>

namespace ddprun::etcd {

using common::Error;
using common::Result;
using nlohmann::json;

std::string base64_encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');  // EVP_EncodeBlock adds a NUL
  const int n = ::EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(bytes.data()),
                                  static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

Result<std::string> base64_decode(const std::string& text, const std::string& field) {
  if (text.size() % 4 != 0)
    return Error{field + ": not base64 (" + std::to_string(text.size()) +
                 " characters, not a multiple of 4)"};
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool alphabet = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                          (c >= '0' && c <= '9') || c == '+' || c == '/';
    // '=' only as padding: the last one or two characters.
    const bool padding =
        c == '=' && i + 2 >= text.size() && (i + 1 == text.size() || text[i + 1] == '=');
    if (!alphabet && !padding)
      return Error{field + ": not base64 (character " + std::to_string(i) + ")"};
  }
  // EVP_DecodeBlock does not strip padding: it returns whole groups of three bytes.
  std::string out(3 * (text.size() / 4), '\0');
  const int n = ::EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(text.data()),
                                  static_cast<int>(text.size()));
  if (n < 0) return Error{field + ": not base64"};
  std::size_t pad = 0;
  if (!text.empty() && text.back() == '=') pad = text[text.size() - 2] == '=' ? 2 : 1;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

/// Integers go out as strings, as the gateway writes them (it reads both).
std::string int_text(std::int64_t v) { return std::to_string(v); }

const char* target_name(CompareTarget t) {
  switch (t) {
    case CompareTarget::Version:
      return "VERSION";
    case CompareTarget::CreateRevision:
      return "CREATE";
    case CompareTarget::ModRevision:
      return "MOD";
    case CompareTarget::Value:
      return "VALUE";
    case CompareTarget::Lease:
      return "LEASE";
  }
  return "MOD";
}

const char* result_name(CompareResult r) {
  switch (r) {
    case CompareResult::Equal:
      return "EQUAL";
    case CompareResult::Greater:
      return "GREATER";
    case CompareResult::Less:
      return "LESS";
    case CompareResult::NotEqual:
      return "NOT_EQUAL";
  }
  return "EQUAL";
}

json range_json(const RangeOp& op) {
  json j = {{"key", base64_encode(op.key)}};
  if (!op.range_end.empty()) j["range_end"] = base64_encode(op.range_end);
  if (op.limit != 0) j["limit"] = int_text(op.limit);
  if (op.revision != 0) j["revision"] = int_text(op.revision);
  if (op.count_only) j["count_only"] = true;
  if (op.keys_only) j["keys_only"] = true;
  if (op.sort != RangeSort::ByKey) {
    j["sort_target"] = "CREATE";
    j["sort_order"] = op.sort == RangeSort::OldestCreatedFirst ? "ASCEND" : "DESCEND";
  }
  if (op.max_create_revision != 0) j["max_create_revision"] = int_text(op.max_create_revision);
  return j;
}

json put_json(const PutOp& op) {
  json j = {{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
  if (op.lease != 0) j["lease"] = int_text(op.lease);
  if (op.prev_kv) j["prev_kv"] = true;
  return j;
}

json delete_json(const DeleteOp& op) {
  json j = {{"key", base64_encode(op.key)}};
  if (!op.range_end.empty()) j["range_end"] = base64_encode(op.range_end);
  if (op.prev_kv) j["prev_kv"] = true;
  return j;
}

json op_json(const Op& op) {
  if (const auto* r = std::get_if<RangeOp>(&op)) return {{"request_range", range_json(*r)}};
  if (const auto* p = std::get_if<PutOp>(&op)) return {{"request_put", put_json(*p)}};
  return {{"request_delete_range", delete_json(std::get<DeleteOp>(op))}};
}

json compare_json(const Compare& c) {
  json j = {{"key", base64_encode(c.key)},
            {"target", target_name(c.target)},
            {"result", result_name(c.result)}};
  switch (c.target) {
    case CompareTarget::Version:
      j["version"] = int_text(c.number);
      break;
    case CompareTarget::CreateRevision:
      j["create_revision"] = int_text(c.number);
      break;
    case CompareTarget::ModRevision:
      j["mod_revision"] = int_text(c.number);
      break;
    case CompareTarget::Lease:
      j["lease"] = int_text(c.number);
      break;
    case CompareTarget::Value:
      j["value"] = base64_encode(c.value);
      break;
  }
  return j;
}

// ---- reading the gateway's JSON ---------------------------------------------------------

/// A 64-bit integer field: a string of digits (the gateway's way), a JSON number, or absent
/// (zero, left out). The error names the field.
template <typename Int>
Result<Int> integer(const json& obj, const char* name, const std::string& where) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return Int{0};
  const std::string field = where + "." + name;
  if (it->is_number_integer()) {
    if constexpr (std::is_unsigned_v<Int>) {
      if (it->is_number_unsigned()) return it->template get<Int>();
      if (it->template get<std::int64_t>() < 0) return Error{field + ": negative"};
      return static_cast<Int>(it->template get<std::int64_t>());
    } else {
      if (it->is_number_unsigned() &&
          it->template get<std::uint64_t>() >
              static_cast<std::uint64_t>(std::numeric_limits<Int>::max()))
        return Error{field + ": out of range"};
      return it->template get<Int>();
    }
  }
  if (!it->is_string()) return Error{field + ": expected an integer (a string of digits)"};
  const std::string& text = it->template get_ref<const std::string&>();
  Int value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty())
    return Error{field + ": expected an integer, got \"" + text.substr(0, 40) + "\""};
  return value;
}

/// A bool field; absent is false.
Result<bool> boolean(const json& obj, const char* name, const std::string& where) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return false;
  if (!it->is_boolean()) return Error{where + "." + name + ": expected true or false"};
  return it->get<bool>();
}

/// A base64 bytes field; absent is empty.
Result<std::string> bytes(const json& obj, const char* name, const std::string& where) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Error{where + "." + name + ": expected base64 text"};
  return base64_decode(it->get<std::string>(), where + "." + name);
}

/// A plain string field; absent is empty.
Result<std::string> text(const json& obj, const char* name, const std::string& where) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Error{where + "." + name + ": expected a string"};
  return it->get<std::string>();
}

/// An array field; absent is empty.
Result<const json*> array(const json& obj, const char* name, const std::string& where) {
  static const json kEmpty = json::array();
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return &kEmpty;
  if (!it->is_array()) return Error{where + "." + name + ": expected an array"};
  return &*it;
}

#define ETCD_TRY(var, expr)             \
  auto var##_r = (expr);                \
  if (!var##_r) return var##_r.error(); \
  auto var = std::move(*var##_r)

Result<Header> header_at(const json& body, const std::string& where) {
  const auto it = body.find("header");
  if (it == body.end() || it->is_null()) return Header{};
  if (!it->is_object()) return Error{where + ".header: expected an object"};
  const std::string w = where + ".header";
  ETCD_TRY(cluster, integer<std::uint64_t>(*it, "cluster_id", w));
  ETCD_TRY(member, integer<std::uint64_t>(*it, "member_id", w));
  ETCD_TRY(revision, integer<std::int64_t>(*it, "revision", w));
  ETCD_TRY(term, integer<std::int64_t>(*it, "raft_term", w));
  return Header{cluster, member, revision, term};
}

Result<std::vector<KeyValue>> kvs_at(const json& body, const char* name, const std::string& where) {
  ETCD_TRY(list, array(body, name, where));
  std::vector<KeyValue> out;
  out.reserve(list->size());
  for (std::size_t i = 0; i < list->size(); ++i) {
    ETCD_TRY(kv, decode_kv((*list)[i], where + "." + name + "[" + std::to_string(i) + "]"));
    out.push_back(std::move(kv));
  }
  return out;
}

Result<std::optional<KeyValue>> optional_kv(const json& body, const char* name,
                                            const std::string& where) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<KeyValue>();
  ETCD_TRY(kv, decode_kv(*it, where + "." + name));
  return std::optional<KeyValue>(std::move(kv));
}

Result<RangeResponse> range_at(const json& body, const std::string& where) {
  if (!body.is_object()) return Error{where + ": expected an object"};
  ETCD_TRY(header, header_at(body, where));
  ETCD_TRY(kvs, kvs_at(body, "kvs", where));
  ETCD_TRY(count, integer<std::int64_t>(body, "count", where));
  ETCD_TRY(more, boolean(body, "more", where));
  return RangeResponse{header, std::move(kvs), count, more};
}

Result<PutResponse> put_at(const json& body, const std::string& where) {
  if (!body.is_object()) return Error{where + ": expected an object"};
  ETCD_TRY(header, header_at(body, where));
  ETCD_TRY(prev, optional_kv(body, "prev_kv", where));
  return PutResponse{header, std::move(prev)};
}

Result<DeleteResponse> delete_at(const json& body, const std::string& where) {
  if (!body.is_object()) return Error{where + ": expected an object"};
  ETCD_TRY(header, header_at(body, where));
  ETCD_TRY(deleted, integer<std::int64_t>(body, "deleted", where));
  ETCD_TRY(prev, kvs_at(body, "prev_kvs", where));
  return DeleteResponse{header, deleted, std::move(prev)};
}

/// The gateway wraps a stream's messages as {"result": {...}}.
const json& unwrap(const json& body) {
  const auto it = body.find("result");
  return it != body.end() && it->is_object() ? *it : body;
}

}  // namespace

Request range(const RangeOp& op) { return {"/v3/kv/range", range_json(op).dump(), true}; }

Request put(const PutOp& op) { return {"/v3/kv/put", put_json(op).dump(), false}; }

Request delete_range(const DeleteOp& op) {
  return {"/v3/kv/deleterange", delete_json(op).dump(), false};
}

Request txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
            const std::vector<Op>& failure) {
  json j = json::object();
  json c = json::array();
  for (const Compare& compare : compares) c.push_back(compare_json(compare));
  json s = json::array();
  for (const Op& op : success) s.push_back(op_json(op));
  json f = json::array();
  for (const Op& op : failure) f.push_back(op_json(op));
  j["compare"] = std::move(c);
  j["success"] = std::move(s);
  j["failure"] = std::move(f);
  return {"/v3/kv/txn", j.dump(), false};
}

Request lease_grant(std::int64_t ttl_seconds, std::int64_t id) {
  json j = {{"TTL", int_text(ttl_seconds)}};
  if (id != 0) j["ID"] = int_text(id);
  return {"/v3/lease/grant", j.dump(), false};
}

Request lease_keepalive(std::int64_t id) {
  return {"/v3/lease/keepalive", json{{"ID", int_text(id)}}.dump(), true};
}

Request lease_revoke(std::int64_t id) {
  return {"/v3/lease/revoke", json{{"ID", int_text(id)}}.dump(), true};
}

Request authenticate(const std::string& name, const std::string& password) {
  return {"/v3/auth/authenticate", json{{"name", name}, {"password", password}}.dump(), true};
}

Request member_status() { return {"/v3/maintenance/status", "{}", true}; }

Request watch_create(const WatchOptions& o) {
  json c = {{"key", base64_encode(o.key)}};
  if (!o.range_end.empty()) c["range_end"] = base64_encode(o.range_end);
  if (o.start_revision != 0) c["start_revision"] = int_text(o.start_revision);
  if (o.progress_notify) c["progress_notify"] = true;
  if (o.prev_kv) c["prev_kv"] = true;
  return {"/v3/watch", json{{"create_request", c}}.dump(), true};
}

std::optional<EtcdError> error_of(unsigned http_status, const json& body) {
  if (body.is_object()) {
    const auto it = body.find("error");
    if (it != body.end()) {
      EtcdError e;
      if (it->is_object()) {  // a stream's error: {"error": {"grpc_code", "message", ...}}
        e.code = it->value("grpc_code", 0);
        e.message = it->value("message", std::string());
      } else {
        e.code = body.value("code", 0);
        e.message = body.value("message", it->is_string() ? it->get<std::string>() : "");
      }
      if (e.message.empty()) e.message = "HTTP " + std::to_string(http_status);
      return e;
    }
  }
  if (http_status != 200) {
    // Not etcd's JSON (a proxy, a plain HTTP server): 5xx is worth trying elsewhere. No etcd
    // answers its own paths with 404, 405 or 501: that is another service.
    const bool not_etcd = http_status == 404 || http_status == 405 || http_status == 501;
    return EtcdError{http_status >= 500 ? kCodeUnavailable : 0,
                     "HTTP " + std::to_string(http_status) + " without an etcd error" +
                         (not_etcd ? " (" + std::string(kNotEtcdApi) + ")" : "")};
  }
  return std::nullopt;
}

bool retry_elsewhere(const EtcdError& e) {
  // Unavailable covers "no leader", "not capable", "stopped" and "timed out"; only answers that
  // say the request was never applied are retried for requests that are not idempotent (the
  // client checks Request::idempotent for the rest).
  return e.code == kCodeUnavailable;
}

bool token_refused(const EtcdError& e) {
  return e.code == kCodeUnauthenticated ||
         e.message.find("invalid auth token") != std::string::npos;
}

Result<Header> decode_header(const json& body) {
  if (!body.is_object()) return Error{"answer: expected a JSON object"};
  return header_at(body, "answer");
}

Result<KeyValue> decode_kv(const json& kv, const std::string& where) {
  if (!kv.is_object()) return Error{where + ": expected an object"};
  ETCD_TRY(key, bytes(kv, "key", where));
  ETCD_TRY(value, bytes(kv, "value", where));
  ETCD_TRY(create, integer<std::int64_t>(kv, "create_revision", where));
  ETCD_TRY(mod, integer<std::int64_t>(kv, "mod_revision", where));
  ETCD_TRY(version, integer<std::int64_t>(kv, "version", where));
  ETCD_TRY(lease, integer<std::int64_t>(kv, "lease", where));
  return KeyValue{std::move(key), std::move(value), create, mod, version, lease};
}

Result<RangeResponse> decode_range(const json& body) { return range_at(body, "range"); }
Result<PutResponse> decode_put(const json& body) { return put_at(body, "put"); }
Result<DeleteResponse> decode_delete(const json& body) { return delete_at(body, "deleterange"); }

Result<TxnResponse> decode_txn(const json& body) {
  if (!body.is_object()) return Error{"txn: expected an object"};
  ETCD_TRY(header, header_at(body, "txn"));
  ETCD_TRY(succeeded, boolean(body, "succeeded", "txn"));
  ETCD_TRY(list, array(body, "responses", "txn"));
  TxnResponse out{header, succeeded, {}};
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& r = (*list)[i];
    const std::string where = "txn.responses[" + std::to_string(i) + "]";
    if (!r.is_object()) return Error{where + ": expected an object"};
    if (const auto it = r.find("response_range"); it != r.end()) {
      ETCD_TRY(x, range_at(*it, where + ".response_range"));
      out.responses.emplace_back(std::move(x));
    } else if (const auto put_it = r.find("response_put"); put_it != r.end()) {
      ETCD_TRY(x, put_at(*put_it, where + ".response_put"));
      out.responses.emplace_back(std::move(x));
    } else if (const auto del = r.find("response_delete_range"); del != r.end()) {
      ETCD_TRY(x, delete_at(*del, where + ".response_delete_range"));
      out.responses.emplace_back(std::move(x));
    } else {
      return Error{where + ": expected response_range, response_put or response_delete_range"};
    }
  }
  return out;
}

Result<LeaseGrantResponse> decode_lease_grant(const json& body) {
  if (!body.is_object()) return Error{"lease grant: expected an object"};
  ETCD_TRY(header, header_at(body, "lease grant"));
  ETCD_TRY(id, integer<std::int64_t>(body, "ID", "lease grant"));
  ETCD_TRY(ttl, integer<std::int64_t>(body, "TTL", "lease grant"));
  ETCD_TRY(error, text(body, "error", "lease grant"));
  if (!error.empty()) return Error{"lease grant: " + error};
  if (id == 0) return Error{"lease grant: the answer has no lease ID"};
  return LeaseGrantResponse{header, id, ttl};
}

Result<LeaseKeepAliveResponse> decode_lease_keepalive(const json& message) {
  if (!message.is_object()) return Error{"lease keepalive: expected an object"};
  const json& body = unwrap(message);
  ETCD_TRY(header, header_at(body, "lease keepalive"));
  ETCD_TRY(id, integer<std::int64_t>(body, "ID", "lease keepalive"));
  ETCD_TRY(ttl, integer<std::int64_t>(body, "TTL", "lease keepalive"));
  return LeaseKeepAliveResponse{header, id, ttl};
}

Result<AuthenticateResponse> decode_authenticate(const json& body) {
  if (!body.is_object()) return Error{"authenticate: expected an object"};
  ETCD_TRY(header, header_at(body, "authenticate"));
  ETCD_TRY(token, text(body, "token", "authenticate"));
  if (token.empty()) return Error{"authenticate: the answer has no token"};
  return AuthenticateResponse{header, std::move(token)};
}

Result<StatusResponse> decode_status(const json& body) {
  if (!body.is_object()) return Error{"status: expected an object"};
  ETCD_TRY(header, header_at(body, "status"));
  ETCD_TRY(version, text(body, "version", "status"));
  ETCD_TRY(leader, integer<std::uint64_t>(body, "leader", "status"));
  ETCD_TRY(index, integer<std::int64_t>(body, "raftIndex", "status"));
  ETCD_TRY(term, integer<std::int64_t>(body, "raftTerm", "status"));
  return StatusResponse{header, std::move(version), leader, index, term};
}

Result<WatchResponse> decode_watch(const json& message) {
  if (!message.is_object()) return Error{"watch: expected an object"};
  const json& body = unwrap(message);
  const std::string w = "watch";
  ETCD_TRY(header, header_at(body, w));
  ETCD_TRY(watch_id, integer<std::int64_t>(body, "watch_id", w));
  ETCD_TRY(created, boolean(body, "created", w));
  ETCD_TRY(canceled, boolean(body, "canceled", w));
  ETCD_TRY(compact, integer<std::int64_t>(body, "compact_revision", w));
  ETCD_TRY(reason, text(body, "cancel_reason", w));
  ETCD_TRY(list, array(body, "events", w));
  WatchResponse out{header, watch_id, created, canceled, compact, std::move(reason), {}};
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    const std::string where = w + ".events[" + std::to_string(i) + "]";
    if (!e.is_object()) return Error{where + ": expected an object"};
    ETCD_TRY(type, text(e, "type", where));
    Event event;
    if (type.empty() || type == "PUT") {
      event.type = Event::Type::Put;
    } else if (type == "DELETE") {
      event.type = Event::Type::Delete;
    } else {
      return Error{where + ".type: expected PUT or DELETE, got \"" + type + "\""};
    }
    const auto kv = e.find("kv");
    if (kv == e.end()) return Error{where + ".kv: missing"};
    ETCD_TRY(k, decode_kv(*kv, where + ".kv"));
    event.kv = std::move(k);
    ETCD_TRY(prev, optional_kv(e, "prev_kv", where));
    event.prev_kv = std::move(prev);
    out.events.push_back(std::move(event));
  }
  return out;
}

Result<std::vector<json>> JsonStreamDecoder::feed(const std::string& bytes) {
  if (failed_) return Error{*failed_};
  std::vector<json> out;
  for (const char c : bytes) {
    if (depth_ == 0) {
      // Between objects: white space (the gateway ends each with a newline) or an opening brace.
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
      if (c != '{') {
        failed_ = "watch stream: expected a JSON object, got byte " +
                  std::to_string(static_cast<unsigned char>(c));
        return Error{*failed_};
      }
    }
    buffer_ += c;
    if (buffer_.size() > max_) {
      failed_ = "watch stream: a message longer than " + std::to_string(max_) + " bytes";
      return Error{*failed_};
    }
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        json parsed = json::parse(buffer_, nullptr, false);
        buffer_.clear();
        if (parsed.is_discarded()) {
          failed_ = "watch stream: a message is not valid JSON";
          return Error{*failed_};
        }
        out.push_back(std::move(parsed));
      }
    }
  }
  return out;
}

}  // namespace ddprun::etcd
