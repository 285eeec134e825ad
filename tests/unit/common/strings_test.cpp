#include "common/strings.h"

#include <catch2/catch.hpp>

#include "common/signals.h"

using namespace ddprun::common;

TEST_CASE("split keeps empty fields so that malformed lists can be reported", "[common][unit]") {
  CHECK(split("a,,b", ',') == std::vector<std::string>{"a", "", "b"});
  CHECK(split("", ',') == std::vector<std::string>{""});
  CHECK(split("x", ',') == std::vector<std::string>{"x"});
}

TEST_CASE("parse_int accepts whole integers only", "[common][unit]") {
  CHECK(parse_int("42") == 42);
  CHECK(parse_int("+7") == 7);
  CHECK(parse_int("-3") == -3);
  CHECK_FALSE(parse_int("4x"));
  CHECK_FALSE(parse_int(""));
  CHECK_FALSE(parse_int("99999999999999999999999"));
}

TEST_CASE("parse_double refuses junk and infinities", "[common][unit]") {
  CHECK(parse_double("0.5") == Approx(0.5));
  CHECK_FALSE(parse_double("1.5s"));
  CHECK_FALSE(parse_double("inf"));
}

TEST_CASE("signals are parsed by name, short name or number", "[common][unit]") {
  CHECK(parse_signal("SIGTERM") == 15);
  CHECK(parse_signal("term") == 15);
  CHECK(parse_signal("9") == 9);
  CHECK(parse_signal(" SIGUSR1 ") == 10);
  CHECK_FALSE(parse_signal("SIGNOPE"));
  CHECK_FALSE(parse_signal("0"));
  CHECK(signal_name(9) == "SIGKILL");
  CHECK(signal_name(200) == "SIG200");
}

TEST_CASE("join puts the separator between items only", "[common][unit]") {
  CHECK(join({}, ", ").empty());
  CHECK(join({"a"}, ", ") == "a");
  CHECK(join({"a", "", "b"}, ",") == "a,,b");
}

TEST_CASE("parse_bool takes 1, 0, true and false in any case and nothing else", "[common][unit]") {
  CHECK(parse_bool(" TRUE ") == true);
  CHECK(parse_bool("1") == true);
  CHECK(parse_bool("False") == false);
  CHECK(parse_bool("0") == false);
  CHECK_FALSE(parse_bool("yes"));
  CHECK_FALSE(parse_bool(""));
}

TEST_CASE("printable escapes what a terminal would obey and keeps other text", "[common][unit]") {
  CHECK(printable("job-1") == "job-1");
  CHECK(printable("a\x1b[2Jb\x7f") == "a\\x1b[2Jb\\x7f");
  CHECK(printable("\xc2\x9b"
                  "31m") == "\\u009b31m");                                     // C1 CSI
  CHECK(printable("caf\xc3\xa9 \xe2\x82\xac") == "caf\xc3\xa9 \xe2\x82\xac");  // é, €: kept
  // Bidirectional controls: RLO (U+202E), LRI (U+2066), PDI (U+2069), RLM (U+200F), ALM.
  CHECK(printable("job\xe2\x80\xaegpj.exe") == "job\\u202egpj.exe");
  CHECK(printable("\xe2\x81\xa6x\xe2\x81\xa9") == "\\u2066x\\u2069");
  CHECK(printable("a\xe2\x80\x8f"
                  "b\xd8\x9c") == "a\\u200fb\\u061c");
  // Neighbours that are not controls stay: U+2029 (paragraph separator is e2 80 a9), U+2070.
  CHECK(printable("\xe2\x80\xa9\xe2\x81\xb0") == "\xe2\x80\xa9\xe2\x81\xb0");
  // A cut-off sequence at the end is left as it is.
  CHECK(printable("x\xe2\x80") == "x\xe2\x80");
}

TEST_CASE("cut_utf8 shortens text, never inside a character", "[common][unit]") {
  std::string ascii = "abcdef";
  CHECK(ddprun::common::cut_utf8(ascii, 4));
  CHECK(ascii == "abcd");
  std::string short_enough = "abc";
  CHECK_FALSE(ddprun::common::cut_utf8(short_enough, 3));
  CHECK(short_enough == "abc");
  std::string accented = "ab\xc3\xa9z";  // "abéz": é is 2 bytes
  CHECK(ddprun::common::cut_utf8(accented, 3));
  CHECK(accented == "ab");                        // not "ab\xc3"
  std::string euro = "\xe2\x82\xac\xe2\x82\xac";  // two 3-byte characters
  CHECK(ddprun::common::cut_utf8(euro, 5));
  CHECK(euro == "\xe2\x82\xac");
}
