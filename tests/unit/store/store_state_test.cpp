#include "store/store_state.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

using namespace ddprun::store;

namespace {

Request req(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
            std::int64_t delta = 0) {
  return Request{op, std::move(keys), std::move(values), delta, 0};
}

/// The bytes sent to `conn`, concatenated.
std::string to(const Effects& e, ConnId conn) {
  std::string out;
  for (const auto& [c, bytes] : e.sends)
    if (c == conn) out += *bytes;
  return out;
}

}  // namespace

TEST_CASE("a set key is read back and an absent key reads as empty", "[store][unit]") {
  StoreState s;
  CHECK(s.apply(1, req(Op::Set, {"/k"}, {"v"})).sends.empty());
  CHECK(to(s.apply(1, req(Op::Get, {"/k"})), 1) == encode_bytes("v"));
  CHECK(to(s.apply(1, req(Op::Get, {"/none"})), 1) == encode_bytes(""));
  CHECK(to(s.apply(1, req(Op::NumKeys)), 1) == encode_i64(1));
}

TEST_CASE("add keeps a decimal counter that the next add continues", "[store][unit]") {
  StoreState s;
  CHECK(to(s.apply(1, req(Op::Add, {"/cnt"}, {}, 5)), 1) == encode_i64(5));
  CHECK(to(s.apply(1, req(Op::Add, {"/cnt"}, {}, -2)), 1) == encode_i64(3));
  CHECK(to(s.apply(1, req(Op::Get, {"/cnt"})), 1) == encode_bytes("3"));
}

TEST_CASE("add on a value that is not a number closes that connection", "[store][unit]") {
  StoreState s;
  s.apply(1, req(Op::Set, {"/k"}, {"abc"}));
  const Effects e = s.apply(1, req(Op::Add, {"/k"}, {}, 1));
  CHECK(e.sends.empty());
  REQUIRE(e.close);
  CHECK(*e.close == "ADD on a key whose value is not a decimal number");
}

TEST_CASE("a wait is answered when the last of its keys appears", "[store][unit]") {
  StoreState s;
  CHECK(s.apply(2, req(Op::Wait, {"/a", "/b"})).sends.empty());
  CHECK(s.parked() == 1);
  CHECK(to(s.apply(1, req(Op::Set, {"/a"}, {"1"})), 2).empty());
  CHECK(to(s.apply(1, req(Op::Add, {"/b"}, {}, 1)), 2) == encode_u8(0));
  CHECK(s.parked() == 0);
  // Keys already there: answered at once.
  CHECK(to(s.apply(2, req(Op::Wait, {"/a"})), 2) == encode_u8(0));
}

TEST_CASE("check tells whether every key is present", "[store][unit]") {
  StoreState s;
  s.apply(1, req(Op::Set, {"/a"}, {""}));
  CHECK(to(s.apply(1, req(Op::Check, {"/a"})), 1) == encode_u8(0));
  CHECK(to(s.apply(1, req(Op::Check, {"/a", "/b"})), 1) == encode_u8(1));
  CHECK(to(s.apply(1, req(Op::Check, {})), 1) == encode_u8(0));
}

TEST_CASE("compare_set follows torch on missing and present keys", "[store][unit]") {
  StoreState s;
  // Missing with a non-empty expectation: the expectation comes back and nothing is created.
  CHECK(to(s.apply(1, req(Op::CompareSet, {"/k"}, {"x", "y"})), 1) == encode_bytes("x"));
  CHECK(s.size() == 0);
  // Missing with an empty expectation: created.
  CHECK(to(s.apply(1, req(Op::CompareSet, {"/k"}, {"", "y"})), 1) == encode_bytes("y"));
  // Present: swapped when it matches, else the current value.
  CHECK(to(s.apply(1, req(Op::CompareSet, {"/k"}, {"y", "z"})), 1) == encode_bytes("z"));
  CHECK(to(s.apply(1, req(Op::CompareSet, {"/k"}, {"y", "w"})), 1) == encode_bytes("z"));
}

TEST_CASE("compare_set that creates a key wakes its waiters", "[store][unit]") {
  StoreState s;
  s.apply(2, req(Op::Wait, {"/k"}));
  CHECK(to(s.apply(1, req(Op::CompareSet, {"/k"}, {"", "v"})), 2) == encode_u8(0));
}

TEST_CASE("delete answers whether the key was there", "[store][unit]") {
  StoreState s;
  s.apply(1, req(Op::Set, {"/k"}, {"v"}));
  CHECK(to(s.apply(1, req(Op::DeleteKey, {"/k"})), 1) == encode_i64(1));
  CHECK(to(s.apply(1, req(Op::DeleteKey, {"/k"})), 1) == encode_i64(0));
  CHECK(s.bytes() == 0);
}

TEST_CASE("a 1.13 watcher gets created updated and deleted pushes", "[store][unit]") {
  StoreState s;
  CHECK(to(s.apply(9, req(Op::WatchKey, {"/wk"})), 9) == encode_u8(3));
  CHECK(to(s.apply(1, req(Op::Add, {"/wk"}, {}, 7)), 9) ==
        encode_watch_push(WatchEvent::Created, "/wk", "", "7"));
  CHECK(to(s.apply(1, req(Op::Set, {"/wk"}, {"b"})), 9) ==
        encode_watch_push(WatchEvent::Updated, "/wk", "7", "b"));
  CHECK(to(s.apply(1, req(Op::DeleteKey, {"/wk"})), 9) ==
        encode_watch_push(WatchEvent::Deleted, "/wk", "b", ""));
  s.disconnect(9);
  CHECK(to(s.apply(1, req(Op::Set, {"/wk"}, {"c"})), 9).empty());
}

TEST_CASE("a change pushed to forty watchers is held once, not forty times", "[store][unit]") {
  StoreState s;
  for (ConnId w = 10; w < 50; ++w) s.apply(w, req(Op::WatchKey, {"/big"}));
  const std::string value(1 << 20, 'v');
  for (const Op op : {Op::Set, Op::Set, Op::DeleteKey}) {
    const Effects e = s.apply(1, op == Op::Set ? req(op, {"/big"}, {value}) : req(op, {"/big"}));
    std::set<const std::string*> buffers;
    std::size_t pushes = 0;
    for (const auto& [c, bytes] : e.sends) {
      if (c < 10) continue;
      ++pushes;
      buffers.insert(bytes.get());
    }
    CHECK(pushes == 40);
    CHECK(buffers.size() == 1);  // one buffer, shared by the forty sends
  }
}

TEST_CASE("cancel_wait always answers 1 and a cancelled wait is never answered", "[store][unit]") {
  StoreState s;
  CHECK(to(s.apply(2, req(Op::CancelWait)), 2) == encode_u8(1));
  s.apply(2, req(Op::Wait, {"/late"}));
  CHECK(to(s.apply(2, req(Op::CancelWait)), 2) == encode_u8(1));
  CHECK(s.parked() == 0);
  CHECK(to(s.apply(1, req(Op::Set, {"/late"}, {"v"})), 2).empty());
}

TEST_CASE("a closed connection's wait is forgotten", "[store][unit]") {
  StoreState s;
  s.apply(2, req(Op::Wait, {"/k"}));
  s.disconnect(2);
  CHECK(s.parked() == 0);
  CHECK(s.apply(1, req(Op::Set, {"/k"}, {"v"})).sends.empty());
}

TEST_CASE("append multi_set and multi_get work on the shared keys", "[store][unit]") {
  StoreState s;
  s.apply(1, req(Op::Append, {"/k"}, {"ab"}));
  s.apply(1, req(Op::Append, {"/k"}, {"cd"}));
  s.apply(1, req(Op::MultiSet, {"/x", "/y"}, {"1", "2"}));
  CHECK(to(s.apply(1, req(Op::MultiGet, {"/k", "/y", "/none"})), 1) ==
        encode_bytes("abcd") + encode_bytes("2") + encode_bytes(""));
}

TEST_CASE("queues pop in order and count as present for waits", "[store][unit]") {
  StoreState s;
  s.apply(2, req(Op::Wait, {"/q"}));
  CHECK(to(s.apply(1, req(Op::QueuePush, {"/q"}, {"a"})), 2) == encode_u8(0));
  s.apply(1, req(Op::QueuePush, {"/q"}, {"b"}));
  CHECK(to(s.apply(1, req(Op::QueueLen, {"/q"})), 1) == encode_i64(2));
  CHECK(to(s.apply(1, req(Op::QueuePop, {"/q"})), 1) == encode_i64(2) + encode_bytes("a"));
  CHECK(to(s.apply(1, req(Op::QueuePop, {"/q"})), 1) == encode_i64(1) + encode_bytes("b"));
  CHECK(to(s.apply(1, req(Op::QueuePop, {"/q"})), 1) == encode_i64(0));
}

TEST_CASE("ping echoes its nonce and validate gets no reply", "[store][unit]") {
  StoreState s;
  CHECK(to(s.apply(1, Request{Op::Ping, {}, {}, 0, 77}), 1) == encode_u32(77));
  CHECK(s.apply(1, Request{Op::Validate, {}, {}, 0, kValidationMagic}).sends.empty());
}

TEST_CASE("a new round clears every key and a later wait parks again", "[store][unit]") {
  StoreState s;
  s.apply(1, req(Op::Add, {"init/"}, {}, 2));
  s.apply(1, req(Op::Set, {"//worker/attempt_0/default_pg/0/0/rank_1"}, {"old address"}));
  s.apply(1, req(Op::QueuePush, {"/q"}, {"x"}));
  s.clear();
  CHECK(s.size() == 0);
  CHECK(s.bytes() == 0);
  // The next group's rank 0 waits for the address its peer has not published yet.
  CHECK(s.apply(2, req(Op::Wait, {"//worker/attempt_0/default_pg/0/0/rank_1"})).sends.empty());
  CHECK(to(s.apply(1, req(Op::QueueLen, {"/q"})), 1) == encode_i64(0));
}

TEST_CASE("waits and watches beyond the parked budget close their connection, and the rest stay",
          "[store][unit][security]") {
  StoreState s(1 << 20);  // 1 MiB
  // A WAIT on 100,000 missing keys would hold about 20 MB: refused, nothing kept.
  std::vector<std::string> keys;
  for (int i = 0; i < 100'000; ++i) keys.push_back("/k" + std::to_string(i));
  const Effects big = s.apply(7, req(Op::Wait, keys));
  REQUIRE(big.close);
  CHECK(big.close->find("parked waits and watches would take more than 1048576 bytes") !=
        std::string::npos);
  CHECK(s.parked_bytes() == 0);
  CHECK(s.parked() == 0);
  // Small waits and watches are kept and counted; they are released as keys appear, on
  // cancel and on disconnect, down to nothing.
  CHECK(s.apply(1, req(Op::Wait, {"/a", "/b"})).sends.empty());
  CHECK(s.apply(2, req(Op::Wait, {"/a"})).sends.empty());
  CHECK_FALSE(s.apply(3, req(Op::WatchKey, {"/a"})).close);
  CHECK(s.parked_bytes() ==
        3 * 2 * (2 + StoreState::kParkedEntryBytes) + (2 + StoreState::kParkedEntryBytes));
  s.apply(9, req(Op::Set, {"/a"}, {"v"}));  // wakes 2, leaves 1 waiting on /b
  CHECK(s.parked_bytes() ==
        2 * (2 + StoreState::kParkedEntryBytes) + (2 + StoreState::kParkedEntryBytes));
  s.apply(1, req(Op::CancelWait));
  s.disconnect(3);
  CHECK(s.parked_bytes() == 0);
  // Watches count too: 20,000 distinct watched keys go over 1 MiB.
  bool closed = false;
  for (int i = 0; i < 20'000 && !closed; ++i)
    closed = s.apply(4, req(Op::WatchKey, {"/w" + std::to_string(i)})).close.has_value();
  CHECK(closed);
  CHECK(s.parked_bytes() <= (1u << 20));
  s.disconnect(4);
  CHECK(s.parked_bytes() == 0);
}
