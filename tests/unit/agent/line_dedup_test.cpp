#include "agent/line_dedup.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> texts(const std::vector<ConsoleLine>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines) out.push_back(l.text);
  return out;
}

const ddprun::common::TimePoint t0{std::chrono::seconds(100)};

}  // namespace

TEST_CASE("rank lists are written as ranges of three or more", "[agent][unit]") {
  CHECK(rank_ranges({0, 1, 2, 3, 6}) == "0-3,6");
  CHECK(rank_ranges({5, 1, 0}) == "0,1,5");
  CHECK(rank_ranges({7}) == "7");
  CHECK(rank_ranges({0, 2, 3, 4, 6, 7}) == "0,2-4,6,7");
}

TEST_CASE("dedup: a line several ranks print within the window shows once", "[agent][unit]") {
  LineDedup d(1s, "", "default");
  for (int rank = 0; rank < 8; ++rank)
    CHECK(d.offer(1, rank + 8, rank, "loss 0.25", t0 + rank * 10ms).empty());
  CHECK(d.next_deadline() == t0 + 1s);
  CHECK(d.due(t0 + 999ms).empty());
  CHECK(texts(d.due(t0 + 1s)) == std::vector<std::string>{"[default0-7]:loss 0.25\n"});
  CHECK_FALSE(d.next_deadline());
}

TEST_CASE("dedup: the prefix template names global and local ranks", "[agent][unit]") {
  LineDedup d(1s, "[rank${rank}|${local_rank}]: ", "default");
  d.offer(1, 4, 0, "x", t0);
  d.offer(1, 5, 1, "x", t0);
  d.offer(1, 7, 3, "x", t0);
  CHECK(texts(d.flush()) == std::vector<std::string>{"[rank4,5,7|0,1,3]: x\n"});
}

TEST_CASE("dedup: lines keep the order they were first printed in", "[agent][unit]") {
  LineDedup d(1s, "", "default");
  d.offer(1, 0, 0, "a", t0);
  d.offer(1, 0, 0, "b", t0 + 100ms);
  d.offer(1, 1, 1, "a", t0 + 200ms);
  d.offer(1, 1, 1, "c", t0 + 300ms);
  CHECK(texts(d.due(t0 + 1100ms)) ==
        std::vector<std::string>{"[default0,1]:a\n", "[default0]:b\n"});
  CHECK(texts(d.flush()) == std::vector<std::string>{"[default1]:c\n"});
}

TEST_CASE("dedup: one rank printing a line twice shows it twice", "[agent][unit]") {
  LineDedup d(1s, "", "default");
  d.offer(1, 0, 0, "step", t0);
  d.offer(1, 0, 0, "step", t0 + 1ms);
  d.offer(1, 1, 1, "step", t0 + 2ms);  // joins the newer one
  CHECK(texts(d.flush()) == std::vector<std::string>{"[default0]:step\n", "[default0,1]:step\n"});
}

TEST_CASE("dedup: stdout and stderr are never merged", "[agent][unit]") {
  LineDedup d(1s, "", "default");
  d.offer(1, 0, 0, "same", t0);
  d.offer(2, 1, 1, "same", t0);
  const auto out = d.flush();
  REQUIRE(out.size() == 2);
  CHECK(out[0].fd == 1);
  CHECK(out[1].fd == 2);
}

TEST_CASE("dedup: a line offered after its window starts a new one", "[agent][unit]") {
  LineDedup d(1s, "", "default");
  d.offer(1, 0, 0, "tick", t0);
  const auto shown = d.offer(1, 1, 1, "tick", t0 + 2s);
  CHECK(texts(shown) == std::vector<std::string>{"[default0]:tick\n"});
  CHECK(texts(d.flush()) == std::vector<std::string>{"[default1]:tick\n"});
}

TEST_CASE("dedup: beyond its bound the oldest waiting line is shown early", "[agent][unit]") {
  LineDedup d(1s, "", "default", 2);
  d.offer(1, 0, 0, "a", t0);
  d.offer(1, 0, 0, "b", t0);
  CHECK(texts(d.offer(1, 0, 0, "c", t0)) == std::vector<std::string>{"[default0]:a\n"});
  // "a" is gone: another rank's "a" starts a fresh line.
  d.offer(1, 1, 1, "a", t0);
  CHECK(texts(d.flush()) == std::vector<std::string>{"[default0]:c\n", "[default1]:a\n"});
}

TEST_CASE("dedup: long lines wait at most 4 MiB together, then the oldest are shown early",
          "[agent][unit][security]") {
  LineDedup d(60s, "", "default");
  // 300 distinct lines of 64 KiB (the pieces a worker's 300 MB line is cut into) within the
  // window: only the newest 4 MiB of them wait.
  std::size_t shown = 0;
  for (int i = 0; i < 300; ++i)
    shown += d.offer(1, 0, 0, std::to_string(i) + std::string(64 * 1024 - 8, 'x'), t0).size();
  CHECK(shown >= 300 - 64);
  const auto rest = d.flush();
  CHECK(shown + rest.size() == 300);
  CHECK(rest.size() <= 64);
}
