#include "agent/python_zygote.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "agent/failure_report.h"
#include "agent/standby_pool.h"
#include "common/standby_protocol.h"

namespace ddprun::agent {
namespace {

/// One message of the zygote, read without waiting: `text`, or `error` (`again`: nothing has
/// arrived yet).
struct Received {
  std::string text;
  std::string error;
  bool again = false;
};

Received receive(int fd) {
  std::string buffer(64 * 1024, '\0');
  ssize_t n;
  do {
    n = ::recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return {"", "", true};
  if (n < 0) return {"", std::string("recv: ") + std::strerror(errno)};
  if (n == 0) return {"", "it closed its control socket"};
  buffer.resize(static_cast<size_t>(n));
  return {buffer, ""};
}

/// Sends `text` with `fds` attached (SCM_RIGHTS) as one message.
std::string send_with_fds(int sock, const std::string& text, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return std::string("sendmsg: ") + std::strerror(errno);
  if (static_cast<size_t>(n) != text.size()) return "sendmsg: short write";
  return "";
}

}  // namespace

std::string PythonZygote::start(ProcessSpec spec) {
  if (state_ != State::Idle) return "the zygote was started already";
  start_env_ = parse_envp(spec.envp);
  // Room for a whole environment per request, both ways.
  auto launched =
      launch_with_channel(launcher_, std::move(spec), SOCK_SEQPACKET, common::kZygoteFdVariable,
                          common::kZygoteRequestMax, common::kZygoteRequestMax);
  if (!launched) return launched.error().message;
  process_ = launched->process;
  // Its output is read only when it fails (stderr_tail): never block the zygote on a full pipe.
  for (int fd : {process_.stdout_fd, process_.stderr_fd})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  control_fd_ = launched->agent_fd;
  state_ = State::Starting;
  return "";
}

PythonZygote::State PythonZygote::on_readable() {
  if (state_ != State::Starting) return state_;
  const Received got = receive(control_fd_);
  if (got.again) return state_;
  if (!got.error.empty()) {
    // End of file: the interpreter ended (e.g. exit code 3, no torch); on_exit says how.
    give_up(got.error);
    return state_;
  }
  auto doc = nlohmann::json::parse(got.text, nullptr, false);
  if (!doc.is_object() || !doc.contains("ready")) {
    give_up("it sent " + got.text.substr(0, 200) + " instead of its ready message");
    return state_;
  }
  shared_os_draws_.clear();
  if (auto names = doc.find("shared_os_draws"); names != doc.end() && names->is_array()) {
    for (const auto& name : *names) {
      // Module names only: anything else is not said.
      if (!name.is_string() || shared_os_draws_.size() >= 16) continue;
      const auto& text = name.get_ref<const std::string&>();
      const bool module_name =
          !text.empty() && text.size() <= 200 && std::all_of(text.begin(), text.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
          });
      if (module_name) shared_os_draws_.push_back(text);
    }
  }
  state_ = State::Ready;
  return state_;
}

bool PythonZygote::on_exit(pid_t pid, const ExitStatus& status) {
  if (pid != process_.pid || process_.pid <= 0 || reaped_) return false;
  reaped_ = true;
  if (state_ != State::Gone)
    give_up("it ended (" + describe_exit(status) + ")");
  else if (failure_.find("ended (") == std::string::npos)
    failure_ += "; it ended (" + describe_exit(status) + ")";
  return true;
}

std::string PythonZygote::request_fork(int tag, const ProcessSpec& spec) {
  if (state_ != State::Ready) return "the Python zygote is not running";
  const EnvMap env = parse_envp(spec.envp);
  if (std::string names = start_only_differences(start_env_, env); !names.empty())
    return names + " differ(s) from the zygote's, and only take effect when a process starts";
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    std::string why = std::string("pipe: ") + std::strerror(errno);
    for (int* fds : {out, err}) {
      close_fd(fds[0]);
      close_fd(fds[1]);
    }
    return why;
  }
  std::string why = send_with_fds(control_fd_, nlohmann::json{{"env", env}}.dump(),
                                  {spec.inherit_fd, out[1], err[1]});
  close_fd(out[1]);
  close_fd(err[1]);
  if (!why.empty()) {
    close_fd(out[0]);
    close_fd(err[0]);
    give_up(why);  // a control socket that cannot be written to is a zygote gone
    return why;
  }
  pending_.push_back(Pending{tag, out[0], err[0]});
  return "";
}

namespace {

/// The answer to a fork request that no process came of.
PythonZygote::Forked not_forked(int tag, std::string why) {
  return PythonZygote::Forked{tag, common::Error{std::move(why)}};
}

}  // namespace

std::vector<PythonZygote::Forked> PythonZygote::on_replies() {
  std::vector<Forked> answered;
  // Readable with nothing asked is the end of the zygote (end of file) or nonsense.
  while (state_ == State::Ready) {
    const Received got = receive(control_fd_);
    if (got.again) break;
    if (!got.error.empty()) {
      give_up(got.error);
      break;
    }
    if (pending_.empty()) {
      give_up("it sent " + got.text.substr(0, 200) + " unasked");
      break;
    }
    Pending p = pending_.front();
    pending_.pop_front();
    auto doc = nlohmann::json::parse(got.text, nullptr, false);
    if (doc.is_object() && doc.contains("pid") && doc["pid"].is_number_integer() &&
        doc["pid"].get<long long>() > 0) {
      answered.push_back({p.tag, LaunchedProcess{static_cast<pid_t>(doc["pid"].get<long long>()),
                                                 p.stdout_fd, p.stderr_fd}});
      continue;
    }
    close_fd(p.stdout_fd);
    close_fd(p.stderr_fd);
    if (doc.is_object() && doc.contains("error") && doc["error"].is_string()) {
      // A refused request leaves the zygote usable; nonsense does not.
      answered.push_back(not_forked(
          p.tag, "the Python zygote could not fork: " + doc["error"].get<std::string>()));
      continue;
    }
    const std::string why = "the Python zygote answered " + got.text.substr(0, 200);
    answered.push_back(not_forked(p.tag, why));
    give_up(why);
  }
  fail_pending(answered);
  return answered;
}

std::vector<PythonZygote::Forked> PythonZygote::time_out() {
  std::vector<Forked> answered;
  if (!pending_.empty())
    give_up("no answer to a fork request within " + std::to_string(kZygoteForkTimeout.count()) +
            " ms");
  fail_pending(answered);
  return answered;
}

void PythonZygote::fail_pending(std::vector<Forked>& out) {
  if (state_ != State::Gone) return;
  for (Pending& p : pending_) {
    close_fd(p.stdout_fd);
    close_fd(p.stderr_fd);
    out.push_back(not_forked(p.tag, "the Python zygote is gone: " + failure_));
  }
  pending_.clear();
}

void PythonZygote::give_up(std::string why) {
  if (state_ == State::Gone) return;
  state_ = State::Gone;
  failure_ = std::move(why);
  if (std::string tail = stderr_tail(); !tail.empty()) failure_ += "; its last words: " + tail;
  close_fd(control_fd_);
  if (process_.pid > 0 && !reaped_) launcher_.signal_group(process_.pid, SIGKILL);
}

std::string PythonZygote::stderr_tail() {
  if (process_.stderr_fd < 0) return "";
  std::string text;
  char buffer[4096];
  for (int i = 0; i < 64; ++i) {  // at most 256 KiB: the pipe holds less
    const ssize_t n = ::read(process_.stderr_fd, buffer, sizeof buffer);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const auto nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

void PythonZygote::stop() {
  close_fd(control_fd_);
  for (Pending& p : pending_) {
    close_fd(p.stdout_fd);
    close_fd(p.stderr_fd);
  }
  pending_.clear();
  if (process_.pid > 0 && !reaped_) {
    launcher_.signal_group(process_.pid, SIGKILL);
    launcher_.wait(process_.pid);
    reaped_ = true;
  }
  close_fd(process_.stdout_fd);
  close_fd(process_.stderr_fd);
  if (state_ != State::Idle) state_ = State::Gone;
}

}  // namespace ddprun::agent
