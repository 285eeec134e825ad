#include "common/signals.h"

#include <csignal>
#include <utility>

#include "common/strings.h"

namespace ddprun::common {
namespace {

constexpr std::pair<int, const char*> kSignals[] = {
    {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},   {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"},     {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},     {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"},     {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"},   {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},   {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"},     {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"},   {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"},     {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"},
    {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
    {SIGSYS, "SIGSYS"},
};

}  // namespace

std::string signal_name(int signum) {
  for (const auto& [num, name] : kSignals)
    if (num == signum) return name;
  return "SIG" + std::to_string(signum);
}

std::optional<int> parse_signal(std::string_view text) {
  std::string upper = trim(text);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (auto n = parse_int(upper)) {
    if (*n > 0 && *n < NSIG) return static_cast<int>(*n);
    return std::nullopt;
  }
  if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
  for (const auto& [num, name] : kSignals)
    if (upper == name) return num;
  return std::nullopt;
}

}  // namespace ddprun::common
