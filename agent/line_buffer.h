#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

/// Cuts a byte stream into whole lines so that each console write carries exactly one line of
/// one worker. A line longer than max_line is emitted in pieces of max_line bytes.
class LineBuffer {
 public:
  explicit LineBuffer(size_t max_line = 64 * 1024) : max_line_(max_line) {}

  /// Appends bytes; returns the lines completed by them, without their '\n'.
  std::vector<std::string> feed(std::string_view bytes);
  /// The trailing partial line at end of stream, if any (then the buffer is empty).
  std::vector<std::string> finish();

 private:
  size_t max_line_;
  std::string pending_;
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
