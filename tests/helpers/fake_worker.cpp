// A worker for tests: each argument is an action, run in order.
//   exit=N            exit with code N
//   exit_if_rank=R:N  exit with code N when RANK == R (else go on)
//   exit_if_restart=K:N  exit N when TORCHELASTIC_RESTART_COUNT == K
//   signal=N          kill itself with signal N
//   signal_if_rank=R:N   kill itself with signal N when RANK == R
//   sleep=MS          sleep MS milliseconds
//   hang              sleep up to 10 minutes (the test stops it)
//   report=EVENT      send {"event":EVENT,"local_rank":LOCAL_RANK,"pid":PID} to
//   $DDPRUN_AGENT_SOCKET (what
//                     the SDK does; "heartbeat" arms the agent's watchdog)
//   hang_unless=NAME=VALUE  hang (as above) unless the variable NAME equals VALUE
//   ignore=SIG        ignore signal number SIG (e.g. 15)
//   print=TEXT        print TEXT and a newline to stdout
//   eprint=TEXT       print TEXT and a newline to stderr
//   partial=TEXT      print TEXT without a newline, flushed
//   long_line=N       print N letters (a..z, over and over) and a newline, flushed
//   wait_file=PATH    wait until PATH exists; exit 95 after 60 s
//   env=NAME[,NAME..] print NAME=value lines (value "<unset>" when unset)
//   error_file=MSG    write MSG in torch's @record JSON to $TORCHELASTIC_ERROR_FILE
//   pidfile=PATH      append "RANK PID" to PATH (a test can check the pids later)
//   spawn_child[=PATH] fork a child in the same process group that sleeps 10 minutes;
//                     with PATH, append "childRANK PID" to PATH
//   spawn_setsid=PATH:N  fork N children that each leave the process group and session
//                     (setsid) and sleep 10 minutes; append "setsidRANK.I PID" to PATH
//   spawn_setpgrp=PATH:N  fork N children that each leave the process group for one of their
//                     own (setpgid(0, 0)) and sleep 10 minutes, the odd ones in a child they
//                     fork before they exit (an orphan in a group whose leader is gone); each
//                     sleeper appends "setpgrpRANK.I PID" to PATH
//   join_group=PATH:PGID  fork a child that joins process group PGID (setpgid) and sleeps 10
//                     minutes; it appends "joinedRANK.PGID PID" to PATH, or, refused,
//                     "refusedRANK.PGID PID" (EPERM: another session's) or "failed..." and exits
//   spam=N            print N numbered lines of 100 bytes as fast as possible
//   wait_lines=PATH:N wait until PATH has N lines (e.g. every rank wrote its pidfile line);
//                     exit 96 after 60 s
//   fds               print "fds=0,1,2": the descriptors this process holds, in order
//   wait_usr1         catch SIGUSR1, print "waiting for SIGUSR1", then on its arrival print
//                     "got SIGUSR1" and go on; exit 97 when none arrives within 60 s
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

namespace {

volatile sig_atomic_t got_usr1 = 0;

void on_usr1(int) { got_usr1 = 1; }

/// Polls `done` every 10 ms for at most 60 s: a test that forgets to release us cannot hang.
template <typename Pred>
bool wait_for(Pred done) {
  for (int tick = 0; tick < 6000; ++tick) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

int count_lines(const std::string& path) {
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

bool split_pair(const std::string& v, std::string& a, int& b) {
  auto colon = v.find(':');
  if (colon == std::string::npos) return false;
  a = v.substr(0, colon);
  b = std::atoi(v.substr(colon + 1).c_str());
  return true;
}

void json_escape(std::string& out, const std::string& s) {
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string rank = env_or("RANK", "?");
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto eq = arg.find('=');
    std::string key = arg.substr(0, eq);
    std::string val = eq == std::string::npos ? "" : arg.substr(eq + 1);
    std::string who;
    int n = 0;
    if (key == "exit") {
      std::fflush(stdout);
      return std::atoi(val.c_str());
    } else if (key == "exit_if_rank" && split_pair(val, who, n)) {
      if (who == rank) {
        std::fflush(stdout);
        return n;
      }
    } else if (key == "exit_if_restart" && split_pair(val, who, n)) {
      if (who == env_or("TORCHELASTIC_RESTART_COUNT", "?")) {
        std::fflush(stdout);
        return n;
      }
    } else if (key == "signal") {
      std::fflush(stdout);
      ::signal(std::atoi(val.c_str()), SIG_DFL);
      ::raise(std::atoi(val.c_str()));
    } else if (key == "signal_if_rank" && split_pair(val, who, n)) {
      if (who == rank) {
        std::fflush(stdout);
        ::signal(n, SIG_DFL);
        ::raise(n);
      }
    } else if (key == "sleep") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(val.c_str())));
    } else if (key == "fds") {
      // The directory's own descriptor, open while it is read, is not one we were given.
      std::set<int> fds;
      if (DIR* dir = ::opendir("/proc/self/fd")) {
        while (const dirent* entry = ::readdir(dir))
          if (entry->d_name[0] != '.' && std::atoi(entry->d_name) != ::dirfd(dir))
            fds.insert(std::atoi(entry->d_name));
        ::closedir(dir);
      }
      std::string list;
      for (int fd : fds) list += (list.empty() ? "" : ",") + std::to_string(fd);
      std::printf("fds=%s\n", list.c_str());
    } else if (key == "hang") {
      std::fflush(stdout);
      for (int s = 0; s < 600; ++s) ::sleep(1);
    } else if (key == "report") {
      const std::string path = env_or("DDPRUN_AGENT_SOCKET", "");
      const std::string body = "{\"event\":\"" + val +
                               "\",\"local_rank\":" + env_or("LOCAL_RANK", "0") +
                               ",\"pid\":" + std::to_string(::getpid()) + "}";
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
      int fd = ::socket(AF_UNIX, SOCK_DGRAM, 0);
      if (fd >= 0) {
        ::sendto(fd, body.data(), body.size(), 0, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
        ::close(fd);
      }
    } else if (key == "hang_unless") {
      const auto sep = val.find('=');
      const std::string name = val.substr(0, sep);
      const std::string want = sep == std::string::npos ? "" : val.substr(sep + 1);
      if (env_or(name.c_str(), "<unset>") != want) {
        std::fflush(stdout);
        for (int s = 0; s < 600; ++s) ::sleep(1);
      }
    } else if (key == "ignore") {
      ::signal(std::atoi(val.c_str()), SIG_IGN);
    } else if (key == "print") {
      std::printf("%s\n", val.c_str());
      std::fflush(stdout);
    } else if (key == "eprint") {
      std::fprintf(stderr, "%s\n", val.c_str());
    } else if (key == "partial") {
      std::printf("%s", val.c_str());
      std::fflush(stdout);
    } else if (key == "long_line") {
      std::string line;
      for (int i = 0; i < std::atoi(val.c_str()); ++i) line += static_cast<char>('a' + i % 26);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    } else if (key == "wait_file") {
      if (!wait_for([&] { return ::access(val.c_str(), F_OK) == 0; })) return 95;
    } else if (key == "env") {
      size_t start = 0;
      while (start <= val.size()) {
        size_t comma = val.find(',', start);
        std::string name =
            val.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        std::printf("%s=%s\n", name.c_str(), env_or(name.c_str(), "<unset>").c_str());
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      std::fflush(stdout);
    } else if (key == "error_file") {
      const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
      if (path == nullptr) return 99;
      std::string body = "{\"message\": {\"message\": \"";
      json_escape(body, val);
      body += "\", \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n  ";
      body += "File \\\"fake_worker.cpp\\\", line 1, in main\\n";
      json_escape(body, val);
      body += "\\n\", \"timestamp\": \"1700000000\"}}}";
      std::ofstream(path) << body;
    } else if (key == "pidfile") {
      std::ofstream(val, std::ios::app) << rank << " " << ::getpid() << "\n";
    } else if (key == "spawn_child") {
      std::fflush(stdout);
      const pid_t child = ::fork();
      if (child == 0) {
        for (int s = 0; s < 600; ++s) ::sleep(1);
        _exit(0);
      }
      if (!val.empty())
        std::ofstream(val, std::ios::app) << "child" << rank << " " << child << "\n";
    } else if (key == "spawn_setsid" && split_pair(val, who, n)) {
      std::fflush(stdout);
      for (int i = 0; i < n; ++i) {
        const pid_t child = ::fork();
        if (child == 0) {
          ::setsid();
          for (int s = 0; s < 600; ++s) ::sleep(1);
          _exit(0);
        }
        std::ofstream(who, std::ios::app) << "setsid" << rank << "." << i << " " << child << "\n";
      }
    } else if (key == "spawn_setpgrp" && split_pair(val, who, n)) {
      std::fflush(stdout);
      for (int i = 0; i < n; ++i) {
        const pid_t child = ::fork();
        if (child != 0) {
          if (i % 2 == 1) ::waitpid(child, nullptr, 0);  // reaped: the group's leader is gone
          continue;
        }
        ::setpgid(0, 0);
        if (i % 2 == 1 && ::fork() != 0) _exit(0);
        std::ofstream(who, std::ios::app)
            << "setpgrp" << rank << "." << i << " " << ::getpid() << "\n";
        for (int s = 0; s < 600; ++s) ::sleep(1);
        _exit(0);
      }
    } else if (key == "join_group" && split_pair(val, who, n)) {
      std::fflush(stdout);
      if (::fork() == 0) {
        if (::setpgid(0, n) != 0) {
          // EPERM: the group is of another session (a worker leads a session of its own).
          std::ofstream(who, std::ios::app) << (errno == EPERM ? "refused" : "failed") << rank
                                            << "." << n << " " << ::getpid() << "\n";
          _exit(1);
        }
        std::ofstream(who, std::ios::app)
            << "joined" << rank << "." << n << " " << ::getpid() << "\n";
        for (int s = 0; s < 600; ++s) ::sleep(1);
        _exit(0);
      }
    } else if (key == "wait_lines") {
      auto colon = val.rfind(':');
      if (colon == std::string::npos) return 98;
      const std::string path = val.substr(0, colon);
      const int want = std::atoi(val.substr(colon + 1).c_str());
      if (!wait_for([&] { return count_lines(path) >= want; })) return 96;
    } else if (key == "wait_usr1") {
      struct sigaction sa {};
      sa.sa_handler = on_usr1;
      ::sigemptyset(&sa.sa_mask);
      ::sigaction(SIGUSR1, &sa, nullptr);
      std::printf("waiting for SIGUSR1\n");
      std::fflush(stdout);
      if (!wait_for([] { return got_usr1 != 0; })) return 97;
      std::printf("got SIGUSR1\n");
      std::fflush(stdout);
    } else if (key == "spam") {
      const int lines = std::atoi(val.c_str());
      for (int l = 0; l < lines; ++l)
        std::printf("rank%s-line%06d-%s\n", rank.c_str(), l, std::string(80, 'x').c_str());
      std::fflush(stdout);
    } else {
      std::fprintf(stderr, "fake_worker: unknown action %s\n", arg.c_str());
      return 98;
    }
  }
  std::fflush(stdout);
  return 0;
}
