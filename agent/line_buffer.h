#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

/// The longest piece LineBuffer gives out by default: a longer line comes in parts.
inline constexpr size_t kMaxLinePiece = 64 * 1024;

/// A whole line, without its '\n', or a part of one that more of the line follows.
struct LinePiece {
  std::string text;
  bool ends_line = true;
  bool operator==(const LinePiece& other) const {
    return text == other.text && ends_line == other.ends_line;
  }
};

/// Cuts a byte stream into whole lines so that each console write carries one line of one
/// worker, with the bytes kept as they were: joined again, the pieces and their '\n's are the
/// stream. A part of a line is given out before its '\n' in two cases: a line reaches max_line
/// bytes (memory stays bounded), and a progress line, one with more of it after a carriage
/// return (a progress bar such as tqdm's redraws itself after "\r"), gives what it has at the
/// end of each read, so that it is shown as it goes (but for a last "\r", which waits for the
/// next byte: "\r\n" split between two reads still ends the line).
class LineBuffer {
 public:
  explicit LineBuffer(size_t max_line = kMaxLinePiece) : max_line_(max_line) {}

  /// Appends bytes; returns the lines they complete and the parts of lines they give out.
  std::vector<LinePiece> feed(std::string_view bytes);
  /// What is left at the end of the stream: the last line's part without a '\n', if any
  /// (then the buffer is empty).
  std::vector<LinePiece> finish();
  /// The part of the current line held so far, given out now, more of the line to follow (a
  /// prompt such as "(Pdb) " that waits for input, shown once the worker has been quiet for a
  /// moment); a last '\r' still waits for the next byte. Nothing when nothing is held.
  std::vector<LinePiece> give_held();
  /// True when part of a line is held (give_held would give something).
  bool holds() const { return pending_.size() > (last_cr_ ? 1U : 0U); }

 private:
  size_t max_line_;
  std::string pending_;
  bool progress_ = false;  ///< the current line holds a '\r' followed by more of it
  bool last_cr_ = false;   ///< the last byte of the current line is a '\r'
};

/// The text before each console line of one worker: "[<role><local_rank>]:" by default, or
/// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE expanded as torchrun 2.x does (Python's
/// string.Template.safe_substitute): ${role_name} or $role_name, ${rank} (the global rank) and
/// ${local_rank} are replaced, $$ is a "$", anything else is kept as written.
std::string console_prefix(std::string_view tmpl, const std::string& role, int rank,
                           int local_rank);
/// The same for a line several ranks printed: `ranks` and `local_ranks` as rank_ranges writes
/// them ("0-3,6").
std::string console_prefix(std::string_view tmpl, const std::string& role, const std::string& ranks,
                           const std::string& local_ranks);

}  // namespace ddprun::agent
