#include "agent/line_buffer.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;
using Lines = std::vector<std::string>;

TEST_CASE("lines split across reads are joined before they are emitted", "[agent][unit]") {
  LineBuffer b;
  CHECK(b.feed("hel").empty());
  CHECK(b.feed("lo\nwor") == Lines{"hello"});
  CHECK(b.feed("ld\n\n") == Lines{"world", ""});
}

TEST_CASE("a partial last line is flushed at the end of the stream", "[agent][unit]") {
  LineBuffer b;
  b.feed("done\nno newline");
  CHECK(b.finish() == Lines{"no newline"});
  CHECK(b.finish().empty());
}

TEST_CASE("an endless line is cut into bounded pieces", "[agent][unit]") {
  LineBuffer b(4);
  CHECK(b.feed("abcdefghij") == Lines{"abcd", "efgh"});
  CHECK(b.finish() == Lines{"ij"});
}

TEST_CASE("console prefixes follow TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE as torchrun expands it",
          "[agent][unit]") {
  CHECK(console_prefix("", "default", 5, 1) == "[default1]:");
  CHECK(console_prefix("[rank${rank}]: ", "default", 5, 1) == "[rank5]: ");
  CHECK(console_prefix("$role_name/$local_rank|${rank}:", "trainer", 7, 3) == "trainer/3|7:");
  // Python's safe_substitute: "$$" is "$"; unknown or malformed placeholders stay as written.
  CHECK(console_prefix("$$${host}$ ${rank", "r", 0, 0) == "$${host}$ ${rank");
  CHECK(console_prefix("${rank}$", "r", 2, 0) == "2$");
}
