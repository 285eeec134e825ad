// Worker output: whole prefixed lines on the console, log files under --log_dir, --tee and
// --local_ranks_filter.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

/// The one run directory for `rdzv_id` under `log_dir` (torchrun names it <rdzv_id>_<random>).
std::string run_dir(const std::string& log_dir, const std::string& rdzv_id) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(log_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == rdzv_id || name.rfind(rdzv_id + "_", 0) == 0) found.push_back(entry.path());
  }
  INFO(log_dir << " holds " << found.size() << " run directories for " << rdzv_id);
  REQUIRE(found.size() == 1);
  return found.front();
}

}  // namespace

TEST_CASE("a last line without a newline still reaches the console with its prefix",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({}, {"partial=abc"}), {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:abc"));
}

TEST_CASE("pieces of one line written separately are shown as one line", "[agent][integration]") {
  auto r = run_command(ddprun_fake({}, {"partial=abc", "sleep=50", "print=def"}), {}, kJobLimit);
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(lines_of(r.out) == std::vector<std::string>{"[default0]:abcdef"});
}

TEST_CASE(
    "a line over 64 KiB is one line on the console, and the log file holds the bytes as written",
    "[agent][integration]") {
  TempDir logs;
  auto r = run_command(
      ddprun_fake({"--log_dir", logs.path(), "--redirects", "3", "--tee", "3", "--rdzv_id", "long"},
                  {"long_line=200000", "partial=end"}),
      {}, kJobLimit);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::string letters;
  for (int i = 0; i < 200000; ++i) letters += static_cast<char>('a' + i % 26);
  const std::string file = read_file(run_dir(logs.path(), "long") + "/attempt_0/0/stdout.log");
  CHECK(file.size() == letters.size() + 4);
  CHECK(file == letters + "\nend");
  // One prefix per line; the last line, which has no newline, is ended on the console.
  CHECK(lines_of(r.out) == std::vector<std::string>{"[default0]:" + letters, "[default0]:end"});
}

TEST_CASE(
    "a progress line (carriage returns, no newline yet) is shown as it goes, its prefix "
    "after each carriage return",
    "[agent][integration]") {
  TempDir dir;
  const std::string go = dir.path() + "/go";
  // As tqdm draws a bar: "\r" and the bar, again and again, then a newline.
  Subprocess job(ddprun_fake(
      {}, {"partial=\rstep 1", "wait_file=" + go, "partial=\rstep 2", "print=", "print=done"}));
  // Shown before its line ends: the worker waits for it to be seen.
  const bool shown = job.wait_for_output("step 1", kJobLimit);
  std::ofstream(go).put('\n');
  auto r = job.wait(kJobLimit);
  INFO(r.out << r.err);
  CHECK(shown);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "\r[default0]:step 1\r[default0]:step 2\n[default0]:done\n");
}

TEST_CASE(
    "a --log_dir or --event_log that cannot be written exits 64 naming it, before any "
    "worker starts",
    "[agent][integration]") {
  TempDir dir;
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "not a directory\n";
  for (const char* flag : {"--log_dir", "--event_log"}) {
    INFO(flag);
    auto r = run_command(ddprun_fake({flag, file + "/below"}, {"print=ran"}), {}, kJobLimit);
    INFO(r.err);
    CHECK(r.exit_code == 64);
    CHECK(contains(r.err, file + "/below"));
    CHECK(contains(r.err, std::string("pass a writable ") + flag));
    CHECK_FALSE(contains(r.out, "ran"));
  }
}

TEST_CASE(
    "a progress line left open is ended before another rank's line: no console line "
    "carries two ranks' text",
    "[agent][integration]") {
  TempDir dir;
  const std::string go = dir.path() + "/go";
  Subprocess job(ddprun_fake(
      {"--nproc_per_node", "2"},
      {"partial=\rstep 1", "wait_file=" + go, "partial=\rstep 2", "print=", "print=done"}));
  // Both bars are on the console before either line ends.
  const bool shown = job.wait_for_output("[default0]:step 1", kJobLimit) &&
                     job.wait_for_output("[default1]:step 1", kJobLimit);
  std::ofstream(go).put('\n');
  auto r = job.wait(kJobLimit);
  INFO(r.out << r.err);
  CHECK(shown);
  CHECK(r.exit_code == 0);
  const std::regex prefix(R"(\[default([01])\]:)");
  int lines_with_text = 0;
  for (const std::string& line : lines_of(r.out)) {
    std::set<std::string> ranks;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), prefix);
         it != std::sregex_iterator(); ++it)
      ranks.insert((*it)[1]);
    INFO(line);
    CHECK(ranks.size() <= 1);
    lines_with_text += ranks.empty() ? 0 : 1;
  }
  CHECK(lines_with_text >= 4);
  CHECK(count_of(r.out, "[default0]:done\n") == 1);
  CHECK(count_of(r.out, "[default1]:done\n") == 1);
}

TEST_CASE("lines of workers printing at once are never interleaved", "[agent][integration]") {
  constexpr int kLines = 2000;
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2"}, {"spam=" + std::to_string(kLines)}),
                       {}, kJobLimit);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // fake_worker's spam line: rank<R>-line<NNNNNN>-<80 x>.
  const std::regex line_re(R"(\[default([01])\]:rank([01])-line(\d{6})-x{80})");
  int next[2] = {0, 0};
  int bad = 0;
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_match(line, m, line_re) || m[1] != m[2]) {
      if (++bad <= 3) UNSCOPED_INFO("bad line: " << line);
      continue;
    }
    const int rank = std::stoi(m[1]);
    // Each worker's lines arrive whole and in order.
    if (std::stoi(m[3]) != next[rank]) {
      if (++bad <= 3) UNSCOPED_INFO("out of order: " << line);
    }
    next[rank] = std::stoi(m[3]) + 1;
  }
  CHECK(bad == 0);
  CHECK(next[0] == kLines);
  CHECK(next[1] == kLines);
}

TEST_CASE("with --redirects 3 each worker's output goes to files under --log_dir, not the console",
          "[agent][integration]") {
  TempDir logs;
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2", "--log_dir", logs.path(),
                                    "--redirects", "3", "--rdzv_id", "myrun"},
                                   {"print=to-stdout", "eprint=to-stderr"}),
                       {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string dir = run_dir(logs.path(), "myrun") + "/attempt_0/" + std::to_string(rank);
    INFO(dir);
    CHECK(read_file(dir + "/stdout.log") == "to-stdout\n");
    CHECK(read_file(dir + "/stderr.log") == "to-stderr\n");
  }
  CHECK_FALSE(contains(r.out, "to-stdout"));
  CHECK_FALSE(contains(r.err, "to-stderr"));
}

TEST_CASE("with --tee 1 stdout goes both to its log file and to the console",
          "[agent][integration]") {
  TempDir logs;
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2", "--log_dir", logs.path(), "--tee", "1",
                                    "--rdzv_id", "myrun"},
                                   {"print=to-stdout", "eprint=to-stderr"}),
                       {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string dir0 = run_dir(logs.path(), "myrun") + "/attempt_0/0";
  CHECK(read_file(dir0 + "/stdout.log") == "to-stdout\n");
  CHECK(contains(r.out, "[default0]:to-stdout"));
  CHECK(contains(r.out, "[default1]:to-stdout"));
  // stderr is not teed: console only.
  CHECK(contains(r.err, "[default0]:to-stderr"));
  CHECK_FALSE(fs::exists(dir0 + "/stderr.log"));
}

TEST_CASE("with --local_ranks_filter only the chosen local ranks reach the console",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2", "--local_ranks_filter", "1"},
                                   {"print=out-line", "eprint=err-line"}),
                       {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default1]:out-line"));
  CHECK(contains(r.err, "[default1]:err-line"));
  CHECK_FALSE(contains(r.out, "[default0]"));
  CHECK_FALSE(contains(r.err, "[default0]"));
}

TEST_CASE("a restarted group writes its logs to the next attempt directory",
          "[agent][integration]") {
  TempDir logs;
  auto r = run_command(ddprun_fake({"--log_dir", logs.path(), "--redirects", "3", "--rdzv_id",
                                    "myrun", "--max_restarts", "1"},
                                   {"env=TORCHELASTIC_RESTART_COUNT", "exit_if_restart=0:1"}),
                       {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string run = run_dir(logs.path(), "myrun");
  CHECK(read_file(run + "/attempt_0/0/stdout.log") == "TORCHELASTIC_RESTART_COUNT=0\n");
  CHECK(read_file(run + "/attempt_1/0/stdout.log") == "TORCHELASTIC_RESTART_COUNT=1\n");
  CHECK_FALSE(fs::exists(run + "/attempt_2"));
}

TEST_CASE("lines matching --duplicate_stdout_filters are also copied to filtered_stdout.log",
          "[agent][integration]") {
  TempDir logs;
  auto r = run_command(
      ddprun_fake(
          {"--nproc_per_node", "2", "--log_dir", logs.path(), "--rdzv_id", "myrun",
           "--duplicate_stdout_filters", "keep,,this", "--duplicate-stderr-filters", "warn"},
          {"print=keep,this one", "print=drop this", "eprint=warn here", "eprint=quiet"}),
      {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string attempt = run_dir(logs.path(), "myrun") + "/attempt_0";
  auto out_lines = lines_of(read_file(attempt + "/filtered_stdout.log"));
  std::sort(out_lines.begin(), out_lines.end());
  CHECK(out_lines ==
        std::vector<std::string>{"[default0]:keep,this one", "[default1]:keep,this one"});
  auto err_lines = lines_of(read_file(attempt + "/filtered_stderr.log"));
  std::sort(err_lines.begin(), err_lines.end());
  CHECK(err_lines == std::vector<std::string>{"[default0]:warn here", "[default1]:warn here"});
  // The console still gets every line.
  CHECK(contains(r.out, "[default0]:drop this"));
}

TEST_CASE("with --redirects 3 --tee 3 worker lines reach both the console and the files",
          "[agent][integration]") {
  TempDir logs;
  auto r = run_command(ddprun_fake({"--log_dir", logs.path(), "--redirects", "3", "--tee", "3",
                                    "--rdzv_id", "myrun"},
                                   {"print=to-stdout", "eprint=to-stderr"}),
                       {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string dir = run_dir(logs.path(), "myrun") + "/attempt_0/0";
  CHECK(read_file(dir + "/stdout.log") == "to-stdout\n");
  CHECK(read_file(dir + "/stderr.log") == "to-stderr\n");
  CHECK(contains(r.out, "[default0]:to-stdout"));
  CHECK(contains(r.err, "[default0]:to-stderr"));
}

TEST_CASE("two runs with the same --log_dir and --rdzv_id keep both runs' logs",
          "[agent][integration]") {
  TempDir logs;
  for (const std::string text : {"first", "second"}) {
    auto r =
        run_command(ddprun_fake({"--log_dir", logs.path(), "--redirects", "3"}, {"print=" + text}),
                    {}, kJobLimit);
    INFO(r.err);
    CHECK(r.exit_code == 0);
  }
  // The default --rdzv_id is "none": <log_dir>/none_<random> per run, as torchrun names them.
  std::vector<std::string> seen;
  for (const auto& entry : fs::directory_iterator(logs.path())) {
    const std::string name = entry.path().filename().string();
    CHECK(name.rfind("none_", 0) == 0);
    seen.push_back(read_file(entry.path().string() + "/attempt_0/0/stdout.log"));
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<std::string>{"first\n", "second\n"});
}

TEST_CASE("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE sets the console prefix of every worker line",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2"}, {"print=hello", "eprint=oops"}),
                       {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}-rank${rank}]: "}},
                       kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default-rank0]: hello"));
  CHECK(contains(r.out, "[default-rank1]: hello"));
  CHECK(contains(r.err, "[default-rank1]: oops"));
  CHECK_FALSE(contains(r.out, "[default0]:"));
}

TEST_CASE("with --dedup_output a line that 8 ranks print shows once and the log files keep all",
          "[agent][integration]") {
  TempDir logs;
  // A window far longer than the job: the lines are shown when the group's output ends.
  auto r = run_command(ddprun_fake({"--nproc_per_node", "8", "--dedup_output", "30", "--tee", "1",
                                    "--log_dir", logs.path(), "--rdzv_id", "dedup"},
                                   {"print=same-line", "env=LOCAL_RANK"}),
                       {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  const auto count = [&](const std::string& text) {
    size_t n = 0;
    for (size_t at = r.out.find(text); at != std::string::npos; at = r.out.find(text, at + 1)) ++n;
    return n;
  };
  CHECK(count("[default0-7]:same-line\n") == 1);
  CHECK(count("same-line") == 1);
  for (int rank = 0; rank < 8; ++rank) {
    const std::string own = "LOCAL_RANK=" + std::to_string(rank);
    CHECK(count("[default" + std::to_string(rank) + "]:" + own + "\n") == 1);
    CHECK(read_file(run_dir(logs.path(), "dedup") + "/attempt_0/" + std::to_string(rank) +
                    "/stdout.log") == "same-line\n" + own + "\n");
  }
}

TEST_CASE("a --dedup_output window it cannot honour is refused", "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--dedup_output", "-1"}, {"print=x"}), {}, kJobLimit);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "--dedup_output"));
  CHECK(contains(r.err, "from 0 (off) to 60"));
}
