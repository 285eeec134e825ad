#include "agent/line_buffer.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;
using Pieces = std::vector<LinePiece>;

LinePiece line(std::string text) { return {std::move(text), true}; }
LinePiece part(std::string text) { return {std::move(text), false}; }

TEST_CASE("lines split across reads are joined before they are emitted", "[agent][unit]") {
  LineBuffer b;
  CHECK(b.feed("hel").empty());
  CHECK(b.feed("lo\nwor") == Pieces{line("hello")});
  CHECK(b.feed("ld\n\n") == Pieces{line("world"), line("")});
}

TEST_CASE("a partial last line is flushed at the end of the stream, as a part of a line",
          "[agent][unit]") {
  LineBuffer b;
  b.feed("done\nno newline");
  CHECK(b.finish() == Pieces{part("no newline")});
  CHECK(b.finish().empty());
}

TEST_CASE("an endless line is cut into bounded parts, not into lines", "[agent][unit]") {
  LineBuffer b(4);
  CHECK(b.feed("abcdefghij") == Pieces{part("abcd"), part("efgh")});
  CHECK(b.feed("k\n") == Pieces{line("ijk")});
  CHECK(b.finish().empty());
}

TEST_CASE("a progress line is given out at the end of each read, up to its newline",
          "[agent][unit]") {
  LineBuffer b;
  // tqdm writes "\r" and the bar, with no newline until it closes.
  CHECK(b.feed("\r 10%|#") == Pieces{part("\r 10%|#")});
  CHECK(b.feed(" ") == Pieces{part(" ")});  // still the same line: shown as it comes
  CHECK(b.feed("\r 20%|##\r100%|###|\nnext") == Pieces{line("\r 20%|##\r100%|###|")});
  // After the newline an ordinary line waits for its own.
  CHECK(b.feed(" line").empty());
  CHECK(b.feed("\r\n") == Pieces{line("next line\r")});
  // A "\r" that ends a read waits for what follows: the end of a CRLF line, or a redraw.
  CHECK(b.feed("crlf\r").empty());
  CHECK(b.feed("\n") == Pieces{line("crlf\r")});
  CHECK(b.feed("\r 10%\r") == Pieces{part("\r 10%")});
  CHECK(b.feed(" 20%") == Pieces{part("\r 20%")});
  CHECK(b.finish().empty());
}

TEST_CASE("the pieces and their newlines are the bytes as written", "[agent][unit]") {
  LineBuffer b(5);
  const std::string input = "ab\rcd\nlonger than five\n\r\r\nend";
  std::string out;
  for (std::size_t i = 0; i < input.size(); i += 3)
    for (const LinePiece& p : b.feed(std::string_view(input).substr(i, 3)))
      out += p.text + (p.ends_line ? "\n" : "");
  for (const LinePiece& p : b.finish()) out += p.text + (p.ends_line ? "\n" : "");
  CHECK(out == input);
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

TEST_CASE("a part of a line held is given out on request, a last carriage return kept",
          "[agent][unit]") {
  LineBuffer buf;
  CHECK_FALSE(buf.holds());
  CHECK(buf.give_held().empty());
  CHECK(buf.feed("(Pdb) ").empty());  // a prompt: held until asked for, or until its line ends
  CHECK(buf.holds());
  CHECK(buf.give_held() == std::vector<LinePiece>{{"(Pdb) ", false}});
  CHECK_FALSE(buf.holds());
  CHECK(buf.feed("p x\n") == std::vector<LinePiece>{{"p x", true}});
  // A '\r' that ends what is held waits for the next byte, which may make it "\r\n".
  CHECK(buf.feed("name?\r").empty());
  CHECK(buf.give_held() == std::vector<LinePiece>{{"name?", false}});
  CHECK_FALSE(buf.holds());
  CHECK(buf.feed("\n") == std::vector<LinePiece>{{"\r", true}});
  // Joined again, the pieces are the bytes.
  CHECK(buf.finish().empty());
}
