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

}  // namespace ddprun::agent
