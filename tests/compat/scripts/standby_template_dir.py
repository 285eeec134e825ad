"""For tests/compat/python_standby_test.cpp: what the bootstrap's trial imports do to torch's
RemoteModule template directory (a TemporaryDirectory that
torch.distributed.nn.jit.instantiator makes at import), with a stand-in for that module.
Prints as JSON whether a directory this process had before a trial import is still there
after it, and whether one made by the trial import itself was removed with the trial.

    standby_template_dir.py BOOTSTRAP
"""
import importlib.util
import json
import os
import sys
import tempfile
import types

INSTANTIATOR = "torch.distributed.nn.jit.instantiator"


def load_bootstrap(path):
    spec = importlib.util.spec_from_file_location("ddprun_standby", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    bootstrap = load_bootstrap(sys.argv[1])
    with tempfile.TemporaryDirectory() as scratch:
        # A module whose import makes a template directory (as the instantiator's does), and
        # writes its name where this process can read it.
        made = os.path.join(scratch, "made")
        with open(os.path.join(scratch, "makes_template_dir.py"), "w", encoding="utf-8") as f:
            f.write("import sys, tempfile, types\n"
                    f"m = types.ModuleType({INSTANTIATOR!r})\n"
                    "m._TEMP_DIR = tempfile.TemporaryDirectory()\n"
                    f"sys.modules[{INSTANTIATOR!r}] = m\n"
                    f"open({made!r}, 'w').write(m._TEMP_DIR.name)\n")
        sys.path.insert(0, scratch)
        try:
            # Without a directory of its own: the trial's is its own, removed with it.
            bootstrap.trial_import("makes_template_dir")
            with open(made, encoding="utf-8") as f:
                trial_dir = f.read()
            # With one (the zygote's, once it has imported torch._dynamo): left alone.
            module = types.ModuleType(INSTANTIATOR)
            module._TEMP_DIR = tempfile.TemporaryDirectory()
            sys.modules[INSTANTIATOR] = module
            bootstrap.trial_import("json")
            print(json.dumps({"inherited_kept": os.path.isdir(module._TEMP_DIR.name),
                              "trial_own_removed": not os.path.exists(trial_dir)}))
            module._TEMP_DIR.cleanup()
        finally:
            sys.path.remove(scratch)


if __name__ == "__main__":
    main()
