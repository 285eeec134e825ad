// The etcd v3 client against a real three-member etcd cluster on 127.0.0.1
// (tests/etcd/etcd_cluster.h): requests, leases, watches, failover when the leader is killed,
// authentication, and every member down then back.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "etcd/client.h"
#include "rendezvous/tls.h"
#include "tests/etcd/etcd_cluster.h"

using namespace ddprun;
using namespace ddprun::etcd;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using testing::call_sync;
using testing::EtcdCluster;
using testing::run_until;

namespace {

ClientSettings settings_for(const std::vector<Member>& members) {
  ClientSettings s;
  s.members = members;
  s.request_timeout = 10s;
  s.attempt_timeout = 3s;
  return s;
}

/// Puts key=value; the new revision, or the error's message.
std::variant<std::int64_t, std::string> put_sync(boost::asio::io_context& io, Client& client,
                                                 const std::string& key, const std::string& value,
                                                 std::int64_t lease = 0) {
  auto reply = call_sync(io, client, put({key, value, lease, false}));
  if (!reply) return reply.error().message;
  auto decoded = decode_put(*reply);
  if (!decoded) return decoded.error().message;
  return decoded->header.revision;
}

RangeResponse range_sync(boost::asio::io_context& io, Client& client, const std::string& prefix) {
  auto reply = call_sync(io, client, range({prefix, prefix_end(prefix), 0, 0, false}));
  INFO((reply ? std::string() : reply.error().message));
  REQUIRE(reply.ok());
  auto decoded = decode_range(*reply);
  REQUIRE(decoded.ok());
  return *decoded;
}

/// The events a watch delivered, with the notices and how it ended.
struct Recorder {
  std::vector<Event> events;
  std::vector<std::string> notices;
  std::optional<std::string> ended;
  int responses = 0;
  std::shared_ptr<Watch> watch;

  /// Opens the watch and, for a watch from now, waits until etcd confirmed it (a put sent
  /// before that may precede the watch's start).
  void open(boost::asio::io_context& io, Client& client, const std::string& prefix,
            std::int64_t from = 0) {
    open(client, prefix, from);
    if (from == 0)
      REQUIRE(run_until(
          io, [&] { return watch->next_revision() != 0; }, 20s));
  }
  void open(Client& client, const std::string& prefix, std::int64_t from) {
    watch = client.watch(
        {prefix, prefix_end(prefix), from, true, false},
        [this](const WatchResponse& r) {
          ++responses;
          events.insert(events.end(), r.events.begin(), r.events.end());
        },
        [this](const common::Error& e) { ended = e.message; },
        [this](const std::string& n) { notices.push_back(n); });
  }
  bool saw(const std::string& key) const {
    return std::any_of(events.begin(), events.end(),
                       [&](const Event& e) { return e.kv.key == key; });
  }
};

}  // namespace

TEST_CASE("put and range and txn on a three-member etcd cluster", "[etcd]") {
  EtcdCluster cluster;
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  boost::asio::io_context io;
  auto client = std::make_shared<Client>(io, settings_for(cluster.members()));

  auto first = put_sync(io, *client, "/ddprun/j/nodes/a", "{\"name\":\"a\"}");
  REQUIRE(std::holds_alternative<std::int64_t>(first));
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/j/nodes/b", "b")));
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/k/other", "x")));
  const RangeResponse nodes = range_sync(io, *client, "/ddprun/j/");
  REQUIRE(nodes.kvs.size() == 2);
  CHECK(nodes.kvs[0].key == "/ddprun/j/nodes/a");
  CHECK(nodes.kvs[0].value == "{\"name\":\"a\"}");
  CHECK(nodes.kvs[0].mod_revision == std::get<std::int64_t>(first));

  // A compare on the mod revision read: the first txn wins, the second (stale) fails and
  // its failure branch reads the value the first wrote.
  const std::int64_t seen = nodes.kvs[0].mod_revision;
  auto advance = [&](const std::string& value) {
    auto reply = call_sync(
        io, *client,
        txn({{"/ddprun/j/nodes/a", CompareTarget::ModRevision, CompareResult::Equal, seen, ""}},
            {PutOp{"/ddprun/j/nodes/a", value, 0, false}},
            {RangeOp{"/ddprun/j/nodes/a", "", 0, 0, false}}));
    REQUIRE(reply.ok());
    auto decoded = decode_txn(*reply);
    REQUIRE(decoded.ok());
    return *decoded;
  };
  const TxnResponse won = advance("round 1");
  CHECK(won.succeeded);
  const TxnResponse lost = advance("round 1 again");
  CHECK_FALSE(lost.succeeded);
  REQUIRE(lost.responses.size() == 1);
  CHECK(std::get<RangeResponse>(lost.responses[0]).kvs.at(0).value == "round 1");

  // A key that must not exist yet (create revision 0): a second join with the same id fails.
  auto join = [&] {
    auto reply = call_sync(
        io, *client,
        txn({{"/ddprun/j/nodes/c", CompareTarget::CreateRevision, CompareResult::Equal, 0, ""}},
            {PutOp{"/ddprun/j/nodes/c", "c", 0, false}}, {}));
    REQUIRE(reply.ok());
    return decode_txn(*reply)->succeeded;
  };
  CHECK(join());
  CHECK_FALSE(join());

  // etcd's own refusal is reported with its words and code.
  auto bad = call_sync(io, *client, Request{"/v3/kv/range", R"({"key":"@@"})", true});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message, Contains("illegal base64") && Contains("(code 3)"));
  client->close();
}

TEST_CASE("a lease kept alive keeps its keys and an expired one deletes them", "[etcd]") {
  EtcdCluster cluster;
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  boost::asio::io_context io;
  auto client = std::make_shared<Client>(io, settings_for(cluster.members()));
  auto granted = call_sync(io, *client, lease_grant(2));
  REQUIRE(granted.ok());
  auto lease = decode_lease_grant(*granted);
  REQUIRE(lease.ok());
  CHECK(lease->ttl == 2);
  REQUIRE(std::holds_alternative<std::int64_t>(
      put_sync(io, *client, "/ddprun/j/nodes/a", "a", lease->id)));

  Recorder recorder;
  recorder.open(io, *client, "/ddprun/j/");
  std::optional<std::string> lost;
  auto keeper = std::make_shared<LeaseKeeper>(client, lease->id, 2s,
                                              [&](const common::Error& e) { lost = e.message; });
  keeper->start();
  // Twice the TTL with the keeper running: the key stays.
  run_until(
      io, [] { return false; }, 4s);
  CHECK(keeper->renewals() >= 3);
  CHECK_FALSE(lost);
  CHECK(range_sync(io, *client, "/ddprun/j/").kvs.size() == 1);

  // Stopped: etcd deletes the key when the TTL runs out, and the watch shows the delete.
  keeper->stop();
  REQUIRE(run_until(
      io,
      [&] {
        return std::any_of(recorder.events.begin(), recorder.events.end(),
                           [](const Event& e) { return e.type == Event::Type::Delete; });
      },
      15s));
  CHECK(range_sync(io, *client, "/ddprun/j/").kvs.empty());

  // A keeper of a lease that is gone says so.
  auto again = std::make_shared<LeaseKeeper>(client, lease->id, 2s,
                                             [&](const common::Error& e) { lost = e.message; });
  again->start();
  REQUIRE(run_until(
      io, [&] { return lost.has_value(); }, 10s));
  CHECK_THAT(*lost, Contains("expired or was revoked"));
  recorder.watch->cancel();
  client->close();
}

TEST_CASE("a prefix watch sees every put and delete in order", "[etcd]") {
  EtcdCluster cluster;
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  boost::asio::io_context io;
  auto client = std::make_shared<Client>(io, settings_for(cluster.members()));
  auto before = put_sync(io, *client, "/ddprun/j/state", "round 0");
  REQUIRE(std::holds_alternative<std::int64_t>(before));

  // From a revision in the past: the earlier put is delivered too.
  Recorder recorder;
  recorder.open(*client, "/ddprun/j/", std::get<std::int64_t>(before));
  REQUIRE(
      std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/j/state", "round 1")));
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/other", "not seen")));
  auto deleted = call_sync(io, *client, delete_range({"/ddprun/j/state", "", false}));
  REQUIRE(deleted.ok());
  REQUIRE(run_until(
      io, [&] { return recorder.events.size() >= 3; }, 10s));
  REQUIRE(recorder.events.size() == 3);
  CHECK(recorder.events[0].kv.value == "round 0");
  CHECK(recorder.events[1].kv.value == "round 1");
  CHECK(recorder.events[2].type == Event::Type::Delete);
  CHECK(recorder.events[0].kv.mod_revision < recorder.events[1].kv.mod_revision);
  CHECK_FALSE(recorder.saw("/ddprun/other"));
  CHECK(recorder.watch->next_revision() == recorder.events[2].kv.mod_revision + 1);

  // A watch from a compacted revision ends and says so.
  auto compacted =
      cluster.etcdctl({"compact", std::to_string(recorder.watch->next_revision() - 1)});
  INFO(compacted.out << compacted.err);
  REQUIRE(compacted.exit_code == 0);
  Recorder old;
  old.open(*client, "/ddprun/j/", 1);
  REQUIRE(run_until(
      io, [&] { return old.ended.has_value(); }, 10s));
  CHECK_THAT(*old.ended, Contains("revision 1 was compacted") && Contains("read the keys again"));
  recorder.watch->cancel();
  client->close();
}

TEST_CASE("killing the leader: requests fail over and the watch resumes with no event lost",
          "[etcd]") {
  EtcdCluster cluster;
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  const int leader = cluster.leader();
  REQUIRE(leader >= 0);
  // The leader first: the client's connections and its watch are on the member killed.
  std::vector<Member> members = cluster.members();
  std::rotate(members.begin(), members.begin() + leader, members.end());
  boost::asio::io_context io;
  auto client = std::make_shared<Client>(io, settings_for(members));

  Recorder recorder;
  recorder.open(io, *client, "/ddprun/j/");
  REQUIRE(run_until(
      io, [&] { return recorder.watch->next_revision() != 0; }, 10s));

  // Puts one after another, a range beside each; the leader is killed after the tenth.
  constexpr int kPuts = 40;
  std::map<std::string, std::int64_t> applied;  // key -> revision, puts etcd confirmed
  std::vector<std::string> unknown;             // puts whose outcome the client could not know
  int ranges_ok = 0;
  int next = 0;
  int outstanding = 0;
  std::function<void()> send_next = [&] {
    if (next >= kPuts) return;
    const std::string key = "/ddprun/j/k" + std::to_string(next);
    ++next;
    outstanding += 2;
    client->call(put({key, "v", 0, false}), [&, key](Reply reply) {
      --outstanding;
      if (reply) {
        applied[key] = decode_put(*reply)->header.revision;
      } else {
        unknown.push_back(key + ": " + reply.error().message);
      }
      if (next == 10) cluster.kill(leader);
      send_next();
    });
    client->call(range({"/ddprun/j/", prefix_end("/ddprun/j/"), 0, 0, true}), [&](Reply reply) {
      --outstanding;
      if (reply) ++ranges_ok;
    });
  };
  send_next();
  REQUIRE(run_until(
      io, [&] { return next == kPuts && outstanding == 0; }, 120s));
  INFO("not applied: " << unknown.size());
  for (const auto& u : unknown) INFO(u);
  // A put that may have been applied is reported as such, never retried blindly.
  for (const auto& u : unknown) CHECK_THAT(u, Contains("outcome unknown"));
  CHECK(unknown.size() <= 2);
  CHECK(applied.size() + unknown.size() == kPuts);
  CHECK(applied.count("/ddprun/j/k" + std::to_string(kPuts - 1)) == 1);
  CHECK(ranges_ok >= kPuts - 2);
  CHECK_FALSE(cluster.running(leader));

  // Every confirmed put reaches the watch, once, in revision order.
  REQUIRE(run_until(
      io,
      [&] {
        return std::all_of(applied.begin(), applied.end(),
                           [&](const auto& kv) { return recorder.saw(kv.first); });
      },
      30s));
  std::set<std::string> keys;
  for (std::size_t i = 0; i < recorder.events.size(); ++i) {
    if (i > 0) CHECK(recorder.events[i].kv.mod_revision > recorder.events[i - 1].kv.mod_revision);
    CHECK(keys.insert(recorder.events[i].kv.key).second);
  }
  for (const auto& [key, revision] : applied) {
    INFO(key);
    auto it = std::find_if(recorder.events.begin(), recorder.events.end(),
                           [&](const Event& e) { return e.kv.key == key; });
    REQUIRE(it != recorder.events.end());
    CHECK(it->kv.mod_revision == revision);
  }
  // The watch was on the leader: it said where it resumed.
  REQUIRE_FALSE(recorder.notices.empty());
  CHECK_THAT(recorder.notices[0], Contains("resuming on") && Contains("from revision"));
  CHECK_FALSE(recorder.ended);
  recorder.watch->cancel();
  client->close();
}

TEST_CASE("a user and password authenticate and the token goes with every request", "[etcd]") {
  EtcdCluster cluster;
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  {
    auto auth = cluster.enable_auth();
    INFO(auth.out << auth.err);
    REQUIRE(auth.exit_code == 0);
  }
  boost::asio::io_context io;

  ClientSettings with = settings_for(cluster.members());
  with.credentials = Credentials{"ann", "annpw"};
  auto ann = std::make_shared<Client>(io, with);
  Recorder recorder;
  recorder.open(io, *ann, "/ddprun/j/");
  auto revision = put_sync(io, *ann, "/ddprun/j/state", "s");
  INFO((std::holds_alternative<std::string>(revision) ? std::get<std::string>(revision) : ""));
  REQUIRE(std::holds_alternative<std::int64_t>(revision));
  CHECK(range_sync(io, *ann, "/ddprun/j/").kvs.size() == 1);
  REQUIRE(run_until(
      io, [&] { return recorder.saw("/ddprun/j/state"); }, 10s));
  // Outside the role's prefix: refused by etcd, in its words.
  auto outside = put_sync(io, *ann, "/elsewhere", "x");
  REQUIRE(std::holds_alternative<std::string>(outside));
  CHECK_THAT(std::get<std::string>(outside), Contains("permission denied"));

  ClientSettings wrong = settings_for(cluster.members());
  wrong.credentials = Credentials{"ann", "not her password"};
  auto intruder = std::make_shared<Client>(io, wrong);
  auto refused = put_sync(io, *intruder, "/ddprun/j/state", "x");
  REQUIRE(std::holds_alternative<std::string>(refused));
  CHECK_THAT(std::get<std::string>(refused),
             Contains("etcd authentication as ann failed") &&
                 Contains("authentication failed, invalid user ID or password"));

  auto anonymous = std::make_shared<Client>(io, settings_for(cluster.members()));
  auto nobody = put_sync(io, *anonymous, "/ddprun/j/state", "x");
  REQUIRE(std::holds_alternative<std::string>(nobody));
  CHECK_THAT(std::get<std::string>(nobody), Contains("user name is empty"));
  recorder.watch->cancel();
  for (auto& c : {ann, intruder, anonymous}) c->close();
}

TEST_CASE("an expired token is renewed and the request sent again", "[etcd]") {
  EtcdCluster cluster(3, std::nullopt, {"--auth-token-ttl", "1"});
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"user", "add", "root:rootpw"}, {"auth", "enable"}}) {
    auto r = cluster.etcdctl(args);
    INFO(args[0] << " " << args[1] << ": " << r.out << r.err);
    REQUIRE(r.exit_code == 0);
  }
  boost::asio::io_context io;
  ClientSettings settings = cluster.client_settings();
  settings.credentials = Credentials{"root", "rootpw"};
  auto client = std::make_shared<Client>(io, settings);
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/j/a", "1")));
  // Idle past the token's TTL (1 s): etcd forgets it, and the next request is refused with
  // "invalid auth token" unless the client authenticates again.
  run_until(
      io, [] { return false; }, 3s);
  auto again = put_sync(io, *client, "/ddprun/j/b", "2");
  INFO((std::holds_alternative<std::string>(again) ? std::get<std::string>(again) : ""));
  CHECK(std::holds_alternative<std::int64_t>(again));
  // A watch opened with the renewed token works too.
  Recorder recorder;
  recorder.open(io, *client, "/ddprun/j/");
  run_until(
      io, [] { return false; }, 3s);
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/j/c", "3")));
  REQUIRE(run_until(
      io, [&] { return recorder.saw("/ddprun/j/c"); }, 10s));
  recorder.watch->cancel();
  client->close();
}

TEST_CASE("every member down: the client says so and recovers when they are back", "[etcd]") {
  EtcdCluster cluster;
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  boost::asio::io_context io;
  auto client = std::make_shared<Client>(io, settings_for(cluster.members()));
  Recorder recorder;
  recorder.open(io, *client, "/ddprun/j/");
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/j/before", "1")));
  REQUIRE(run_until(
      io, [&] { return recorder.saw("/ddprun/j/before"); }, 10s));

  for (int i = 0; i < cluster.size(); ++i) cluster.kill(i);
  auto down = call_sync(io, *client, range({"/ddprun/j/", prefix_end("/ddprun/j/"), 0, 0, false}));
  REQUIRE_FALSE(down.ok());
  CHECK_THAT(down.error().message, Contains("every member failed (3)") &&
                                       Contains("connection refused") &&
                                       Contains(cluster.members()[0].text()));
  // The watch keeps trying and says where.
  REQUIRE(run_until(
      io, [&] { return recorder.notices.size() >= 3; }, 20s));
  CHECK_FALSE(recorder.ended);

  for (int i = 0; i < cluster.size(); ++i) cluster.start(i);
  REQUIRE(cluster.wait_ready());
  auto after = put_sync(io, *client, "/ddprun/j/after", "2");
  INFO((std::holds_alternative<std::string>(after) ? std::get<std::string>(after) : ""));
  REQUIRE(std::holds_alternative<std::int64_t>(after));
  REQUIRE(run_until(
      io, [&] { return recorder.saw("/ddprun/j/after"); }, 30s));
  CHECK(recorder.events.size() == 2);
  CHECK_FALSE(recorder.ended);
  recorder.watch->cancel();
  client->close();
}

using testing::EtcdPki;

TEST_CASE("over TLS with client certificates the client works and wrong peers are refused",
          "[etcd]") {
  EtcdPki pki;
  EtcdCluster cluster(
      3, testing::EtcdTls{pki.path("server.pem"), pki.path("server.key"), pki.path("ca.pem"),
                          pki.path("ca.pem"), pki.path("client.pem"), pki.path("client.key")});
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  boost::asio::io_context io;
  auto client = std::make_shared<Client>(io, cluster.client_settings());
  Recorder recorder;
  recorder.open(io, *client, "/ddprun/j/");
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/j/state", "tls")));
  CHECK(range_sync(io, *client, "/ddprun/j/").kvs.at(0).value == "tls");
  REQUIRE(run_until(
      io, [&] { return recorder.saw("/ddprun/j/state"); }, 10s));

  // A CA that did not sign the members' certificate.
  ClientSettings stranger = cluster.client_settings();
  stranger.tls = *rdzv::make_client_tls({pki.path("other-ca.pem"), "", ""}, "tls_");
  auto wrong_ca = std::make_shared<Client>(io, stranger);
  auto refused = put_sync(io, *wrong_ca, "/ddprun/j/state", "x");
  REQUIRE(std::holds_alternative<std::string>(refused));
  CHECK_THAT(std::get<std::string>(refused), Contains("every member failed") &&
                                                 Contains("TLS handshake failed") &&
                                                 Contains("certificate"));

  // No TLS at all against members that serve it: named as such.
  ClientSettings plain = cluster.client_settings();
  plain.tls = nullptr;
  auto plain_client = std::make_shared<Client>(io, plain);
  auto told = call_sync(io, *plain_client, range({"/ddprun/j/state", "", 0, 0, false}));
  REQUIRE_FALSE(told.ok());
  CHECK_THAT(told.error().message,
             Contains("every member failed") && Contains("if the member serves TLS, give tls_ca"));
  recorder.watch->cancel();
  for (auto& c : {client, wrong_ca, plain_client}) c->close();
}

TEST_CASE("a member that loses its leader ends the watch there and the watch resumes", "[etcd]") {
  EtcdCluster cluster;
  INFO(cluster.logs());
  REQUIRE(cluster.wait_ready());
  boost::asio::io_context io;
  ClientSettings settings = cluster.client_settings();
  settings.attempt_timeout = 2s;
  auto client = std::make_shared<Client>(io, settings);
  Recorder recorder;
  recorder.open(io, *client, "/ddprun/j/");  // on member 0
  REQUIRE(std::holds_alternative<std::int64_t>(put_sync(io, *client, "/ddprun/j/a", "1")));
  REQUIRE(run_until(
      io, [&] { return recorder.saw("/ddprun/j/a"); }, 10s));

  // The other two stop answering: member 0 is alone, without a leader. It must say so rather
  // than keep a silent stream, and a request must not hang on it.
  cluster.pause(1);
  cluster.pause(2);
  REQUIRE(run_until(
      io, [&] { return !recorder.notices.empty(); }, 20s));
  CHECK_THAT(recorder.notices[0], Contains(cluster.members()[0].text()));
  auto alone = call_sync(io, *client, range({"/ddprun/j/", prefix_end("/ddprun/j/"), 0, 0, false}));
  REQUIRE_FALSE(alone.ok());
  CHECK_THAT(alone.error().message, Contains("every member failed (3)"));

  cluster.resume(1);
  cluster.resume(2);
  REQUIRE(cluster.wait_ready());
  auto after = put_sync(io, *client, "/ddprun/j/b", "2");
  INFO((std::holds_alternative<std::string>(after) ? std::get<std::string>(after) : ""));
  REQUIRE(std::holds_alternative<std::int64_t>(after));
  REQUIRE(run_until(
      io, [&] { return recorder.saw("/ddprun/j/b"); }, 30s));
  CHECK(recorder.events.size() == 2);
  CHECK_FALSE(recorder.ended);
  recorder.watch->cancel();
  client->close();
}
