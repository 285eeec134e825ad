#include "etcd/codec.h"
#include "etcd/client.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "tests/support/subprocess.h"

using namespace ddprun::etcd;
using Catch::Matchers::Contains;
using nlohmann::json;

TEST_CASE("base64 round-trips every length and byte", "[etcd][unit]") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("foo") == "Zm9v");
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (std::size_t n = 0; n <= all.size(); n += 37) {
    const std::string bytes = all.substr(0, n);
    auto back = base64_decode(base64_encode(bytes), "kv.key");
    REQUIRE(back.ok());
    CHECK(*back == bytes);
  }
  // Padding is not data: one and two '=' drop two and one bytes.
  CHECK(*base64_decode("Zg==", "x") == "f");
  CHECK(*base64_decode("Zm8=", "x") == "fo");
  CHECK(*base64_decode("AAAA", "x") == std::string(3, '\0'));
}

TEST_CASE("bad base64 is refused naming the field", "[etcd][unit]") {
  CHECK(base64_decode("Zm9", "range.kvs[0].key").error().message ==
        "range.kvs[0].key: not base64 (3 characters, not a multiple of 4)");
  CHECK(base64_decode("Zm9@", "kv.value").error().message == "kv.value: not base64 (character 3)");
  CHECK(base64_decode("Z=9v", "kv.value").error().message == "kv.value: not base64 (character 1)");
}

TEST_CASE("the prefix range end increments the last byte below 0xff", "[etcd][unit]") {
  CHECK(prefix_end("/ddprun/job/") == "/ddprun/job0");
  CHECK(prefix_end("a\xff") == "b");
  CHECK(prefix_end("\xff\xff") == std::string(1, '\0'));
  CHECK(prefix_end("") == std::string(1, '\0'));
}

TEST_CASE("requests carry keys in base64 and integers as strings", "[etcd][unit]") {
  const Request r = range({"/ddprun/j/", prefix_end("/ddprun/j/"), 0, 0, false});
  CHECK(r.path == "/v3/kv/range");
  CHECK(r.idempotent);
  CHECK(json::parse(r.body) ==
        json{{"key", base64_encode("/ddprun/j/")}, {"range_end", base64_encode("/ddprun/j0")}});
  const Request p = put({"k", "v", 7587869435283968081, false});
  CHECK(p.path == "/v3/kv/put");
  CHECK_FALSE(p.idempotent);
  CHECK(json::parse(p.body) ==
        json{{"key", "aw=="}, {"value", "dg=="}, {"lease", "7587869435283968081"}});
  CHECK(json::parse(delete_range({"k", "l", true}).body) ==
        json{{"key", "aw=="}, {"range_end", "bA=="}, {"prev_kv", true}});
  CHECK(json::parse(lease_grant(15).body) == json{{"TTL", "15"}});
  CHECK(json::parse(lease_keepalive(42).body) == json{{"ID", "42"}});
  CHECK(lease_revoke(42).path == "/v3/lease/revoke");
  CHECK(json::parse(authenticate("ann", "pw").body) == json{{"name", "ann"}, {"password", "pw"}});
  CHECK(member_status().path == "/v3/maintenance/status");
}

TEST_CASE("a txn names each compare's target and operand", "[etcd][unit]") {
  const Request t = txn({{"/s", CompareTarget::ModRevision, CompareResult::Equal, 12, ""},
                         {"/n", CompareTarget::CreateRevision, CompareResult::Equal, 0, ""},
                         {"/v", CompareTarget::Version, CompareResult::Greater, 2, ""},
                         {"/x", CompareTarget::Value, CompareResult::NotEqual, 0, "old"}},
                        {PutOp{"/s", "new", 0, false}, DeleteOp{"/d", "", false}},
                        {RangeOp{"/s", "", 0, 0, false}});
  const json j = json::parse(t.body);
  CHECK(t.path == "/v3/kv/txn");
  CHECK(j["compare"][0] == json{{"key", base64_encode("/s")},
                                {"target", "MOD"},
                                {"result", "EQUAL"},
                                {"mod_revision", "12"}});
  CHECK(j["compare"][1]["target"] == "CREATE");
  CHECK(j["compare"][1]["create_revision"] == "0");
  CHECK(j["compare"][2]["result"] == "GREATER");
  CHECK(j["compare"][2]["version"] == "2");
  CHECK(j["compare"][3]["value"] == base64_encode("old"));
  CHECK(j["success"][0]["request_put"]["value"] == base64_encode("new"));
  CHECK(j["success"][1].contains("request_delete_range"));
  CHECK(j["failure"][0].contains("request_range"));
}

TEST_CASE("a watch asks for a prefix from a revision with progress notices", "[etcd][unit]") {
  const Request w = watch_create({"/p/", prefix_end("/p/"), 41, true, false});
  CHECK(w.path == "/v3/watch");
  CHECK(json::parse(w.body) == json{{"create_request",
                                     {{"key", base64_encode("/p/")},
                                      {"range_end", base64_encode("/p0")},
                                      {"start_revision", "41"},
                                      {"progress_notify", true}}}});
}

// Answers as etcd 3.4.23's gateway writes them.
constexpr const char* kHeader =
    R"({"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"2","raft_term":"2"})";

TEST_CASE("a range of the key created just before another asks etcd to sort by create revision",
          "[etcd][unit]") {
  RangeOp before{"/j/nodes/", prefix_end("/j/nodes/")};
  before.limit = 1;
  before.keys_only = true;
  before.sort = RangeSort::NewestCreatedFirst;
  before.max_create_revision = 41;
  CHECK(json::parse(range(before).body) == json{{"key", base64_encode("/j/nodes/")},
                                                {"range_end", base64_encode("/j/nodes0")},
                                                {"limit", "1"},
                                                {"keys_only", true},
                                                {"sort_target", "CREATE"},
                                                {"sort_order", "DESCEND"},
                                                {"max_create_revision", "41"}});
  before.sort = RangeSort::OldestCreatedFirst;
  CHECK(json::parse(range(before).body)["sort_order"] == "ASCEND");
}

TEST_CASE("a range answer reads int64 strings and left-out fields", "[etcd][unit]") {
  const json body = json::parse(
      std::string(R"({"header":)") + kHeader +
      R"(,"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"})");
  auto r = decode_range(body);
  REQUIRE(r.ok());
  CHECK(r->header.cluster_id == 15118495548433857066ull);
  CHECK(r->header.revision == 2);
  REQUIRE(r->kvs.size() == 1);
  CHECK(r->kvs[0] == KeyValue{"foo", "bar", 2, 2, 1, 0});
  CHECK(r->count == 1);
  CHECK_FALSE(r->more);
  // No keys: kvs and count are left out.
  auto empty = decode_range(json::parse(std::string(R"({"header":)") + kHeader + "}"));
  REQUIRE(empty.ok());
  CHECK(empty->kvs.empty());
  CHECK(empty->count == 0);
}

TEST_CASE("a failed txn has no succeeded field and is read as false", "[etcd][unit]") {
  auto failed = decode_txn(json::parse(
      std::string(R"({"header":)") + kHeader +
      R"(,"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}}]})"));
  REQUIRE(failed.ok());
  CHECK_FALSE(failed->succeeded);
  REQUIRE(failed->responses.size() == 1);
  CHECK(std::get<RangeResponse>(failed->responses[0]).kvs.at(0).value == "bar");
  auto ok = decode_txn(json::parse(
      R"({"header":{"revision":"3"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"3"}}},{"response_delete_range":{"header":{},"deleted":"2"}}]})"));
  REQUIRE(ok.ok());
  CHECK(ok->succeeded);
  CHECK(std::get<DeleteResponse>(ok->responses[1]).deleted == 2);
}

TEST_CASE("a bad field in an answer is named", "[etcd][unit]") {
  CHECK(decode_range(json::parse(R"({"kvs":[{"key":"Zm9v","mod_revision":"x2"}]})"))
            .error()
            .message == "range.kvs[0].mod_revision: expected an integer, got \"x2\"");
  CHECK(decode_range(json::parse(R"({"kvs":[{"key":"Zm9"}]})")).error().message ==
        "range.kvs[0].key: not base64 (3 characters, not a multiple of 4)");
  CHECK(decode_txn(json::parse(R"({"succeeded":"yes"})")).error().message ==
        "txn.succeeded: expected true or false");
  CHECK(decode_txn(json::parse(R"({"responses":[{"response_other":{}}]})")).error().message ==
        "txn.responses[0]: expected response_range, response_put or response_delete_range");
  CHECK(decode_lease_grant(json::parse(R"({"header":{}})")).error().message ==
        "lease grant: the answer has no lease ID");
}

TEST_CASE("lease and auth and status answers are read", "[etcd][unit]") {
  auto grant =
      decode_lease_grant(json::parse(R"({"header":{},"ID":"4111120175682824200","TTL":"5"})"));
  REQUIRE(grant.ok());
  CHECK(grant->id == 4111120175682824200);
  CHECK(grant->ttl == 5);
  // Keep-alive answers come wrapped; a lease that is gone has no TTL.
  auto alive =
      decode_lease_keepalive(json::parse(R"({"result":{"header":{},"ID":"7","TTL":"5"}})"));
  REQUIRE(alive.ok());
  CHECK(alive->ttl == 5);
  auto gone = decode_lease_keepalive(json::parse(R"({"result":{"header":{},"ID":"7"}})"));
  REQUIRE(gone.ok());
  CHECK(gone->ttl == 0);
  auto auth = decode_authenticate(json::parse(R"({"header":{},"token":"abc.12"})"));
  REQUIRE(auth.ok());
  CHECK(auth->token == "abc.12");
  auto status = decode_status(json::parse(
      R"({"header":{"member_id":"13668033151171901709"},"version":"3.4.23","leader":"13668033151171901709","raftIndex":"7","raftTerm":"2"})"));
  REQUIRE(status.ok());
  CHECK(status->leader == status->header.member_id);
  CHECK(status->version == "3.4.23");
}

TEST_CASE("error answers are read in both of the gateway's shapes", "[etcd][unit]") {
  auto flat = error_of(
      400,
      json::parse(
          R"({"error":"illegal base64 data at input byte 0","message":"illegal base64 data at input byte 0","code":3})"));
  REQUIRE(flat);
  CHECK(flat->code == 3);
  CHECK(flat->message == "illegal base64 data at input byte 0");
  auto streamed = error_of(
      200,
      json::parse(
          R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}})"));
  REQUIRE(streamed);
  CHECK(retry_elsewhere(*streamed));
  CHECK(token_refused(EtcdError{3, "etcdserver: invalid auth token"}));
  CHECK_FALSE(error_of(200, json::parse(R"({"header":{}})")));
  CHECK(error_of(502, json::object())->code == kCodeUnavailable);
  // A proxy's 502 may be etcd's absence for a while; a 404, 405 or 501 is another service.
  CHECK(error_of(502, json::object())->message.find(kNotEtcdApi) == std::string::npos);
  for (unsigned status : {404u, 405u, 501u})
    CHECK(error_of(status, json::object())->message.find(kNotEtcdApi) != std::string::npos);
}

TEST_CASE("watch messages: PUT is left out and compaction is reported", "[etcd][unit]") {
  auto events = decode_watch(json::parse(
      R"({"result":{"header":{"revision":"3"},"events":[{"kv":{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}},{"type":"DELETE","kv":{"key":"Zm9v","mod_revision":"3"}}]}})"));
  REQUIRE(events.ok());
  REQUIRE(events->events.size() == 2);
  CHECK(events->events[0].type == Event::Type::Put);
  CHECK(events->events[1].type == Event::Type::Delete);
  CHECK(events->events[1].kv.mod_revision == 3);
  auto compacted = decode_watch(json::parse(
      R"({"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"3"}})"));
  REQUIRE(compacted.ok());
  CHECK(compacted->canceled);
  CHECK(compacted->compact_revision == 3);
  CHECK_THAT(decode_watch(json::parse(R"({"result":{"events":[{"type":"TOUCH","kv":{}}]}})"))
                 .error()
                 .message,
             Contains("watch.events[0].type: expected PUT or DELETE"));
}

TEST_CASE("the stream decoder cuts objects split at any byte", "[etcd][unit]") {
  const std::string stream =
      "{\"result\":{\"created\":true}}\n{\"result\":{\"events\":[{\"kv\":{\"key\":\"e319\"}}]}}\n"
      "{\"a\":\"brace } in \\\" a string {\"}\n";
  for (std::size_t cut = 1; cut < stream.size(); cut += 1) {
    JsonStreamDecoder d(1024);
    auto first = d.feed(stream.substr(0, cut));
    REQUIRE(first.ok());
    auto second = d.feed(stream.substr(cut));
    REQUIRE(second.ok());
    std::vector<json> all = *first;
    all.insert(all.end(), second->begin(), second->end());
    REQUIRE(all.size() == 3);
    CHECK(all[0]["result"]["created"] == true);
    CHECK(all[2]["a"] == "brace } in \" a string {");
    CHECK(d.buffered() == 0);
  }
}

TEST_CASE("the stream decoder refuses oversized and non-object input and stays failed",
          "[etcd][unit]") {
  JsonStreamDecoder small(16);
  CHECK(small.feed("{\"k\":\"0123456789abcdef\"}").error().message ==
        "watch stream: a message longer than 16 bytes");
  CHECK_FALSE(small.feed("{}").ok());
  JsonStreamDecoder text(1024);
  CHECK(text.feed("<html>").error().message == "watch stream: expected a JSON object, got byte 60");
  JsonStreamDecoder bad(1024);
  CHECK(bad.feed("{\"a\":tru}").error().message == "watch stream: a message is not valid JSON");
}

TEST_CASE("etcd members are host and port pairs separated by commas", "[etcd][unit]") {
  auto members = ddprun::etcd::parse_members("10.0.0.1:2379,node-b,[fd00::1]:12379");
  REQUIRE(members.ok());
  REQUIRE(members->size() == 3);
  CHECK(members->at(0).text() == "10.0.0.1:2379");
  CHECK(members->at(1).text() == "node-b:2379");
  CHECK(members->at(2).text() == "[fd00::1]:12379");
  CHECK(ddprun::etcd::parse_members("a:1,,b:2").error().message ==
        "etcd endpoint \"\": expected host:port, [ipv6]:port or host (port 2379), separated by "
        "commas");
  CHECK_FALSE(ddprun::etcd::parse_members("a:0").ok());
  // Client URLs, as etcd advertises them: http:// is dropped, https:// asks for tls_ca.
  auto urls = ddprun::etcd::parse_members("http://10.0.0.1:2379/,http://node-b");
  REQUIRE(urls.ok());
  CHECK((*urls)[0].text() == "10.0.0.1:2379");
  CHECK((*urls)[1].text() == "node-b:2379");
  CHECK(ddprun::etcd::parse_members("https://e1:2379").error().message ==
        "etcd endpoint \"https://e1:2379\": give it as e1:2379 with --rdzv_conf tls_ca=FILE (the "
        "CA of etcd's certificate): TLS follows from tls_ca");
  CHECK_FALSE(ddprun::etcd::parse_members("a:70000").ok());
}

TEST_CASE("the etcd password comes from a file only its owner reads", "[etcd][unit]") {
  ddprun::testing::TempDir dir;
  const std::string path = dir.path() + "/etcd-password";
  auto write = [&](const std::string& text, mode_t mode) {
    std::ofstream(path, std::ios::trunc) << text;
    REQUIRE(::chmod(path.c_str(), mode) == 0);
  };
  write("s3cret\n", 0600);
  auto ok = ddprun::etcd::read_credentials("ann", path);
  REQUIRE(ok.ok());
  CHECK(ok->user == "ann");
  CHECK(ok->password == "s3cret");
  write("s3cret\n", 0644);
  CHECK(ddprun::etcd::read_credentials("ann", path).error().message ==
        "--rdzv_conf etcd_password_file=" + path +
            " is readable by group or others (mode 644): run chmod 600 " + path);
  write("\n", 0600);
  CHECK(ddprun::etcd::read_credentials("ann", path).error().message ==
        "--rdzv_conf etcd_password_file=" + path + " is empty: write etcd_user's password in it");
  CHECK(ddprun::etcd::read_credentials("", path).error().message ==
        "--rdzv_conf etcd_password_file needs etcd_user (the etcd user)");
  CHECK_THAT(ddprun::etcd::read_credentials("ann", dir.path() + "/missing").error().message,
             Contains("No such file or directory; give a file holding etcd_user's password"));
}
