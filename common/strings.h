#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::common {

/// Splits on every occurrence of sep; "a,,b" gives {"a", "", "b"}, "" gives {""}.
std::vector<std::string> split(std::string_view text, char sep);
/// Joins with sep between items: {"a", "b"} and ", " give "a, b".
std::string join(const std::vector<std::string>& items, std::string_view sep);
/// Removes leading and trailing ASCII whitespace.
std::string trim(std::string_view text);
/// Parses a whole string as a base-10 int; nullopt on any junk, sign errors or overflow.
std::optional<long long> parse_int(std::string_view text);
/// Parses a whole string as a finite double; nullopt on junk.
std::optional<double> parse_double(std::string_view text);
/// 1/0/true/false (any case, surrounding blanks ignored), as PET_ switches and --rdzv_conf
/// is_host take them; nullopt for anything else.
std::optional<bool> parse_bool(std::string_view text);
/// The depth at which `text` (JSON, maybe malformed) first nests deeper than `limit` arrays and
/// objects, or 0 when it never does: checked before parsing input that may come from anyone.
int json_nesting_over(std::string_view text, int limit);
/// `text` safe to print on a terminal: control characters (C0, DEL, and C1 as UTF-8) become
/// "\xNN" or "\u00NN", so a name cannot move the cursor or recolour the screen, and
/// bidirectional formatting characters (U+202E and the like) become "\uNNNN", so it cannot
/// reorder the rest of the line.
std::string printable(std::string_view text);
/// Shortens `text` to at most `max_bytes`, never inside a UTF-8 character (continuation bytes
/// before the cut go with it). Returns whether it cut anything.
bool cut_utf8(std::string& text, std::size_t max_bytes);
/// `text` with each tab a space: a tab in a command's output is layout, not a control to show.
std::string tabs_as_spaces(std::string text);
/// True when `text` holds a C0 control character or DEL (what printable() escapes in ASCII).
bool has_control_characters(std::string_view text);
/// Lower-cases ASCII letters.
std::string to_lower(std::string_view text);

/// Python's string.Template(text).safe_substitute(...): `$name` and `${name}` are replaced by
/// value_of(name) when it has one, `$$` is one `$`, and anything else (an unknown name, a
/// lone `$`, an unclosed brace) is kept as written. Names are ASCII letters, digits and `_`,
/// not starting with a digit.
std::string safe_substitute(
    std::string_view text,
    const std::function<std::optional<std::string>(std::string_view)>& value_of);

}  // namespace ddprun::common
