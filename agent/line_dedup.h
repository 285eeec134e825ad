#pragma once
// --dedup_output: identical console lines that several local ranks print within a window are
// shown once, with a prefix naming the ranks ("[default0-7]: loss 0.25"). Pure: lines and time
// in, rendered console lines out; WorkerOutput writes them and wakes it at next_deadline().
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace ddprun::agent {

/// "0-3,6" for {0,1,2,3,6}: the ranks in order, runs of three or more as ranges.
std::string rank_ranges(std::vector<int> ranks);

/// A line ready for the console: its descriptor (stdout or stderr) and its text with '\n'.
struct ConsoleLine {
  int fd = -1;
  std::string text;
};

class LineDedup {
 public:
  /// `prefix_template` and `role` render prefixes as console_prefix does; at most
  /// `max_pending` lines, and `max_pending_bytes` of them, wait (older ones are shown early
  /// beyond that: long lines, which workers cut at 64 KiB, cannot make the agent hold more).
  LineDedup(common::Duration window, std::string prefix_template, std::string role,
            size_t max_pending = 4096, size_t max_pending_bytes = 4u << 20);

  /// A whole line of one rank at `now`. Joins a waiting identical line of another rank on the
  /// same stream, or waits `window` for others; returns the lines due to be shown now, in the
  /// order they were first printed.
  std::vector<ConsoleLine> offer(int fd, int rank, int local_rank, const std::string& line,
                                 common::TimePoint now);
  /// The lines whose window has closed by `now`.
  std::vector<ConsoleLine> due(common::TimePoint now);
  /// Every waiting line (the group's output has ended).
  std::vector<ConsoleLine> flush();
  /// When the oldest waiting line is due (nullopt: none waits).
  std::optional<common::TimePoint> next_deadline() const;

 private:
  struct Pending {
    int fd = -1;
    std::string line;
    std::vector<int> ranks;
    std::vector<int> local_ranks;
    common::TimePoint deadline;
  };
  ConsoleLine render(const Pending& p) const;
  void pop_front(std::vector<ConsoleLine>& out);

  common::Duration window_;
  std::string template_;
  std::string role_;
  size_t max_pending_;
  size_t max_pending_bytes_;
  size_t pending_bytes_ = 0;     ///< of the lines in pending_
  std::deque<Pending> pending_;  ///< in first-printed order, so deadlines ascend
  size_t popped_ = 0;            ///< entries popped from the front so far
  /// fd and text -> the sequence number (popped_ + index) of the newest waiting entry.
  std::map<std::pair<int, std::string>, size_t> index_;
};

}  // namespace ddprun::agent
