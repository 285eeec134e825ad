#include "agent/worker_stdin.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/log.h"

namespace ddprun::agent {

namespace {

/// Waits up to `ms` for `stop` to become readable; true when it did.
bool stopped_within(int stop, int ms) {
  pollfd p{stop, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

/// True when the agent may take a line from its terminal `fd` now: it is in the terminal's
/// foreground process group (else the read would stop it, or take what the shell is given),
/// and the terminal reads lines (canonical mode): a program in the same group that reads keys
/// one by one, a pager after `ddprun ... | less`, owns the terminal meanwhile.
bool may_take_line(int fd) {
  termios mode{};
  return ::tcgetpgrp(fd) == ::getpgrp() && ::tcgetattr(fd, &mode) == 0 &&
         (mode.c_lflag & ICANON) != 0;
}

/// Bytes in a pipe not read yet (FIONREAD on its read end).
int unread(int read_end) {
  int n = 0;
  return ::ioctl(read_end, FIONREAD, &n) == 0 ? n : 0;
}

}  // namespace

struct WorkerStdin::Relay {
  /// The terminal on stdin, opened again non-blocking (its own file description: the shell's
  /// stays as it is), so that a line another reader took first leaves no read waiting.
  int source = -1;
  int read_end = -1, write_end = -1;
  int stop_read = -1, stop_write = -1;
  std::thread thread;
  std::mutex typed_mutex;
  std::function<void()> typed;  ///< WorkerStdin::on_line

  void say_typed() {
    const std::lock_guard<std::mutex> lock(typed_mutex);
    if (typed) typed();
  }

  /// Copies the terminal's lines into the pipe until end of file, an error, or stop.
  void run() {
    std::array<char, 4096> line{};
    while (true) {
      pollfd watched[2] = {{source, POLLIN, 0}, {stop_read, POLLIN, 0}};
      if (::poll(watched, 2, 1'000) < 0 && errno != EINTR) break;
      if (watched[1].revents != 0) break;
      if ((watched[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      // Not the agent's to take, or the last line not read yet: leave what is typed in the
      // terminal, and look again.
      if (!may_take_line(source) || unread(read_end) > 0) {
        if (stopped_within(stop_read, 100)) break;
        continue;
      }
      const ssize_t n = ::read(source, line.data(), line.size());
      if (n > 0) {
        say_typed();
        // The pipe is empty and a read of a terminal is at most 4096 bytes: it takes it all.
        for (ssize_t done = 0; done < n;) {
          const ssize_t w = ::write(write_end, line.data() + done, static_cast<size_t>(n - done));
          if (w < 0 && errno == EINTR) continue;
          if (w < 0) return close_write_end();  // cannot happen with our own read end open
          done += w;
        }
        continue;
      }
      if (n == 0) break;                                // Ctrl-D, or the terminal hung up
      if (errno == EINTR || errno == EAGAIN) continue;  // another reader took it first
      // EIO: read in the background after all (SIGTTIN ignored); look again later.
      if (errno != EIO || stopped_within(stop_read, 1'000)) break;
    }
    close_write_end();
  }

  void close_write_end() {
    if (write_end >= 0) ::close(write_end);
    write_end = -1;
  }

  ~Relay() {
    if (thread.joinable()) {
      const char stop = 's';
      while (::write(stop_write, &stop, 1) < 0 && errno == EINTR) {
      }
      thread.join();
    }
    close_write_end();
    for (int fd : {source, read_end, stop_read, stop_write})
      if (fd >= 0) ::close(fd);
  }
};

std::unique_ptr<WorkerStdin> WorkerStdin::open() {
  std::unique_ptr<WorkerStdin> in(new WorkerStdin);
  if (::fcntl(STDIN_FILENO, F_GETFD) < 0) return in;  // none: /dev/null
  // Not a terminal, or one that is not ddprun's controlling terminal (`setsid ddprun`): no job
  // control applies, and the workers read it as torchrun's do.
  if (!::isatty(STDIN_FILENO) || ::tcgetpgrp(STDIN_FILENO) < 0) {
    in->fd_ = STDIN_FILENO;
    return in;
  }
  auto relay = std::make_unique<Relay>();
  int pipe_fds[2], stop_fds[2];
  relay->source = ::open("/proc/self/fd/0", O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (relay->source < 0) return in;
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return in;
  relay->read_end = pipe_fds[0];
  relay->write_end = pipe_fds[1];
  if (::pipe2(stop_fds, O_CLOEXEC) != 0) return in;
  relay->stop_read = stop_fds[0];
  relay->stop_write = stop_fds[1];
  // The thread blocks every signal, so the agent's (SIGCHLD, SIGTERM, the notices) reach its
  // event loop's thread, as before there was a second one.
  sigset_t all, before;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &before);
  try {
    Relay* r = relay.get();
    relay->thread = std::thread([r] { r->run(); });
  } catch (const std::system_error& e) {
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    spdlog::warn("cannot relay the terminal to the workers ({}): their stdin is /dev/null",
                 e.what());
    return in;
  }
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ::signal(SIGTTIN, SIG_IGN);
  in->fd_ = relay->read_end;
  in->relay_ = std::move(relay);
  return in;
}

WorkerStdin::~WorkerStdin() = default;

void WorkerStdin::on_line(std::function<void()> typed) {
  if (relay_ == nullptr) return;
  const std::lock_guard<std::mutex> lock(relay_->typed_mutex);
  relay_->typed = std::move(typed);
}

void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int opened = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened >= 0 && opened != fd) {
      ::dup2(opened, fd);
      ::close(opened);
    }
  }
}

}  // namespace ddprun::agent
