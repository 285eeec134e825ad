#include "agent/worker_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/strings.h"

namespace ddprun::agent {

const char* const kRunPathCode =
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
    "run_name='__main__')";

bool runs_under_python(const CommandRequest& req,
                       const std::function<bool(const std::string&)>& is_program_file) {
  const bool is_py = req.script.size() >= 3 && req.script.ends_with(".py");
  return req.run_path || (!req.no_python && (req.module || is_py || !is_program_file(req.script)));
}

std::vector<std::string> build_worker_command(
    const CommandRequest& req, const std::function<bool(const std::string&)>& is_program_file) {
  std::vector<std::string> argv;
  if (!runs_under_python(req, is_program_file)) {
    // Found in the working directory, where `python -u script` would have read it: a name
    // without a '/' would be searched through PATH when it starts.
    const bool here = !req.no_python && req.script.find('/') == std::string::npos;
    argv.push_back(here ? "./" + req.script : req.script);
  } else {
    argv = {req.python_exec, "-u"};
    if (req.run_path) {
      argv.insert(argv.end(), {"-c", kRunPathCode});
    } else if (req.module) {
      argv.push_back("-m");
    }
    argv.push_back(req.script);
  }
  if (!req.local_rank_arg.empty()) argv.push_back("--" + req.local_rank_arg + "=${local_rank}");
  argv.insert(argv.end(), req.script_args.begin(), req.script_args.end());
  return argv;
}

std::vector<std::string> argv_for_local_rank(const std::vector<std::string>& argv, int local_rank) {
  const std::string value = std::to_string(local_rank);
  auto value_of = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "local_rank") return value;
    return std::nullopt;
  };
  std::vector<std::string> out;
  out.reserve(argv.size());
  for (size_t i = 0; i < argv.size(); ++i)
    out.push_back(i == 0 || argv[i].find('$') == std::string::npos
                      ? argv[i]
                      : common::safe_substitute(argv[i], value_of));
  return out;
}

namespace {

/// Where the script (or module) is in a `python -u [-m|-c CODE] script args` command.
size_t script_index(const std::vector<std::string>& worker_argv) {
  if (worker_argv.size() > 2 && worker_argv[2] == "-c") return 4;
  if (worker_argv.size() > 2 && worker_argv[2] == "-m") return 3;
  return 2;
}

}  // namespace

std::vector<std::string> standby_script_argv(const std::vector<std::string>& worker_argv,
                                             int local_rank) {
  const std::vector<std::string> own = argv_for_local_rank(worker_argv, local_rank);
  if (own == worker_argv) return {};
  const size_t at = std::min(script_index(worker_argv), own.size());
  return std::vector<std::string>(own.begin() + static_cast<std::ptrdiff_t>(at), own.end());
}

std::vector<std::string> build_python_standby_command(const std::vector<std::string>& worker_argv,
                                                      const std::string& bootstrap,
                                                      const PythonStandbyOptions& options,
                                                      bool zygote) {
  // worker_argv is {python, "-u", [-m | -c kRunPathCode,] script, args...}.
  std::vector<std::string> argv{worker_argv.at(0), "-u", bootstrap};
  if (zygote) argv.push_back("--zygote");
  // Room where the kernel keeps the arguments and the environment: the bootstrap puts the
  // worker's there once it is one (show_as in ddprun_standby.py), and the worker's environment
  // is larger than the standby's.
  argv.push_back(std::string(kPythonStandbyRoomPrefix) + std::string(kPythonStandbyRoom, '.'));
  if (!options.preload.empty()) argv.push_back("--preload=" + common::join(options.preload, ","));
  if (options.cuda == StandbyCuda::Context) argv.push_back("--cuda=context");
  if (options.cuda == StandbyCuda::Warm) argv.push_back("--cuda=warm");
  const bool run_path = script_index(worker_argv) == 4;
  if (run_path) argv.push_back("--run-path");
  argv.push_back("--");
  argv.insert(argv.end(), worker_argv.begin() + (run_path ? 4 : 2), worker_argv.end());
  return argv;
}

bool source_imports_torch(const std::string& source) {
  std::istringstream lines(source);
  for (std::string line; std::getline(lines, line);) {
    const auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    std::istringstream words(line.substr(start));
    std::string keyword;
    words >> keyword;
    if (keyword != "import" && keyword != "from") continue;
    // The module names: up to "import" after from, up to "as"/";"/"#" after import.
    for (std::string word; words >> word;) {
      if (word == "import" || word == "as" || word[0] == '#' || word[0] == ';') break;
      for (std::string name; !word.empty();) {
        const auto comma = word.find(',');
        name = word.substr(0, comma);
        if (name == "torch" || name.rfind("torch.", 0) == 0) return true;
        word = comma == std::string::npos ? "" : word.substr(comma + 1);
      }
      if (keyword == "from") break;  // `from x import torch` imports x's torch, not torch
    }
  }
  return false;
}

std::vector<std::string> imported_modules(const std::string& source, size_t limit) {
  std::vector<std::string> out;
  auto add = [&out, limit](const std::string& name) {
    if (name.empty() || name[0] == '.' || out.size() >= limit) return;
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  };
  std::istringstream lines(source);
  for (std::string line; std::getline(lines, line);) {
    line = line.substr(0, line.find('#'));
    std::replace(line.begin(), line.end(), ',', ' ');
    std::replace(line.begin(), line.end(), '(', ' ');
    std::replace(line.begin(), line.end(), ')', ' ');
    std::istringstream words(line.substr(0, line.find(';')));
    std::string keyword;
    words >> keyword;
    if (keyword == "import") {
      std::string previous;
      for (std::string word; words >> word; previous = word)
        if (word != "as" && previous != "as") add(word);
    } else if (keyword == "from") {
      std::string package;
      std::string word;
      if (!(words >> package) || !(words >> word) || word != "import") continue;
      add(package);
      if (package[0] == '.') continue;
      std::string previous;
      for (; words >> word; previous = word)
        if (word != "as" && previous != "as" && word != "*") add(package + "." + word);
    }
  }
  return out;
}

std::string python_source_of(const CommandRequest& req, const std::string& cwd) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (!req.module) {
    candidates.push_back(fs::path(req.script));
  } else {
    fs::path base = fs::path(cwd);
    std::string rest = req.script;
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      base /= rest.substr(0, dot);
      rest = rest.substr(dot + 1);
    }
    candidates.push_back(base / (rest + ".py"));
    candidates.push_back(base / rest / "__main__.py");
  }
  for (const fs::path& path : candidates) {
    std::ifstream in(path.is_absolute() ? path : fs::path(cwd) / path, std::ios::binary);
    if (!in) continue;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  return "";
}

std::string find_python_bootstrap(const std::string& ddprun_executable) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path candidate = fs::path(ddprun_executable).parent_path().parent_path() / "share" /
                             "ddprun" / "ddprun_standby.py";
  return fs::is_regular_file(candidate, ec) ? candidate.string() : "";
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::optional<std::string> shebang_python(std::string_view start) {
  if (!start.starts_with("#!")) return std::nullopt;
  const std::string_view line = start.substr(2, start.find('\n') - 2);
  std::vector<std::string_view> words;
  for (std::size_t at = 0; at < line.size();) {
    const std::size_t begin = line.find_first_not_of(" \t\r", at);
    if (begin == std::string_view::npos) break;
    const std::size_t end = std::min(line.find_first_of(" \t\r", begin), line.size());
    words.push_back(line.substr(begin, end - begin));
    at = end;
  }
  auto program = [](std::string_view word) {
    const std::size_t slash = word.rfind('/');
    return slash == std::string_view::npos ? word : word.substr(slash + 1);
  };
  std::size_t i = 0;
  if (i < words.size() && program(words[i]) == "env") {
    ++i;  // env's options and settings, then the program it runs
    while (i < words.size() &&
           (words[i].starts_with('-') || words[i].find('=') != std::string_view::npos))
      ++i;
  }
  if (i < words.size() && program(words[i]).starts_with("python")) return std::string(words[i]);
  return std::nullopt;
}

bool shebang_runs_python(std::string_view start) { return shebang_python(start).has_value(); }

bool starts_a_program(std::string_view start) {
  if (start.starts_with("#!")) return !shebang_runs_python(start);
  // Without a "#!" line the kernel runs a binary (ELF, or a format binfmt_misc knows), and
  // refuses a text file (ENOEXEC), which torchrun runs under Python as any script.
  return start.starts_with("\177ELF") || start.find('\0') != std::string_view::npos;
}

bool is_program_file(const std::string& path) {
  if (!is_executable_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return true;  // executable but unreadable (mode 0711): only the kernel can run it
  std::string start(256, '\0');
  in.read(start.data(), static_cast<std::streamsize>(start.size()));
  start.resize(static_cast<std::size_t>(in.gcount()));
  return starts_a_program(start);
}

std::string search_path(const std::map<std::string, std::string>& env) {
  auto it = env.find("PATH");
  return it == env.end() || it->second.empty() ? "/usr/bin:/bin" : it->second;
}

std::string resolve_executable(const std::string& name, const std::string& path_env) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? name : "";
  for (const std::string& dir : common::split(path_env, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
  }
  return "";
}

}  // namespace ddprun::agent
