#include "common/shared_string.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

using namespace ddprun::common;

TEST_CASE("a shared string's copies hold one allocation that outlives the original",
          "[common][unit]") {
  std::optional<SharedString> original(SharedString("host:42:0123456789abcdef"));
  const SharedString copy = *original;
  CHECK(copy.shares_with(*original));
  const std::string_view view = copy;
  CHECK(view.data() == original->view().data());
  original.reset();
  CHECK(copy.view() == "host:42:0123456789abcdef");
  CHECK(copy.size() == 24);

  // Equal characters in another allocation: equal, but not shared.
  const SharedString other("host:42:0123456789abcdef");
  CHECK(other == copy);
  CHECK_FALSE(other.shares_with(copy));

  SharedString moved = std::move(other);
  CHECK(moved == copy);
  SharedString assigned;
  assigned = moved;
  CHECK(assigned.shares_with(moved));
  assigned = SharedString("b");
  CHECK(assigned.view() == "b");
  CHECK(moved.view() == "host:42:0123456789abcdef");
}

TEST_CASE("an empty shared string holds nothing and reads as an empty view", "[common][unit]") {
  const SharedString empty;
  CHECK(empty.empty());
  CHECK(empty.size() == 0);
  CHECK(empty.view().empty());
  CHECK(empty.str().empty());
  CHECK(SharedString("").empty());
  CHECK(empty == SharedString(""));
  CHECK(empty == std::string_view());
}

TEST_CASE("shared strings order, compare and hash as their characters", "[common][unit]") {
  std::map<SharedString, int, std::less<>> table;
  table.emplace(SharedString("b"), 2);
  table.emplace(SharedString("a"), 1);
  table.emplace(SharedString("ab"), 3);
  std::vector<std::string> order;
  for (const auto& [key, value] : table) order.push_back(key.str());
  CHECK(order == std::vector<std::string>{"a", "ab", "b"});
  // Found by any string, without making a SharedString to look it up.
  CHECK(table.find(std::string("ab"))->second == 3);
  CHECK(table.find(std::string_view("b"))->second == 2);
  CHECK(table.find("c") == table.end());

  CHECK(SharedString("a") < SharedString("b"));
  CHECK(SharedString("a") == std::string("a"));
  CHECK(std::string("a") == SharedString("a"));
  CHECK(SharedString("a") != std::string_view("b"));
  CHECK(std::hash<SharedString>()(SharedString("node")) == std::hash<std::string_view>()("node"));
  std::unordered_set<SharedString> set{SharedString("x"), SharedString("x"), SharedString("y")};
  CHECK(set.size() == 2);
}

TEST_CASE("copies of a shared string may live and die on several threads", "[common][unit]") {
  const SharedString shared("shared by threads");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&shared] {
      for (int i = 0; i < 10000; ++i) {
        SharedString copy = shared;
        if (copy.size() != shared.size()) std::abort();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(shared.view() == "shared by threads");
}
