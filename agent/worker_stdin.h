#pragma once

#include <functional>
#include <memory>

namespace ddprun::agent {

/// The workers' stdin. torchrun's workers inherit the launcher's: so do ddprun's (and its
/// standbys'), so that `input()`, `breakpoint()` and `torch.distributed.breakpoint()` read
/// what is typed or piped to ddprun:
///   - ddprun's stdin is not a terminal (a pipe, a file, /dev/null), or not its controlling
///     terminal (`setsid ddprun ...`): the workers get it as it is, shared as torchrun's share
///     it;
///   - it is ddprun's controlling terminal: the workers get the read end of a pipe, and a
///     thread of the agent copies into it each line typed there, one line once the last one
///     was read, while ddprun's process group is the terminal's foreground one and the
///     terminal reads lines (a pager in the same pipeline, which reads keys, is left alone).
///     Workers read the pipe, not the terminal, so none takes what is typed while ddprun is
///     in the background or a pager reads keys. While no worker reads, what is typed stays in the
///     terminal, but for the one line already in the pipe. End of file there (Ctrl-D) is end of
///     file for the workers from then on.
class WorkerStdin {
 public:
  /// Sets up what this process's stdin asks for; SIGTTIN is ignored by the agent while it
  /// relays a terminal (a read in the background then fails instead of stopping the agent).
  static std::unique_ptr<WorkerStdin> open();
  ~WorkerStdin();
  WorkerStdin(const WorkerStdin&) = delete;
  WorkerStdin& operator=(const WorkerStdin&) = delete;

  /// The descriptor each worker gets as its stdin (ProcessSpec::stdin_fd); -1: /dev/null.
  int fd() const { return fd_; }
  /// True when a terminal's lines are relayed.
  bool relays() const { return relay_ != nullptr; }
  /// Calls `typed` (on the relay's thread, before the workers can read the line) for each
  /// line relayed; nullptr for none.
  void on_line(std::function<void()> typed);

 private:
  struct Relay;
  WorkerStdin() = default;
  int fd_ = -1;
  std::unique_ptr<Relay> relay_;
};

/// Opens /dev/null on each of the descriptors 0, 1 and 2 that is closed, before anything else
/// is opened: otherwise the first file or socket ddprun opens would become its stdin, which the
/// workers inherit.
void open_standard_descriptors();

}  // namespace ddprun::agent
