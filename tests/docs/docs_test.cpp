// The docs cannot rot: every shell block in README.md and docs/*.md runs against the built
// binaries (or says why it cannot), every ddprun flag is documented, every flag the docs name
// exists, and every message docs/operations.md explains is one the code prints.
//
// The convention (docs/design.md#the-docs-are-tested repeats it for writers):
//   - every fenced block has an info string: sh for commands, text for output, cpp, ini, ...;
//   - an sh block runs as one bash script (-e -o pipefail) in a scratch directory that looks
//     like the repository root (build/ is this build, examples/ and scripts/ are the sources),
//     with build/bin first on PATH; the blocks of one page run in order in the same directory;
//   - HTML comments right above the fence adjust it, one directive each:
//       <!-- doc-test: skip: REASON -->  not run (a real cluster, apt-get, a rebuild)
//       <!-- doc-test: exit N -->        the expected exit status (default 0)
//       <!-- doc-test: output: TEXT -->  stdout or stderr contains TEXT
//       <!-- doc-test: needs sdk -->     runs when the libtorch worker SDK is built
//       <!-- doc-test: needs torch -->   runs in the [python] case (Debian's python3-torch)
//       <!-- doc-test: timeout N -->     seconds (default 60)
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = DDPRUN_SOURCE_DIR;
const fs::path kBuild = DDPRUN_BUILD_DIR;

/// One fenced block of a markdown page.
struct Block {
  std::string page;  ///< "docs/usage.md"
  int line = 0;      ///< of the opening fence, 1-based
  std::string info;  ///< the info string: "sh", "text", ""
  std::string body;
  std::vector<std::string> directives;  ///< the text after "doc-test:" of each comment above

  std::string where() const { return page + ":" + std::to_string(line); }
  /// The directive's argument when the block has it ("exit 64" -> "64"), else nullopt.
  std::optional<std::string> directive(const std::string& name) const {
    for (const std::string& d : directives) {
      if (d == name) return std::string();
      if (d.rfind(name + " ", 0) == 0 || d.rfind(name + ":", 0) == 0) {
        std::string rest = d.substr(name.size() + 1);
        rest.erase(0, rest.find_first_not_of(' '));
        return rest;
      }
    }
    return std::nullopt;
  }
  std::vector<std::string> all(const std::string& name) const {
    std::vector<std::string> out;
    for (const std::string& d : directives)
      if (d.rfind(name + ":", 0) == 0)
        out.push_back(d.substr(d.find_first_not_of(' ', name.size() + 1)));
    return out;
  }
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

/// The program's path, found on PATH as a shell would (run_command does not search PATH).
std::string which(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return program;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// The markdown pages under test, relative to the source root.
std::vector<std::string> pages() {
  std::vector<std::string> out{"README.md"};
  for (const auto& entry : fs::directory_iterator(kSource / "docs"))
    if (entry.path().extension() == ".md")
      out.push_back("docs/" + entry.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Problems found while reading the blocks (a stray directive, an unclosed fence).
std::vector<std::string> g_parse_problems;

std::vector<Block> blocks_of(const std::string& page) {
  const std::vector<std::string> lines = lines_of(read_file((kSource / page).string()));
  std::vector<Block> blocks;
  std::vector<std::string> pending;  // directives waiting for their fence
  int pending_line = 0;
  static const std::regex kDirective(R"(^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$)");
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string t = trim(lines[i]);
    std::smatch m;
    if (std::regex_match(lines[i], m, kDirective)) {
      if (pending.empty()) pending_line = static_cast<int>(i + 1);
      pending.push_back(m[1]);
      continue;
    }
    if (t.rfind("```", 0) != 0) {
      if (!pending.empty())
        g_parse_problems.push_back(page + ":" + std::to_string(pending_line) +
                                   ": a doc-test directive that is not right above a fence");
      pending.clear();
      continue;
    }
    const size_t indent = lines[i].find('`');
    Block block{page, static_cast<int>(i + 1), trim(t.substr(3)), "", pending};
    pending.clear();
    size_t j = i + 1;
    for (; j < lines.size() && trim(lines[j]) != "```"; ++j) {
      const std::string& l = lines[j];
      block.body +=
          (l.size() >= indent && trim(l.substr(0, indent)).empty() ? l.substr(indent) : l);
      block.body += '\n';
    }
    if (j == lines.size()) g_parse_problems.push_back(block.where() + ": the fence is not closed");
    blocks.push_back(block);
    i = j;
  }
  return blocks;
}

std::vector<Block> all_blocks() {
  std::vector<Block> out;
  for (const std::string& page : pages()) {
    auto blocks = blocks_of(page);
    out.insert(out.end(), blocks.begin(), blocks.end());
  }
  return out;
}

bool is_shell(const Block& b) { return b.info == "sh"; }

/// A line in a non-sh block that reads like a command someone should be able to paste.
bool looks_like_command(const std::string& line) {
  static const std::regex kCommand(
      R"(^\s*(\$ |(build/bin/)?ddprun(-rdzvd)? +(-|status |events )|bash scripts/|cmake |srun |sudo |apt-get ).*)");
  // A synopsis ("ddprun status --rdzv_endpoint HOST:PORT [--json]") is not a command to paste.
  return std::regex_match(line, kCommand) && line.find(" [") == std::string::npos;
}

// ---- running the blocks ------------------------------------------------------------------

/// A scratch repository root for one page: build/ is this build, the sources are linked, and
/// train.py, mypkg.train and ./my_trainer (the docs' stand-ins for a user's program) exist.
void prepare_workdir(const fs::path& dir) {
  fs::create_directory_symlink(kBuild, dir / "build");
  for (const char* name : {"examples", "scripts", "docs", "tests"})
    fs::create_directory_symlink(kSource / name, dir / name);
  std::ofstream(dir / "train.py")
      << "import os, sys\nprint('train.py rank', os.environ['RANK'], 'of', "
         "os.environ['WORLD_SIZE'], 'args', sys.argv[1:])\n";
  fs::create_directory(dir / "mypkg");
  std::ofstream(dir / "mypkg" / "__init__.py");
  std::ofstream(dir / "mypkg" / "train.py")
      << "import os\nprint('mypkg.train rank', os.environ['RANK'])\n";
  std::ofstream(dir / "my_trainer") << "#!/bin/sh\necho \"my_trainer rank $RANK: $*\"\n";
  fs::permissions(dir / "my_trainer", fs::perms::owner_all | fs::perms::group_read |
                                          fs::perms::group_exec | fs::perms::others_read |
                                          fs::perms::others_exec);
}

/// Runs the sh blocks of each page that `select` picks, in order, one scratch directory per page.
void run_blocks(const std::function<bool(const Block&)>& select) {
  std::map<std::string, std::vector<Block>> by_page;
  for (const Block& b : all_blocks())
    if (is_shell(b) && !b.directive("skip") && select(b)) by_page[b.page].push_back(b);
  int ran = 0;
  for (const auto& [page, blocks] : by_page) {
    TempDir dir;
    prepare_workdir(dir.path());
    for (const Block& b : blocks) {
      const std::string script = dir.path() + "/.doc-test-block.sh";
      std::ofstream(script) << "cd '" << dir.path() << "'\n" << b.body;
      const int limit_s = b.directive("timeout") ? std::stoi(*b.directive("timeout")) : 60;
      const char* path = std::getenv("PATH");
      auto r = run_command(
          {which("timeout"), "-k", "5", std::to_string(limit_s), which("bash"), "-e", "-o",
           "pipefail", script},
          {{"PATH", (kBuild / "bin").string() + ":" + (path ? path : "/usr/bin:/bin")},
           // Debian's interpreter, which has python3-torch (another python3 may come first).
           {"PYTHON_EXEC", "/usr/bin/python3"}},
          std::chrono::seconds(limit_s + 15));
      const int expected = b.directive("exit") ? std::stoi(*b.directive("exit")) : 0;
      INFO(b.where() << ":\n" << b.body << "--- stdout:\n" << r.out << "--- stderr:\n" << r.err);
      CHECK(r.exit_code == expected);
      for (const std::string& text : b.all("output"))
        CHECK((r.out.find(text) != std::string::npos || r.err.find(text) != std::string::npos));
      ++ran;
    }
  }
  WARN(ran << " doc blocks ran");
  CHECK(ran > 0);
}

// ---- flags -------------------------------------------------------------------------------

/// The long and short flags on the option lines of a --help text ("  -r, --redirects STD").
std::set<std::string> flags_in_help(const std::string& help) {
  std::set<std::string> flags;
  static const std::regex kFlag(R"((?:^|[\s,])(--?[a-zA-Z][a-zA-Z0-9_-]*))");
  for (const std::string& line : lines_of(help)) {
    const std::string t = trim(line);
    if (t.empty() || t[0] != '-') continue;
    // Only the names before the description: up to two spaces in a row after the names.
    std::string names = t.substr(0, t.find("  "));
    for (auto it = std::sregex_iterator(names.begin(), names.end(), kFlag);
         it != std::sregex_iterator(); ++it)
      flags.insert((*it)[1]);
  }
  return flags;
}

/// The flags of a --help text that take a value: their option line ends with a metavar.
std::set<std::string> flags_with_values(const std::string& help) {
  std::set<std::string> flags;
  for (const std::string& line : lines_of(help)) {
    const std::string t = trim(line);
    if (t.empty() || t[0] != '-') continue;
    std::istringstream names(t.substr(0, t.find("  ")));
    std::vector<std::string> words;
    for (std::string w; names >> w;) words.push_back(w);
    if (words.size() < 2 || words.back()[0] == '-') continue;
    for (const std::string& line_flags : flags_in_help(t)) flags.insert(line_flags);
  }
  return flags;
}

/// The words of every ddprun command line in the docs' code blocks (continuation lines joined),
/// from the word after "ddprun" to the end of the line.
std::vector<std::pair<std::vector<std::string>, std::string>> ddprun_command_lines() {
  std::vector<std::pair<std::vector<std::string>, std::string>> out;
  for (const std::string& page : pages()) {
    for (const Block& b : blocks_of(page)) {
      const std::string body = std::regex_replace(b.body, std::regex(R"(\\\n)"), " ");
      for (const std::string& line : lines_of(body)) {
        std::istringstream in(line);
        std::vector<std::string> words;
        for (std::string w; in >> w;) words.push_back(w);
        for (size_t i = 0; i < words.size(); ++i) {
          const std::string& w = words[i];
          if (w == "ddprun" || (w.size() > 7 && w.compare(w.size() - 7, 7, "/ddprun") == 0))
            out.emplace_back(std::vector<std::string>(words.begin() + i + 1, words.end()),
                             b.where());
        }
      }
    }
  }
  return out;
}

std::string help_of(const std::vector<std::string>& argv) {
  auto r = run_command(argv, {}, std::chrono::seconds(30));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

/// The dashed spelling of an underscored flag.
std::string dashed(std::string flag) {
  std::replace(flag.begin() + 2, flag.end(), '_', '-');
  return flag;
}

/// The flags of a --help text, the dashed spelling of an underscored one left out.
std::set<std::string> underscored_flags(const std::string& help) {
  const std::set<std::string> all = flags_in_help(help);
  std::set<std::string> out;
  for (const std::string& flag : all) {
    std::string underscored = flag;
    if (flag.size() > 2) std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
    if (underscored == flag || all.count(underscored) == 0) out.insert(flag);
  }
  return out;
}

/// Flags of other programs that the docs show, by program.
const std::set<std::string> kForeignFlags = {
    // srun, sbatch and scancel (usage.md#slurm)
    "--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--signal", "--batch",
    "--requeue", "--kill-on-bad-exit",
    // etcd (operations.md#troubleshooting)
    "--max-request-bytes",
    // cmake and ctest
    "--build", "--install", "--test-dir", "--target", "--prefix",
    // the linker (benchmarks.md)
    "--gc-sections",
    // pkg-config (sdk.md)
    "--cflags", "--libs",
    // examples/ddp_train.cpp and examples/ddp_train.py
    "--snapshot_path", "--batch_size", "--fail_rank", "--fail_epoch", "--fail_kill", "--print_env",
    "--overlap", "--keep_snapshots", "--dataset_size", "--dump_params", "--poll_checkpoint_every",
    "--request_checkpoint_rank", "--request_checkpoint_step", "--fail_when_file",
    // tests/fault's ddprun-fault (design.md#fault-injection)
    "--rounds", "--seed", "--round", "--faults", "--nproc", "--verbose",
    // bench/launch_bench.py and bench/rdzv_bench.py (benchmarks.md)
    "--ddprun", "--ddprun-before", "--runs", "--baseline-runs", "--markdown", "--reps",
    "--torch-reps", "--loss-reps",
    // bench/rdzv_attack_bench.py, bench/rdzv_attacker.py, ddprun-rdzv-bench (benchmarks.md)
    "--mode", "--jobs", "--round-gap-ms", "--duration", "--warmup", "--rate", "--hold", "--repeats",
    "--refused-hellos", "--hosting-agent", "--no-secret", "--flood-threads", "--procs", "--victim",
    "--keep-alive-interval",
    // ddprun-store-bench and bench/store_scale_bench.py (benchmarks.md#the-agent-store-at-scale)
    "--ranks", "--dialect", "--callback", "--exchange", "--barrier", "--ranks-per-address",
    "--connect-window", "--serve", "--servers", "--before", "--bench", "--json",
    // bench/recovery_bench.py and bench/python_launch_bench.py (benchmarks.md)
    "--series",
    // the GPU machine's check: scripts/device_check.sh, and the benches' options for a GPU
    // (examples/ddp_train.cpp's too)
    "--dry-run", "--sdk-build", "--parts", "--budget", "--recovery-series", "--recovery-runs",
    "--device", "--hidden", "--ddp_train", "--python", "--torchrun", "--settle", "--mark_file",
    // nvidia-smi (benchmarks.md#on-a-gpu-nvidia-h200-torch-211-nccl)
    "--query-compute-apps", "--query-gpu",
    // bench/cleanup_bench.py (benchmarks.md)
    "--kinds", "--seconds", "--background", "--workers",
    // bench/crash_loop_bench.py and bench/backoff_bench.py (benchmarks.md)
    "--only", "--restarts", "--backoff",
    // ddprun's Python bootstrap, agent/python/ddprun_standby.py (design.md#standby-workers)
    "--zygote", "--preload", "--room",
    // systemctl, apt-get, python3 -m venv
    "--now", "--no-install-recommends", "--system-site-packages",
    // usage.md's "--flag value" and the stand-ins' own arguments
    "--flag", "--lr", "--epochs", "--out",
    // what --local_rank_arg passes to a script written for torch.distributed.launch
    "--local-rank", "--local_rank",
    // bench/goodput_bench.py (benchmarks.md)
    "--partition-for", "--gap", "--return-after", "--snapshot-every", "--step-sleep",
    // etcd and etcdctl (operations.md#the-rendezvous-on-etcd), etcd_rdzv_bench and
    // bench/torch_rdzv_bench.py --backend etcd-v2 (benchmarks.md)
    "--enable-v2", "--endpoints", "--rdzvd", "--timeout", "--backend", "--max-request-bytes"};

/// The man pages, relative to the source root.
const std::vector<const char*> kManPages = {"docs/ddprun.1", "docs/ddprun-rdzvd.1",
                                            "docs/ddprun-snapshot.1"};

/// Every "--flag" token inside inline code spans, code blocks and the man page.
std::map<std::string, std::string> flags_named_in_docs() {
  std::map<std::string, std::string> found;  // flag -> where
  static const std::regex kFlag(R"((?:^|[\s\[(`=,])(--[a-zA-Z][a-zA-Z0-9_-]*))");
  auto scan = [&](const std::string& text, const std::string& where) {
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kFlag);
         it != std::sregex_iterator(); ++it)
      found.emplace((*it)[1], where);
  };
  for (const std::string& page : pages()) {
    for (const Block& b : blocks_of(page)) scan(b.body, b.where());
    int n = 0;
    bool in_fence = false;
    for (const std::string& line : lines_of(read_file((kSource / page).string()))) {
      ++n;
      if (trim(line).rfind("```", 0) == 0) in_fence = !in_fence;
      if (in_fence) continue;
      static const std::regex kSpan("`([^`]+)`");
      for (auto it = std::sregex_iterator(line.begin(), line.end(), kSpan);
           it != std::sregex_iterator(); ++it)
        scan((*it)[1], page + ":" + std::to_string(n));
    }
  }
  for (const char* page : kManPages) {
    std::string man = read_file((kSource / page).string());
    man = std::regex_replace(man, std::regex(R"(\\-)"), "-");
    scan(man, page);
  }
  return found;
}

// ---- messages ----------------------------------------------------------------------------

/// The string literals of the C++ sources of ddprun and ddprun-rdzvd (adjacent literals joined),
/// cut at the format placeholders {} and %s.
std::vector<std::string> source_literals() {
  std::vector<std::string> literals;
  for (const char* dir : {"common", "rendezvous", "launcher", "agent", "etcd"}) {
    for (const auto& entry : fs::directory_iterator(kSource / dir)) {
      const auto ext = entry.path().extension();
      if (ext != ".cpp" && ext != ".h") continue;
      const std::string code = read_file(entry.path().string());
      std::string current;
      bool joining = false;  // only whitespace since the last literal closed
      for (size_t i = 0; i < code.size(); ++i) {
        const char c = code[i];
        if (c == '/' && i + 1 < code.size() && code[i + 1] == '/') {
          i = code.find('\n', i);
          if (i == std::string::npos) break;
          continue;
        }
        if (c == '/' && i + 1 < code.size() && code[i + 1] == '*') {
          i = code.find("*/", i);
          if (i == std::string::npos) break;
          ++i;
          continue;
        }
        if (c == '\'' && i > 0 && std::isalnum(static_cast<unsigned char>(code[i - 1]))) {
          continue;  // a digit separator: 60'000
        }
        if (c == '\'') {  // a character literal, e.g. '"'
          i = code.find('\'', i + (code[i + 1] == '\\' ? 3 : 2));
          if (i == std::string::npos) break;
          continue;
        }
        if (c == '"') {
          if (!joining && !current.empty()) {
            literals.push_back(current);
            current.clear();
          }
          for (++i; i < code.size() && code[i] != '"'; ++i) {
            if (code[i] == '\\' && i + 1 < code.size()) {
              ++i;
              current += code[i] == 'n' ? '\n' : code[i];
            } else {
              current += code[i];
            }
          }
          joining = true;
          continue;
        }
        if (!std::isspace(static_cast<unsigned char>(c))) joining = false;
      }
      if (!current.empty()) literals.push_back(current);
    }
  }
  std::vector<std::string> pieces;
  static const std::regex kPlaceholder(R"(\{\}|%s|%d)");
  for (const std::string& literal : literals) {
    for (std::sregex_token_iterator it(literal.begin(), literal.end(), kPlaceholder, -1), end;
         it != end; ++it)
      if (!it->str().empty()) pieces.push_back(*it);
  }
  return pieces;
}

/// Whether `text` is made of source literals: the end of one, whole ones, the start of one.
bool built_from(const std::string& text, const std::vector<std::string>& pieces) {
  if (text.empty()) return true;
  for (const std::string& p : pieces)
    if (p.find(text) != std::string::npos) return true;
  std::vector<bool> reached(text.size() + 1, false);
  for (size_t j = 1; j < text.size(); ++j) {
    const std::string head = text.substr(0, j);
    for (const std::string& p : pieces)
      if (p.size() >= head.size() && p.compare(p.size() - head.size(), head.size(), head) == 0) {
        reached[j] = true;
        break;
      }
  }
  for (size_t i = 1; i < text.size(); ++i) {
    if (!reached[i]) continue;
    const std::string rest = text.substr(i);
    for (const std::string& p : pieces) {
      if (p.compare(0, rest.size(), rest) == 0 && p.size() >= rest.size()) return true;
      if (p.size() >= 2 && p.size() < rest.size() && rest.compare(0, p.size(), p) == 0)
        reached[i + p.size()] = true;
    }
  }
  return reached[text.size()];
}

/// The adjacent string literals that start at `pos` (after white space), joined and unescaped.
std::string literal_at(const std::string& code, size_t pos) {
  std::string text;
  while (true) {
    while (pos < code.size() && std::isspace(static_cast<unsigned char>(code[pos]))) ++pos;
    if (pos >= code.size() || code[pos] != '"') return text;
    for (++pos; pos < code.size() && code[pos] != '"'; ++pos) {
      if (code[pos] == '\\' && pos + 1 < code.size()) ++pos;
      text += code[pos];
    }
    ++pos;
  }
}

/// The format strings of the rendezvous's log lines: spdlog's info, warn and error calls in
/// rendezvous/, the client machine's formatted lines and the warn and error calls in
/// launcher/launch.cpp, "{}" alone left out.
std::vector<std::pair<std::string, std::string>> rendezvous_log_formats() {
  std::vector<std::pair<std::string, std::string>> out;  // format, file
  auto scan = [&](const fs::path& file, const std::vector<std::string>& calls) {
    const std::string code = read_file(file.string());
    for (const std::string& call : calls) {
      for (size_t at = code.find(call); at != std::string::npos; at = code.find(call, at + 1)) {
        const std::string format = literal_at(code, at + call.size());
        if (!format.empty() && format != "{}") out.emplace_back(format, file.filename().string());
      }
    }
  };
  for (const auto& entry : fs::directory_iterator(kSource / "rendezvous"))
    if (entry.path().extension() == ".cpp")
      scan(entry.path(), {"spdlog::info(", "spdlog::warn(", "spdlog::error("});
  scan(kSource / "launcher/launch.cpp", {"spdlog::warn(", "spdlog::error("});
  scan(kSource / "etcd/etcd_rendezvous.cpp", {"spdlog::info(", "spdlog::warn(", "spdlog::error("});
  // The client machine returns its info and warning lines as data (NetworkRendezvous prints
  // them); each is written with fmt::format.
  scan(kSource / "rendezvous/rdzv_client.cpp", {"fmt::format("});
  return out;
}

/// The messages listed in operations.md's troubleshooting section: "- `message`" lines (or
/// "- ``message``" for a message that holds a backtick).
std::vector<std::pair<std::string, int>> troubleshooting_messages() {
  std::vector<std::pair<std::string, int>> out;
  bool in_section = false;
  int n = 0;
  static const std::regex kItem(R"(^- (`+)(.+?)\1\s*$)");
  for (const std::string& line : lines_of(read_file((kSource / "docs/operations.md").string()))) {
    ++n;
    if (line.rfind("## ", 0) == 0) in_section = line == "## Troubleshooting";
    std::smatch m;
    if (in_section && std::regex_match(line, m, kItem)) out.emplace_back(m[2], n);
  }
  return out;
}

}  // namespace

TEST_CASE("every shell block in the docs is run or says why not", "[docs]") {
  g_parse_problems.clear();
  const std::vector<Block> blocks = all_blocks();
  for (const std::string& problem : g_parse_problems) FAIL_CHECK(problem);
  int run = 0;
  int skipped = 0;
  static const std::set<std::string> kKnown = {"skip", "exit", "output", "needs", "timeout"};
  for (const Block& b : blocks) {
    INFO(b.where() << " (```" << b.info << ")");
    CHECK_FALSE(b.info.empty());  // sh for commands, text for output
    for (const std::string& d : b.directives) {
      INFO("directive: " << d);
      const std::string name = d.substr(0, d.find_first_of(" :"));
      CHECK(kKnown.count(name) == 1);
      if (name == "needs") CHECK((d == "needs sdk" || d == "needs torch"));
      CHECK(is_shell(b));  // only commands take directives
    }
    if (!is_shell(b)) {
      for (const std::string& line : lines_of(b.body)) {
        INFO("a command in a ```" << b.info << " block; make it an sh block: " << line);
        CHECK_FALSE(looks_like_command(line));
      }
      continue;
    }
    if (auto reason = b.directive("skip")) {
      INFO("skip needs a reason: <!-- doc-test: skip: why -->");
      CHECK(reason->size() > 3);
      ++skipped;
    } else {
      ++run;
    }
  }
  WARN(run << " sh blocks are run, " << skipped << " are marked not run");
  CHECK(run >= 10);
}

TEST_CASE("the docs' shell blocks run as shown", "[docs]") {
  run_blocks([](const Block& b) {
    if (b.directive("needs") == std::optional<std::string>("torch")) return false;
    if (b.directive("needs") == std::optional<std::string>("sdk") && !DDPRUN_SDK_ENABLED) {
      WARN(b.where() << ": not run, the worker SDK is not built");
      return false;
    }
    return true;
  });
}

TEST_CASE("the docs' shell blocks that need python3-torch run as shown", "[docs][python]") {
  run_blocks(
      [](const Block& b) { return b.directive("needs") == std::optional<std::string>("torch"); });
}

TEST_CASE("every ddprun flag is in the man page and in usage.md or migrating.md", "[docs]") {
  const std::set<std::string> flags = flags_in_help(help_of({DDPRUN_BIN, "--help"}));
  REQUIRE(flags.count("--nproc_per_node") == 1);
  REQUIRE(flags.count("-r") == 1);
  std::string man = read_file((kSource / "docs/ddprun.1").string());
  man = std::regex_replace(man, std::regex(R"(\\-)"), "-");
  const std::string usage = read_file((kSource / "docs/usage.md").string()) +
                            read_file((kSource / "docs/migrating.md").string());
  auto named = [](const std::string& text, const std::string& flag) {
    const std::regex word("(^|[^a-zA-Z0-9_-])" + flag + "([^a-zA-Z0-9_-]|$)");
    return std::regex_search(text, word);
  };
  for (const std::string& flag : flags) {
    INFO(flag);
    CHECK(named(man, flag));
    CHECK(named(usage, flag));
  }
  // The subcommands' flags are in the man page too.
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {DDPRUN_BIN, "status", "--help"}, {DDPRUN_BIN, "events", "summarize", "--help"}}) {
    for (const std::string& flag : flags_in_help(help_of(argv))) {
      INFO(argv[1] << " " << flag);
      CHECK(named(man, flag));
    }
  }
}

TEST_CASE("every flag the docs name exists", "[docs]") {
  std::set<std::string> known = kForeignFlags;
  for (const auto& argv :
       std::vector<std::vector<std::string>>{{DDPRUN_BIN, "--help"},
                                             {DDPRUN_BIN, "status", "--help"},
                                             {DDPRUN_BIN, "events", "summarize", "--help"},
                                             {RDZVD_BIN, "--help"}}) {
    for (const std::string& flag : flags_in_help(help_of(argv))) {
      known.insert(flag);
      if (flag.size() > 2 && flag[1] == '-') known.insert(dashed(flag));
    }
  }
  const auto found = flags_named_in_docs();
  CHECK(found.size() > 30);
  for (const auto& [flag, where] : found) {
    INFO(where << " names " << flag);
    CHECK(known.count(flag) == 1);
  }
}

TEST_CASE("every ddprun command line in the docs passes only ddprun's flags", "[docs]") {
  const std::string main_help = help_of({DDPRUN_BIN, "--help"});
  const std::string status_help = help_of({DDPRUN_BIN, "status", "--help"});
  int checked = 0;
  for (const auto& [words, where] : ddprun_command_lines()) {
    if (!words.empty() && words.front() == "events") continue;  // "summarize PATH [--json]"
    const bool status = !words.empty() && words.front() == "status";
    const std::string& help = status ? status_help : main_help;
    std::set<std::string> known;
    for (const std::string& flag : flags_in_help(help)) known.insert({flag, dashed(flag)});
    std::set<std::string> with_value;
    for (const std::string& flag : flags_with_values(help)) with_value.insert({flag, dashed(flag)});
    for (size_t i = status ? 1 : 0; i < words.size(); ++i) {
      const std::string& w = words[i];
      if (w.empty() || w[0] != '-' || w == "--") break;  // the script, a pipe, a comment
      const std::string name = w.substr(0, w.find('='));
      INFO(where << ": ddprun " << (status ? "status " : "") << "does not take " << name);
      CHECK(known.count(name) == 1);
      if (with_value.count(name) && w.find('=') == std::string::npos) ++i;
      ++checked;
    }
  }
  CHECK(checked > 50);
}

TEST_CASE("every message operations.md explains is one the code prints", "[docs]") {
  const std::vector<std::string> pieces = source_literals();
  const auto messages = troubleshooting_messages();
  CHECK(messages.size() >= 30);
  static const std::regex kPlaceholder("<[a-zA-Z0-9_ .-]+>");
  for (const auto& [message, line] : messages) {
    INFO("docs/operations.md:" << line << ": " << message);
    for (std::sregex_token_iterator it(message.begin(), message.end(), kPlaceholder, -1), end;
         it != end; ++it) {
      INFO("this text is not in the source: '" << it->str() << "'");
      CHECK(built_from(*it, pieces));
    }
  }
}

TEST_CASE("every rendezvous log line is explained in operations.md", "[docs]") {
  const auto messages = troubleshooting_messages();
  const auto formats = rendezvous_log_formats();
  CHECK(formats.size() >= 10);
  // A message as a pattern: its <placeholders> stand for any text.
  std::vector<std::regex> patterns;
  static const std::regex kSpecial(R"([.^$|()\[\]{}*+?\\])");
  static const std::regex kPlaceholder("<[a-zA-Z0-9_ .-]+>");
  for (const auto& [message, line] : messages) {
    std::string pattern;
    std::string rest = message;
    for (std::smatch m; std::regex_search(rest, m, kPlaceholder); rest = m.suffix())
      pattern += std::regex_replace(m.prefix().str(), kSpecial, "\\$&") + "[\\s\\S]+";
    pattern += std::regex_replace(rest, kSpecial, "\\$&");
    patterns.emplace_back(pattern);
  }
  for (const auto& [format, file] : formats) {
    INFO(file << ": \"" << format << "\" has no entry in operations.md's Troubleshooting");
    const std::string sample = std::regex_replace(format, std::regex(R"(\{\})"), "\x01");
    CHECK(std::any_of(patterns.begin(), patterns.end(),
                      [&](const std::regex& p) { return std::regex_match(sample, p); }));
  }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
std::string slug(const std::string& heading) {
  std::string out;
  for (char c : heading) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_')
      out += static_cast<char>(std::tolower(u));
    else if (c == ' ')
      out += '-';
  }
  return out;
}

TEST_CASE("every link between the docs leads to a file and a heading that exist", "[docs]") {
  static const std::regex kLink(R"(\]\(([^)#\s]*)(#[^)\s]+)?\))");
  int checked = 0;
  for (const std::string& page : pages()) {
    const std::string text = read_file((kSource / page).string());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kLink);
         it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1];
      const std::string anchor = (*it)[2];
      if (target.rfind("http", 0) == 0) continue;
      const fs::path file =
          target.empty() ? kSource / page : (kSource / page).parent_path() / target;
      INFO(page << " links to " << target << anchor);
      REQUIRE(fs::exists(file));
      ++checked;
      if (anchor.empty()) continue;
      std::set<std::string> anchors;
      bool in_fence = false;  // "#SBATCH" in a code block is no heading
      for (const std::string& line : lines_of(read_file(file.string()))) {
        if (trim(line).rfind("```", 0) == 0) in_fence = !in_fence;
        static const std::regex kHeading("^#{1,6} (.*)$");
        std::smatch m;
        if (!in_fence && std::regex_match(line, m, kHeading)) anchors.insert(slug(trim(m[1])));
      }
      CHECK(anchors.count(anchor.substr(1)) == 1);
    }
  }
  CHECK(checked > 20);
}

TEST_CASE("the man pages render without warnings", "[docs]") {
  for (const char* page : kManPages) {
    auto r = run_command({which("groff"), "-man", "-Tutf8", "-ww", "-z", (kSource / page).string()},
                         {}, std::chrono::seconds(30));
    INFO(page << ": " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.err.empty());
  }
}

TEST_CASE("every ddprun-rdzvd flag is in its man page and operations.md", "[docs]") {
  const std::set<std::string> flags = underscored_flags(help_of({RDZVD_BIN, "--help"}));
  REQUIRE(flags.count("--secret_file") == 1);
  std::string man = read_file((kSource / "docs/ddprun-rdzvd.1").string());
  man = std::regex_replace(man, std::regex(R"(\\-)"), "-");
  const std::string operations = read_file((kSource / "docs/operations.md").string());
  for (const std::string& flag : flags) {
    INFO(flag);
    const std::regex word("(^|[^a-zA-Z0-9_-])" + flag + "([^a-zA-Z0-9_-]|$)");
    CHECK(std::regex_search(man, word));
    CHECK(std::regex_search(operations, word));
  }
}

// ---- bash completion ---------------------------------------------------------------------

const fs::path kCompletion = kSource / "packaging/ddprun.bash-completion";

/// The words of the completion script's list variable `name` ("_ddprun_switches").
std::set<std::string> completion_list(const std::string& name) {
  const std::string script = read_file(kCompletion.string());
  std::smatch m;
  REQUIRE(std::regex_search(script, m, std::regex("\n" + name + "=\"([^\"]*)\"")));
  std::istringstream words(m[1].str());
  std::set<std::string> out;
  for (std::string w; words >> w;) out.insert(w);
  return out;
}

TEST_CASE("the bash completion offers exactly ddprun's flags", "[docs]") {
  std::set<std::string> offered = completion_list("_ddprun_value_options");
  for (const std::string& flag : completion_list("_ddprun_switches")) offered.insert(flag);
  CHECK(offered == underscored_flags(help_of({DDPRUN_BIN, "--help"})));
  std::set<std::string> status = completion_list("_ddprun_status_value_options");
  for (const std::string& flag : completion_list("_ddprun_status_switches")) status.insert(flag);
  CHECK(status == underscored_flags(help_of({DDPRUN_BIN, "status", "--help"})));
  // A value option is one whose help line names a value.
  const std::set<std::string> with_values = flags_with_values(help_of({DDPRUN_BIN, "--help"}));
  for (const std::string& flag : completion_list("_ddprun_value_options")) {
    INFO(flag << " is listed as taking a value");
    CHECK(with_values.count(flag) == 1);
  }
}

TEST_CASE("the bash completion completes flags, their values and subcommands", "[docs]") {
  // The completion function called as bash calls it, with COMP_WORDS and COMP_CWORD set.
  // In an empty directory: where a word is no subcommand, bash offers the files around it.
  TempDir empty;
  auto complete = [&empty](const std::vector<std::string>& words) {
    std::string script =
        "cd '" + empty.path() + "' && source '" + kCompletion.string() + "'\nCOMP_WORDS=(";
    for (const std::string& w : words) script += "'" + w + "' ";
    script += ")\nCOMP_CWORD=" + std::to_string(words.size() - 1) +
              "\n_ddprun\necho \"${COMPREPLY[*]}\"\n";
    auto r = run_command({which("bash"), "-c", script}, {}, std::chrono::seconds(30));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return trim(r.out.substr(0, r.out.find('\n')));
  };
  CHECK(complete({"ddprun", "--nproc"}) == "--nproc_per_node");
  CHECK(complete({"ddprun", "--nproc-p"}) == "--nproc-per-node");
  CHECK(complete({"ddprun", "--rdzv_backend", ""}) == "static c10d etcd-v3");
  CHECK(complete({"ddprun", "--standby_workers=a"}) == "--standby_workers=auto");
  CHECK(complete({"ddprun", "st"}) == "status");
  CHECK(complete({"ddprun", "status", "--rdzv_e"}) == "--rdzv_endpoint");
  CHECK(complete({"ddprun", "events", "s"}) == "summarize");
  // After the training script, the words are the script's: no ddprun flag is offered.
  CHECK(complete({"ddprun", "--nnodes", "2", "train.py", "--nproc"}).empty());
}
