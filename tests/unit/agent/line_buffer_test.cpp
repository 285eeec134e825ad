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
