// The Python zygote's control protocol, with this test playing the zygote on the other end of
// the socket pair (agent/python_zygote.h): fork requests go out without waiting for answers,
// answers are read when they have arrived, in order, and a zygote that stops answering is
// given up with every request still out answered. No interpreter, no sleeps.
#include "agent/python_zygote.h"

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tests/support/fake_process_launcher.h"

using namespace ddprun::agent;
using ddprun::testing::FakeProcessLauncher;

namespace {

/// A fork request as the zygote reads it: the JSON text and the descriptors attached.
struct Request {
  nlohmann::json message;
  std::vector<int> fds;
};

/// Reads one message without waiting; an empty message when none has arrived.
Request read_request(int fd) {
  std::string text(1 << 20, '\0');
  iovec iov{text.data(), text.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * 3), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  Request r;
  if (n <= 0) return r;
  r.message = nlohmann::json::parse(text.substr(0, static_cast<size_t>(n)));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* fds = reinterpret_cast<const int*>(CMSG_DATA(c));
    r.fds.assign(fds, fds + count);
  }
  return r;
}

void say(int fd, const nlohmann::json& message) {
  const std::string text = message.dump();
  REQUIRE(::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size()));
}

/// A zygote started on the fake launcher and ready: the test holds its end of the socket.
struct ReadyZygote {
  FakeProcessLauncher launcher;
  PythonZygote zygote{launcher};
  int theirs = -1;

  ReadyZygote() {
    ProcessSpec spec{"/usr/bin/python3",
                     {"python3", "ddprun_standby.py", "--zygote"},
                     {"LOCAL_RANK=0", "PYTHONHASHSEED=0"}};
    REQUIRE(zygote.start(spec).empty());
    theirs = launcher.inherited.at(zygote.pid());
    CHECK(zygote.on_readable() == PythonZygote::State::Starting);  // nothing said yet
    say(theirs, {{"ready", zygote.pid()}});
    REQUIRE(zygote.on_readable() == PythonZygote::State::Ready);
  }

  /// A standby's spec: its environment and a hand-over descriptor to pass along.
  static ProcessSpec standby(int local_rank, int handover_fd) {
    ProcessSpec spec{"", {}, {"LOCAL_RANK=" + std::to_string(local_rank), "PYTHONHASHSEED=0"}};
    spec.inherit_fd = handover_fd;
    return spec;
  }
};

}  // namespace

TEST_CASE("zygote: fork requests go out at once and are answered in order as replies arrive",
          "[agent][standby][unit]") {
  ReadyZygote z;
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  // Three requests out before any answer: none waits for the zygote.
  for (int rank = 0; rank < 3; ++rank)
    REQUIRE(z.zygote.request_fork(rank, ReadyZygote::standby(rank, pair[0])).empty());
  CHECK(z.zygote.forks_pending() == 3);
  CHECK(z.zygote.on_replies().empty());  // nothing has arrived: nothing to read, no wait
  std::vector<Request> requests;
  for (int i = 0; i < 3; ++i) requests.push_back(read_request(z.theirs));
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(requests[rank].message["env"]["LOCAL_RANK"] == std::to_string(rank));
    CHECK(requests[rank].fds.size() == 3);  // the hand-over descriptor, stdout, stderr
  }
  say(z.theirs, {{"pid", 4242}});
  say(z.theirs, {{"error", "fork: Resource temporarily unavailable"}});
  auto answers = z.zygote.on_replies();
  REQUIRE(answers.size() == 2);
  CHECK(answers[0].tag == 0);
  REQUIRE(answers[0].result.ok());
  const LaunchedProcess forked = (*answers[0].result);
  CHECK(forked.pid == 4242);
  // Its output pipes: what the standby writes to the end the zygote passed on arrives here.
  REQUIRE(::write(requests[0].fds[1], "hi", 2) == 2);
  char got[2];
  CHECK(::read(forked.stdout_fd, got, 2) == 2);
  CHECK(answers[1].tag == 1);
  CHECK(answers[1].result.error().message ==
        "the Python zygote could not fork: fork: Resource temporarily unavailable");
  // A refused request leaves the zygote usable; rank 2's answer is still awaited.
  CHECK(z.zygote.state() == PythonZygote::State::Ready);
  CHECK(z.zygote.forks_pending() == 1);
  say(z.theirs, {{"pid", 4243}});
  answers = z.zygote.on_replies();
  REQUIRE(answers.size() == 1);
  CHECK(answers[0].tag == 2);
  CHECK((*answers[0].result).pid == 4243);
  for (auto& r : requests)
    for (int fd : r.fds) ::close(fd);
  for (int fd : {forked.stdout_fd, forked.stderr_fd, pair[0], pair[1]}) ::close(fd);
  ::close((*answers[0].result).stdout_fd);
  ::close((*answers[0].result).stderr_fd);
}

TEST_CASE("zygote: one that stops answering is given up and every request out is answered",
          "[agent][standby][unit]") {
  ReadyZygote z;
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  REQUIRE(z.zygote.request_fork(0, ReadyZygote::standby(0, pair[0])).empty());
  REQUIRE(z.zygote.request_fork(1, ReadyZygote::standby(1, pair[0])).empty());
  auto answers = z.zygote.time_out();
  REQUIRE(answers.size() == 2);
  for (const auto& a : answers)
    CHECK(a.result.error().message.find("no answer to a fork request within 5000 ms") !=
          std::string::npos);
  CHECK(z.zygote.state() == PythonZygote::State::Gone);
  CHECK(z.zygote.forks_pending() == 0);
  // It was killed; a request now is refused at once.
  CHECK(z.launcher.signals.back() == std::pair<pid_t, int>{z.zygote.pid(), SIGKILL});
  CHECK(z.zygote.request_fork(2, ReadyZygote::standby(2, pair[0])) ==
        "the Python zygote is not running");
  for (int fd : pair) ::close(fd);
}

TEST_CASE("zygote: its end, or an unasked message, while requests are out answers them all",
          "[agent][standby][unit]") {
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  SECTION("end of file") {
    ReadyZygote z;
    REQUIRE(z.zygote.request_fork(0, ReadyZygote::standby(0, pair[0])).empty());
    ::close(std::exchange(z.launcher.inherited.at(z.zygote.pid()), -1));  // the zygote ends
    auto answers = z.zygote.on_replies();
    REQUIRE(answers.size() == 1);
    // Closed with the request unread: the agent's end reads a reset rather than end of file.
    INFO(answers[0].result.error().message);
    CHECK(answers[0].result.error().message.rfind("the Python zygote is gone: ", 0) == 0);
    CHECK(z.zygote.state() == PythonZygote::State::Gone);
  }
  SECTION("an answer nobody asked for") {
    ReadyZygote z;
    say(z.theirs, {{"pid", 77}});
    CHECK(z.zygote.on_replies().empty());
    CHECK(z.zygote.state() == PythonZygote::State::Gone);
    CHECK(z.zygote.failure().find("unasked") != std::string::npos);
  }
  for (int fd : pair) ::close(fd);
}

TEST_CASE("zygote: the modules its ready message names are module names only, at most 16",
          "[agent][unit]") {
  FakeProcessLauncher launcher;
  PythonZygote zygote{launcher};
  REQUIRE(
      zygote
          .start(ProcessSpec{
              "/usr/bin/python3", {"python3", "ddprun_standby.py", "--zygote"}, {"LOCAL_RANK=0"}})
          .empty());
  const int theirs = launcher.inherited.at(zygote.pid());
  nlohmann::json names = nlohmann::json::array({"transformers.utils.hub", "\x1b[31mred",
                                                "a; rm -rf /", std::string(201, 'x'), "", 5,
                                                nlohmann::json::object({{"nested", "x"}})});
  for (int i = 0; i < 30; ++i) names.push_back("mod" + std::to_string(i));
  say(theirs, {{"ready", zygote.pid()}, {"shared_os_draws", names}});
  REQUIRE(zygote.on_readable() == PythonZygote::State::Ready);
  const std::vector<std::string>& said = zygote.shared_os_draws();
  REQUIRE(said.size() == 16);
  CHECK(said.front() == "transformers.utils.hub");
  CHECK(said[1] == "mod0");
  CHECK(said.back() == "mod14");
}

TEST_CASE("zygote: a ready message without shared_os_draws names none", "[agent][unit]") {
  ReadyZygote ready;
  CHECK(ready.zygote.shared_os_draws().empty());
}
