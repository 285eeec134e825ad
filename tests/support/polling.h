#pragma once
// Text and waiting helpers shared by the tests and the fault harness: look for lines in what a
// process printed, and poll (bounded in time) until something holds.
#include <chrono>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::testing {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// Polls `done` every 10 ms until it holds or `limit` passes; returns its last value.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

/// Agent i of a multi-node test on one machine advertises 127.0.0.(i+2): every address of
/// 127.0.0.0/8 is local, so each agent has its own name and the same loopback network.
inline std::string loopback_node_addr(int i) { return "127.0.0." + std::to_string(i + 2); }

/// Quick keep-alive and last call, so that node loss and scale-up take seconds, not minutes.
inline const std::string kFastRdzvConf =
    "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.2,keep_alive_max_attempt=3,"
    "connect_timeout=20";

}  // namespace ddprun::testing
