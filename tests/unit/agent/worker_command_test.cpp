#include "agent/worker_command.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;

namespace {
bool never(const std::string&) { return false; }
bool always(const std::string&) { return true; }
using Argv = std::vector<std::string>;
}  // namespace

TEST_CASE("a .py script runs as python3 -u script args", "[agent][unit]") {
  CommandRequest r{"train.py", {"--epochs", "10"}};
  CHECK(build_worker_command(r, always) == Argv{"python3", "-u", "train.py", "--epochs", "10"});
}

TEST_CASE("PYTHON_EXEC replaces the interpreter", "[agent][unit]") {
  CommandRequest r{"train.py", {}};
  r.python_exec = "/opt/py/bin/python";
  CHECK(build_worker_command(r, never) == Argv{"/opt/py/bin/python", "-u", "train.py"});
}

TEST_CASE("the option -m runs a module", "[agent][unit]") {
  CommandRequest r{"pkg.train", {"x"}};
  r.module = true;
  CHECK(build_worker_command(r, always) == Argv{"python3", "-u", "-m", "pkg.train", "x"});
}

TEST_CASE("the option --no_python runs the script itself", "[agent][unit]") {
  CommandRequest r{"train.py", {"a"}};
  r.no_python = true;
  CHECK(build_worker_command(r, never) == Argv{"train.py", "a"});
}

TEST_CASE("an executable that is not a .py file runs directly", "[agent][unit]") {
  CommandRequest r{"./trainer", {"1"}};
  CHECK(build_worker_command(r, always) == Argv{"./trainer", "1"});
  CHECK(build_worker_command(r, never) == Argv{"python3", "-u", "./trainer", "1"});
  // Named without a '/', it is the one in the working directory, as python would read it; with
  // --no_python such a name is searched through PATH, as torchrun does.
  CommandRequest bare{"trainer", {"1"}};
  CHECK(build_worker_command(bare, always) == Argv{"./trainer", "1"});
  CHECK(build_worker_command(bare, never) == Argv{"python3", "-u", "trainer", "1"});
  bare.no_python = true;
  CHECK(build_worker_command(bare, never) == Argv{"trainer", "1"});
}

TEST_CASE("a script whose #! line runs Python is a Python script, whatever its name",
          "[agent][unit]") {
  for (const char* start : {"#!/usr/bin/python3\nimport torch\n", "#!/usr/bin/env python3\n",
                            "#! /opt/conda/bin/python\n", "#!/usr/bin/env -S python3 -u\nprint()",
                            "#!/usr/bin/python3.11"}) {
    INFO(start);
    CHECK(shebang_runs_python(start));
  }
  for (const char* start : {"#!/bin/sh\npython3 train.py\n",
                            "\x7f"
                            "ELF\x02\x01",
                            "", "#!", "import torch  # python\n", "#!/usr/bin/env bash\n# python\n",
                            "#!/bin/sh python_setup.sh\n", "#!/usr/bin/env bash python3\n"}) {
    INFO(start);
    CHECK_FALSE(shebang_runs_python(start));
  }
  // The interpreter as the line names it: a path, or the name env looks up.
  CHECK(shebang_python("#!/opt/conda/envs/x/bin/python -O\n") == "/opt/conda/envs/x/bin/python");
  CHECK(shebang_python("#!/usr/bin/env -S PYTHONHASHSEED=0 python3.11 -u\r\n") == "python3.11");
}

TEST_CASE("an executable file is a program when the kernel would run it", "[agent][unit]") {
  using namespace std::string_view_literals;
  for (std::string_view start : {"#!/bin/sh\necho\n"sv,
                                 "\x7f"
                                 "ELF\x02\x01\x01\0\0"sv,
                                 "MZ\x90\0\x03"sv, "PK\x03\x04\x14\0"sv}) {
    INFO(start);
    CHECK(starts_a_program(start));
  }
  // Text the kernel refuses (ENOEXEC), as on a mount where every file is executable: Python
  // source to torchrun; and a "#!" line that runs Python.
  for (std::string_view start :
       {"import torch\nprint(1)\n"sv, ""sv, "\n# a comment\n"sv, "#!/usr/bin/env python3\n"sv}) {
    INFO(start);
    CHECK_FALSE(starts_a_program(start));
  }
}

TEST_CASE("programs are found through PATH", "[agent][unit]") {
  CHECK(resolve_executable("sh", "/nonexistent:/bin:/usr/bin").ends_with("/sh"));
  CHECK(resolve_executable("no-such-program-ddprun", "/bin:/usr/bin").empty());
  CHECK(resolve_executable("/bin/sh", "") == "/bin/sh");
}

TEST_CASE("workers are searched for in the agent's PATH, else in /usr/bin:/bin", "[agent][unit]") {
  CHECK(search_path({{"PATH", "/opt/bin"}}) == "/opt/bin");
  CHECK(search_path({}) == "/usr/bin:/bin");
  CHECK(search_path({{"PATH", ""}}) == "/usr/bin:/bin");
}

TEST_CASE("a Python standby runs the bootstrap with the worker's script or module after --",
          "[agent][unit][standby]") {
  CommandRequest script{"train.py", {"--lr", "1"}};
  script.python_exec = "/usr/bin/python3";
  CHECK(runs_under_python(script, always));
  // With room for the worker's command line and environment (ddprun_standby.py's show_as).
  const std::string room = "--room=" + std::string(kPythonStandbyRoom, '.');
  CHECK(build_python_standby_command(build_worker_command(script, always), "/p/ddprun_standby.py",
                                     {}) == Argv{"/usr/bin/python3", "-u", "/p/ddprun_standby.py",
                                                 room, "--", "train.py", "--lr", "1"});
  CommandRequest module{"pkg.train", {"x"}, /*module=*/true};
  CHECK(runs_under_python(module, always));
  CHECK(build_python_standby_command(build_worker_command(module, always), "/b.py",
                                     {{"numpy", "scipy"}}) == Argv{"python3", "-u", "/b.py", room,
                                                                   "--preload=numpy,scipy", "--",
                                                                   "-m", "pkg.train", "x"});
  // The node's zygote: the same command, marked.
  CHECK(build_python_standby_command(build_worker_command(module, always), "/b.py", {{"numpy"}},
                                     /*zygote=*/true) == Argv{"python3", "-u", "/b.py", "--zygote",
                                                              room, "--preload=numpy", "--", "-m",
                                                              "pkg.train", "x"});
  // --standby_cuda: the standbys (and the zygote, which passes it to its forks) are told.
  CHECK(build_python_standby_command(build_worker_command(script, always), "/b.py",
                                     {{}, StandbyCuda::Context}) ==
        Argv{"/usr/bin/python3", "-u", "/b.py", room, "--cuda=context", "--", "train.py", "--lr",
             "1"});
  CHECK(build_python_standby_command(build_worker_command(module, always), "/b.py",
                                     {{"numpy"}, StandbyCuda::Warm}, /*zygote=*/true) ==
        Argv{"python3", "-u", "/b.py", "--zygote", room, "--preload=numpy", "--cuda=warm", "--",
             "-m", "pkg.train", "x"});
  // Programs that are not run by Python have no Python standby.
  CHECK_FALSE(runs_under_python(CommandRequest{"./trainer", {}}, always));
  CHECK_FALSE(runs_under_python(CommandRequest{"train.py", {}, false, /*no_python=*/true}, always));
}

TEST_CASE("the bootstrap is found in share/ddprun next to ddprun's bin directory",
          "[agent][unit][standby]") {
  const std::string source = DDPRUN_UNIT_SOURCE_DIR;
  // The build tree is laid out as an installed one: bin/ddprun, share/ddprun/.
  CHECK(find_python_bootstrap(DDPRUN_UNIT_BINARY_DIR "/bin/ddprun") == DDPRUN_UNIT_BINARY_DIR
        "/share/ddprun/ddprun_standby.py");
  // The source tree has no share/ddprun: nothing found.
  CHECK(find_python_bootstrap(source + "/bin/ddprun").empty());
}

TEST_CASE("automatic standbys find a script's top-level torch imports in its source",
          "[agent][unit][standby]") {
  CHECK(source_imports_torch("import torch\n"));
  CHECK(source_imports_torch("#!/usr/bin/env python3\nimport os\nimport torch.distributed as d"));
  CHECK(source_imports_torch("from torch import nn\n"));
  CHECK(source_imports_torch("from torch.nn.parallel import DistributedDataParallel\n"));
  CHECK(source_imports_torch("import os, torch\n"));
  CHECK(source_imports_torch("import os,torch\n"));
  CHECK(source_imports_torch("try:\n    import torch\nexcept ImportError:\n    pass\n"));
  CHECK_FALSE(source_imports_torch(""));
  CHECK_FALSE(source_imports_torch("import torchvision\n"));
  CHECK_FALSE(source_imports_torch("from mylib import torch\n"));
  CHECK_FALSE(source_imports_torch("import os  # we do not import torch\n"));
  CHECK_FALSE(source_imports_torch("print('import torch')\n"));
  CHECK_FALSE(source_imports_torch("# import torch\n"));
}

TEST_CASE("a script's imports are listed by absolute name, submodules of from-imports too",
          "[agent][unit]") {
  CHECK(imported_modules("import os, sys\nimport a.b as x, c  # d\n") ==
        std::vector<std::string>{"os", "sys", "a.b", "c"});
  CHECK(imported_modules("from proj.trainer import run, Model as M\n") ==
        std::vector<std::string>{"proj.trainer", "proj.trainer.run", "proj.trainer.Model"});
  CHECK(imported_modules("from p import (a,\nfrom q import *\n    def f():\n        import r\n") ==
        std::vector<std::string>{"p", "p.a", "q", "r"});
  CHECK(imported_modules("from . import x\nfrom .y import z\nimport os; import sys\n") ==
        std::vector<std::string>{"os"});
  CHECK(imported_modules("print('import x')\nfrom\nimport\n").empty());
  CHECK(imported_modules("import a, b, c", 2) == std::vector<std::string>{"a", "b"});
}

TEST_CASE("automatic standbys read the script, or the module's file under the directory",
          "[agent][unit][standby]") {
  const std::string dir = std::string(DDPRUN_UNIT_SOURCE_DIR) + "/tests/compat/scripts";
  CommandRequest script{dir + "/standby_probe.py", {}};
  CHECK(source_imports_torch(python_source_of(script, "/")));
  CommandRequest relative{"standby_probe.py", {}};
  CHECK(source_imports_torch(python_source_of(relative, dir)));
  CommandRequest module{"standby_probe", {}, /*module=*/true};
  CHECK(source_imports_torch(python_source_of(module, dir)));
  CommandRequest scripts_package{"scripts", {}, /*module=*/true};
  CHECK(python_source_of(scripts_package, dir + "/..").empty());  // no __main__.py there
  CHECK(python_source_of(CommandRequest{"no_such_script.py", {}}, dir).empty());
}

TEST_CASE("the option --run_path runs the script through runpy.run_path under python -u -c",
          "[agent][unit]") {
  CommandRequest r{"./trainer", {"--lr", "1"}};
  r.run_path = true;
  CHECK(runs_under_python(r, always));  // even an executable: runpy runs the file
  CHECK(build_worker_command(r, always) ==
        Argv{"python3", "-u", "-c", kRunPathCode, "./trainer", "--lr", "1"});
  CHECK(std::string(kRunPathCode).find("runpy.run_path(sys.argv[0], run_name='__main__')") !=
        std::string::npos);
  // Its standby runs the bootstrap, told to run the script the same way.
  CHECK(build_python_standby_command(build_worker_command(r, always), "/b.py", {}) ==
        Argv{"python3", "-u", "/b.py", "--room=" + std::string(kPythonStandbyRoom, '.'),
             "--run-path", "--", "./trainer", "--lr", "1"});
}

TEST_CASE("the option --local_rank_arg puts --local-rank=${local_rank} after the script",
          "[agent][unit]") {
  CommandRequest r{"train.py", {"--lr", "1"}};
  r.local_rank_arg = "local-rank";
  const Argv argv = build_worker_command(r, always);
  CHECK(argv == Argv{"python3", "-u", "train.py", "--local-rank=${local_rank}", "--lr", "1"});
  CHECK(argv_for_local_rank(argv, 3) ==
        Argv{"python3", "-u", "train.py", "--local-rank=3", "--lr", "1"});
  r.local_rank_arg = "local_rank";
  r.module = true;
  CHECK(argv_for_local_rank(build_worker_command(r, always), 0) ==
        Argv{"python3", "-u", "-m", "train.py", "--local_rank=0", "--lr", "1"});
  CommandRequest program{"./trainer", {}};
  program.local_rank_arg = "local-rank";
  CHECK(argv_for_local_rank(build_worker_command(program, always), 1) ==
        Argv{"./trainer", "--local-rank=1"});
}

TEST_CASE("each worker's arguments get its local rank as torchrun's macros.substitute gives it",
          "[agent][unit]") {
  const Argv argv{"py$$",        "-u",      "t.py",         "--out=ckpt/${local_rank}",
                  "$local_rank", "cost$$5", "$local_ranks", "${local_rank",
                  "${rank}",     "$",       "$1",           "a${local_rank}b"};
  // Not the program itself; in every argument after it, Template.safe_substitute's rules.
  CHECK(argv_for_local_rank(argv, 2) == Argv{"py$$", "-u", "t.py", "--out=ckpt/2", "2", "cost$5",
                                             "$local_ranks", "${local_rank", "${rank}", "$", "$1",
                                             "a2b"});
  const Argv plain{"python3", "-u", "t.py", "--lr", "0.1"};
  CHECK(argv_for_local_rank(plain, 5) == plain);
}

TEST_CASE("a standby forked from the zygote is handed its own rank's script arguments",
          "[agent][unit][standby]") {
  const Argv same{"python3", "-u", "t.py", "--lr", "1"};
  CHECK(standby_script_argv(same, 1).empty());  // nothing to change: the hand-over says none
  CHECK(standby_script_argv(Argv{"python3", "-u", "t.py", "--local-rank=${local_rank}"}, 1) ==
        Argv{"t.py", "--local-rank=1"});
  CHECK(standby_script_argv(Argv{"python3", "-u", "-m", "pkg.t", "--r=$local_rank"}, 0) ==
        Argv{"pkg.t", "--r=0"});
  CHECK(standby_script_argv(Argv{"python3", "-u", "-c", kRunPathCode, "t.py", "${local_rank}"},
                            4) == Argv{"t.py", "4"});
}
