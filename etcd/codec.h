#pragma once
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/result.h"

// etcd v3's JSON gateway without sockets (docs/design.md#rendezvous-on-etcd-v3): request
// builders give a path and a body, decoders take the answer's JSON. The gateway's quirks are
// handled here and nowhere else: keys and values are base64, 64-bit integers arrive as strings,
// and fields that are false or zero are left out (a failed txn has no "succeeded", a PUT event
// no "type", a first revision no "version").

namespace ddprun::etcd {

/// Base64 of any bytes (standard alphabet, padded), as the gateway wants `bytes` fields.
std::string base64_encode(const std::string& bytes);

/// The bytes of base64 text; the error names `field` and what is wrong with it.
common::Result<std::string> base64_decode(const std::string& text, const std::string& field);

/// The range end that selects every key starting with `prefix` (etcd's rule: the prefix with
/// its last byte below 0xff incremented, trailing 0xff bytes dropped; "\0" for all keys).
std::string prefix_end(const std::string& prefix);

/// One request to the gateway: POST `path` with `body`.
struct Request {
  std::string path;  ///< "/v3/kv/range", ...
  std::string body;  ///< JSON text
  /// Whether sending it twice does no harm, so a broken connection after sending may be
  /// retried on another member (a range, a keep-alive); a put or a txn may not.
  bool idempotent = false;
  /// One attempt on one member at most this long; 0: the client's attempt_timeout. A lease's
  /// keep-alive uses a third of its TTL, so a member that holds it silently cannot outlast it.
  std::chrono::milliseconds attempt_timeout{0};
};

/// What a txn compares (etcd's Compare.CompareTarget).
enum class CompareTarget { Version, CreateRevision, ModRevision, Value, Lease };
/// How (etcd's Compare.CompareResult).
enum class CompareResult { Equal, Greater, Less, NotEqual };

/// One condition of a txn: target(key) result operand.
struct Compare {
  std::string key;
  CompareTarget target = CompareTarget::ModRevision;
  CompareResult result = CompareResult::Equal;
  std::int64_t number = 0;  ///< the operand for Version, CreateRevision, ModRevision, Lease
  std::string value;        ///< the operand for Value
};

/// The order of a range's answer (etcd's SortOrder with SortTarget CREATE; none: by key).
enum class RangeSort { ByKey, OldestCreatedFirst, NewestCreatedFirst };

/// Reads `key`, or every key in [key, range_end) when range_end is not empty.
struct RangeOp {
  RangeOp() = default;
  RangeOp(std::string key_, std::string range_end_ = {}, std::int64_t limit_ = 0,
          std::int64_t revision_ = 0, bool count_only_ = false)
      : key(std::move(key_)),
        range_end(std::move(range_end_)),
        limit(limit_),
        revision(revision_),
        count_only(count_only_) {}
  std::string key;
  std::string range_end;
  std::int64_t limit = 0;     ///< 0: no limit
  std::int64_t revision = 0;  ///< 0: the newest
  bool count_only = false;
  bool keys_only = false;  ///< leave the values out
  RangeSort sort = RangeSort::ByKey;
  std::int64_t max_create_revision = 0;  ///< not 0: only keys created at or before it
};
/// Writes `key`, attached to `lease` when not 0.
struct PutOp {
  std::string key;
  std::string value;
  std::int64_t lease = 0;
  bool prev_kv = false;
};
/// Deletes `key`, or every key in [key, range_end).
struct DeleteOp {
  std::string key;
  std::string range_end;
  bool prev_kv = false;
};
using Op = std::variant<RangeOp, PutOp, DeleteOp>;

Request range(const RangeOp& op);
Request put(const PutOp& op);
Request delete_range(const DeleteOp& op);
/// If every compare holds, the success ops run, else the failure ops; atomically.
Request txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
            const std::vector<Op>& failure);
/// A lease of `ttl_seconds`; `id` 0 lets etcd choose it.
Request lease_grant(std::int64_t ttl_seconds, std::int64_t id = 0);
/// Renews a lease for its TTL (one message of the keep-alive stream).
Request lease_keepalive(std::int64_t id);
/// Ends a lease now, deleting its keys.
Request lease_revoke(std::int64_t id);
/// A user's token for the Authorization header.
Request authenticate(const std::string& name, const std::string& password);
/// The member's status: its id, the leader's, the raft index.
Request member_status();

/// What a watch covers and from where.
struct WatchOptions {
  std::string key;
  std::string range_end;            ///< prefix_end(key) for a prefix watch
  std::int64_t start_revision = 0;  ///< 0: changes after now
  bool progress_notify = true;      ///< ask for empty responses carrying the revision
  bool prev_kv = false;
};
/// The body that opens a watch stream (POST /v3/watch).
Request watch_create(const WatchOptions& options);

/// The header every answer carries.
struct Header {
  std::uint64_t cluster_id = 0;
  std::uint64_t member_id = 0;
  std::int64_t revision = 0;
  std::int64_t raft_term = 0;
};

/// A key and its value with its revisions (etcd's mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
  bool operator==(const KeyValue&) const = default;
};

struct RangeResponse {
  Header header;
  std::vector<KeyValue> kvs;
  std::int64_t count = 0;
  bool more = false;
};
struct PutResponse {
  Header header;
  std::optional<KeyValue> prev_kv;
};
struct DeleteResponse {
  Header header;
  std::int64_t deleted = 0;
  std::vector<KeyValue> prev_kvs;
};
using OpResponse = std::variant<RangeResponse, PutResponse, DeleteResponse>;
struct TxnResponse {
  Header header;
  bool succeeded = false;  ///< false: the compares failed and the failure ops ran
  std::vector<OpResponse> responses;
};
struct LeaseGrantResponse {
  Header header;
  std::int64_t id = 0;
  std::int64_t ttl = 0;
};
struct LeaseKeepAliveResponse {
  Header header;
  std::int64_t id = 0;
  std::int64_t ttl = 0;  ///< 0: the lease is gone (expired or revoked)
};
struct AuthenticateResponse {
  Header header;
  std::string token;
};
struct StatusResponse {
  Header header;
  std::string version;
  std::uint64_t leader = 0;
  std::int64_t raft_index = 0;
  std::int64_t raft_term = 0;
};

/// An error etcd answered with: {"error": ..., "code": ..., "message": ...}, or in a stream
/// {"error": {"grpc_code": ..., "http_code": ..., "message": ...}}.
struct EtcdError {
  int code = 0;  ///< gRPC status code: 14 unavailable, 16 unauthenticated, 9, 3, ...
  std::string message;
};

/// gRPC status codes the client acts on.
inline constexpr int kCodeInvalidArgument = 3;
inline constexpr int kCodeUnavailable = 14;
inline constexpr int kCodeUnauthenticated = 16;

/// The error in an answer, if it is one (an HTTP status other than 200, or an "error" field).
std::optional<EtcdError> error_of(unsigned http_status, const nlohmann::json& body);
/// In the message of an answer no etcd member gives (404, 405 or 501 without etcd's JSON): the
/// endpoint is another HTTP service, or a proxy's path that does not lead to etcd.
inline constexpr std::string_view kNotEtcdApi = "not etcd's v3 API";
/// True when etcd says the request was not applied and another member may take it (no leader,
/// the member is stopping or not yet serving).
bool retry_elsewhere(const EtcdError& error);
/// True when the token was refused: authenticate again and resend.
bool token_refused(const EtcdError& error);

common::Result<Header> decode_header(const nlohmann::json& body);
common::Result<KeyValue> decode_kv(const nlohmann::json& kv, const std::string& where);
common::Result<RangeResponse> decode_range(const nlohmann::json& body);
common::Result<PutResponse> decode_put(const nlohmann::json& body);
common::Result<DeleteResponse> decode_delete(const nlohmann::json& body);
common::Result<TxnResponse> decode_txn(const nlohmann::json& body);
common::Result<LeaseGrantResponse> decode_lease_grant(const nlohmann::json& body);
/// The gateway wraps keep-alive answers as {"result": {...}}; both shapes are read.
common::Result<LeaseKeepAliveResponse> decode_lease_keepalive(const nlohmann::json& body);
common::Result<AuthenticateResponse> decode_authenticate(const nlohmann::json& body);
common::Result<StatusResponse> decode_status(const nlohmann::json& body);

/// A watch event; PUT is left out of the JSON (enum value 0).
struct Event {
  enum class Type { Put, Delete } type = Type::Put;
  KeyValue kv;
  std::optional<KeyValue> prev_kv;
};

/// One message of a watch stream (etcd's WatchResponse, unwrapped from {"result": ...}).
struct WatchResponse {
  Header header;
  std::int64_t watch_id = 0;
  bool created = false;
  bool canceled = false;
  std::int64_t compact_revision = 0;  ///< not 0: the start revision was compacted away
  std::string cancel_reason;
  std::vector<Event> events;  ///< empty in a created or progress response
};
common::Result<WatchResponse> decode_watch(const nlohmann::json& message);

/// Cuts a byte stream of concatenated JSON objects (the watch stream's chunk bodies, in any
/// pieces) into whole objects. Bounded: an object longer than the limit is an error, and a
/// decoder that saw an error stays failed.
class JsonStreamDecoder {
 public:
  explicit JsonStreamDecoder(std::size_t max_object_bytes) : max_(max_object_bytes) {}
  /// Appends bytes; returns the objects they complete (possibly none), or the error.
  common::Result<std::vector<nlohmann::json>> feed(const std::string& bytes);
  /// Bytes held of an object not yet complete.
  std::size_t buffered() const { return buffer_.size(); }

 private:
  std::size_t max_;
  std::string buffer_;      ///< bytes of the object being read
  int depth_ = 0;           ///< braces and brackets open
  bool in_string_ = false;  ///< inside a JSON string
  bool escaped_ = false;    ///< the previous byte was a backslash inside a string
  std::optional<std::string> failed_;
};

}  // namespace ddprun::etcd
