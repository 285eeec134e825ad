"""ddprun's standby for Python workers (ddprun --standby_workers; docs/design.md).

ddprun starts this as `python -u ddprun_standby.py --room=... [--preload=a,b] [--cuda=MODE] --
<script> [args]` (or `-- -m <module> [args]`) with the environment that is the same in every
round. It imports torch, torch.distributed and the script's top-level imports of installed
modules, makes its GPU ready with --cuda (--standby_cuda: warm_cuda), then waits on
the descriptor named by DDPRUN_STANDBY_FD. When a worker fails, ddprun sends the new worker's
whole environment there, as {"env": {...}} (with "argv", the script and arguments to run instead
of its own, and "cmdline", the command line of a fresh start of the worker), and ends the message
with end of file. The standby acknowledges it with one byte, becomes the worker (environment,
sys.argv, sys.path[0], thread count, what ps shows) and runs the script unmodified as __main__,
as `python -u script.py` would have.

End of file without a message: ddprun no longer needs this standby; it exits 0 quietly.

With --zygote, this interpreter is the node's zygote instead of one rank's standby: it imports
the same modules once, says so on the descriptor named by DDPRUN_ZYGOTE_FD, and then forks a
standby for each request the agent sends there (its environment, with its hand-over descriptor
and output pipes attached). Each standby is a copy of this interpreter with everything imported,
made in milliseconds, and becomes a child of the agent (a child subreaper) when the process that
forked it exits. The agent hands the first group to standbys made this way too, so N workers
import torch once, not N times.
"""

import ast
import ctypes
import json
import os
import signal
import socket
import sys
import time

# The same values as common/standby_protocol.h.
STANDBY_FD_VARIABLE = "DDPRUN_STANDBY_FD"
ZYGOTE_FD_VARIABLE = "DDPRUN_ZYGOTE_FD"
ACK = b"\x06"
# The largest fork request a zygote reads (common/standby_protocol.h).
ZYGOTE_REQUEST_MAX = 4 << 20
# prctl(2)
PR_SET_PDEATHSIG = 1
PR_SET_MM = 35
PR_SET_MM_MAP = 14
# Exit codes ddprun's warning explains (agent/standby_pool.cpp).
EXIT_NO_TORCH = 3
EXIT_BAD_HANDOVER = 4
EXIT_THREADS = 5
EXIT_UNSAFE_TORCH = 6
# At most this long a rank other than 0 waits for rank 0's store to listen (wait_for_store).
STORE_WAIT_S = 1.0
# At most this long the zygote waits for its modules' random generators to be judged (os_seeded).
RESEED_PROBE_S = 5.0

_BOOTSTRAP_FILE = os.path.realpath(__file__)


class Command:
    """This bootstrap's arguments: preload (module names), zygote, run_path (--run-path: the
    script runs as runpy.run_path runs it), cuda (--cuda=context|warm, warm_cuda; None: off),
    is_module, target (the script or module) and args (its arguments)."""

    def __init__(self, argv):
        self.preload = []
        self.zygote = False
        self.run_path = False
        self.cuda = None
        i = 0
        while i < len(argv) and argv[i] != "--":
            if argv[i].startswith("--preload="):
                self.preload += [m.strip() for m in argv[i][len("--preload="):].split(",")
                                 if m.strip()]
            elif argv[i] == "--zygote":
                self.zygote = True
            elif argv[i] == "--run-path":
                self.run_path = True
            elif argv[i].startswith("--cuda="):
                self.cuda = argv[i][len("--cuda="):]
            i += 1  # and --room=...: room that show_as reuses, nothing to parse
        rest = argv[i + 1:]
        self.is_module = bool(rest) and rest[0] == "-m"
        if self.is_module:
            rest = rest[1:]
        self.target, self.args = rest[0], rest[1:]


class _MmMap(ctypes.Structure):
    """struct prctl_mm_map (<linux/prctl.h>)."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end", "auxv")] + [
        ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


def _own_stat():
    """This process's /proc/self/stat fields by their number in proc(5), or None."""
    try:
        with open("/proc/self/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # from field 3 on: the name may hold spaces
    return {number: int(field) for number, field in enumerate(fields, start=3)
            if field.lstrip("-").isdigit()}


def _area():
    """(start, environment's start, end) of the memory where the kernel put this interpreter's
    arguments and then its environment, or None. Read once, before show_as changes what the
    kernel shows; a forked child has the same addresses."""
    stat = _own_stat()
    if stat is None or 51 not in stat or stat[49] != stat[50]:
        return None
    return stat[48], stat[50], stat[51]


_AREA = _area()
_SHOWN = []  # buffers the kernel shows as arguments or environment: never freed
# Thread ids show_as may ignore: the threads CUDA's driver (and torch) started while a standby
# made its GPU ready (warm_cuda). They wait on the GPU's events, and glibc gives every thread
# but the main one a malloc arena of its own (mmap'ed), so they never move the heap's end that
# show_as restates; unless the arenas are limited (MALLOC_ARENA_MAX, glibc.malloc.arena_max),
# when this stays empty.
_QUIET_THREADS = set()


def _area_in_use(start, end):
    """True when a pointer of the C environment (which getenv reads) points into [start, end)."""
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    i = 0
    while environ[i]:
        if start <= environ[i] < end:
            return True
        i += 1
    return False


def show_as(argv, env=None):
    """Makes /proc/<pid>/cmdline (what ps, top and pgrep -f read) show `argv`, and
    /proc/<pid>/environ the environment `env` (None: the one the process started with). A fresh
    worker shows the command and environment it was started with; a process forked from the
    zygote would show the zygote's. prctl(PR_SET_MM_MAP) tells the kernel where they are, with
    no privilege (Linux 3.18 built with CONFIG_CHECKPOINT_RESTORE, as Debian's is). The kernel's
    own area is reused where they fit and nothing else points there (ddprun adds --room= to
    this bootstrap's arguments for that), so that a script's setproctitle still shows; else a
    buffer of ours. Only in a single-threaded process (or one whose other threads are those
    CUDA left, _QUIET_THREADS): the call also restates the heap's end, which another thread could
    move meanwhile. Returns whether it took."""
    stat = _own_stat()
    others = set(os.listdir("/proc/self/task")) - {str(os.getpid())}
    if _AREA is None or stat is None or not others <= _QUIET_THREADS:
        return False
    start, env_start, end = _AREA
    argv_bytes = b"".join(os.fsencode(a) + b"\0" for a in argv)
    if env is None:
        if stat[50] != env_start:
            return False
        env_bytes, end = b"", env_start  # the environment stays where it is
    else:
        env_bytes = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0"
                             for k, v in env.items())
        if _area_in_use(start, end):
            end = start
    data = argv_bytes + env_bytes
    buffer = None
    if len(data) <= end - start:
        base = start
    else:
        buffer = ctypes.create_string_buffer(data, len(data))
        base = ctypes.addressof(buffer)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    arg_end = base + len(argv_bytes)
    mm = _MmMap(start_code=stat[26], end_code=stat[27], start_data=stat[45], end_data=stat[46],
                start_brk=stat[47], brk=libc.sbrk(0), start_stack=stat[28], arg_start=base,
                arg_end=arg_end, env_start=env_start if env is None else arg_end,
                env_end=stat[51] if env is None else base + len(data),
                exe_fd=0xFFFFFFFF)  # (u32)-1: the executable stays
    if libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) != 0:
        return False
    if buffer is None:
        ctypes.memmove(base, data, len(data))  # after the kernel agreed: nothing half-shown
    else:
        _SHOWN.append(buffer)
    return True


def top_level_imports(path):
    """Module names the script imports at its top level, read from its syntax tree (the script
    is not run). Relative imports and imports inside functions or conditions are left out."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def is_local(name, local_dir):
    """True when `name` would be found in the directory that becomes sys.path[0] (the script's):
    that copy wins at run time, so an installed module of the same name must not be preloaded."""
    top = name.split(".")[0]
    return any(os.path.exists(os.path.join(local_dir, top + suffix))
               for suffix in (".py", "", ".pyc")) or any(
        entry.startswith(top + ".") and entry.endswith((".so", ".pyd"))
        for entry in _listdir(local_dir))


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


# Variables a worker gets that its standby (or the zygote) has not, or has with another value:
# agent/worker_env.cpp's build_worker_env, plus LOCAL_RANK and CUDA_VISIBLE_DEVICES, which differ
# between ranks (the zygote has rank 0's). tests/unit/agent/worker_env_test.cpp checks this list
# against what build_worker_env sets.
WORKER_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "DDPRUN_AGENT_SOCKET",
    "DDPRUN_CHECKPOINT_REQUESTED", "CUDA_VISIBLE_DEVICES",
})


def installed_roots():
    """The directories Python installs into (the standard library, site-packages and
    dist-packages, the user's site-packages), resolved: only modules found there are
    pre-imported. The script's own directory, the current directory and PYTHONPATH hold the
    user's own code, which a fresh worker imports with its own environment."""
    import site
    import sysconfig

    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            roots.add(sysconfig.get_path(key))
        except KeyError:
            pass
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    if site.ENABLE_USER_SITE:
        roots.add(site.getusersitepackages())
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def is_installed(name, roots):
    """True when the top-level package or module `name` would be loaded from under `roots`."""
    import importlib.util

    spec = importlib.util.find_spec(name.split(".")[0])
    if spec is None:
        return False
    places = list(spec.submodule_search_locations or [])
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        places.append(spec.origin)
    elif not places:
        return True  # built into the interpreter
    return all(os.path.realpath(p).startswith(roots) for p in places)


class _TracedEnviron(os._Environ):
    """os.environ while the zygote pre-imports: notes which variables are read (iterating the
    environment reads them all). Assigned as os.environ's class, so `from os import environ`
    and os.getenv see the same object."""

    read = set()
    everything = False

    def __getitem__(self, key):
        _TracedEnviron.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        _TracedEnviron.read.add(key)
        return super().__contains__(key)

    def __iter__(self):
        _TracedEnviron.everything = True
        return super().__iter__()


def _numpy_random_state():
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is None:
        return None
    try:
        kind, keys, pos, has_gauss, gauss = numpy_random.get_state()
        return (kind, keys.tobytes(), pos, has_gauss, gauss)
    except Exception:  # noqa: BLE001 - an unusual numpy: nothing to compare
        return None


def _torch_random_state():
    """The state of torch's default CPU generator (a tensor of bytes), if torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.default_generator.get_state()
    except Exception:  # noqa: BLE001 - an unusual torch: nothing to compare
        return None


def _torch_drew(before):
    """True when torch's default CPU generator has moved on from `before` (_torch_random_state)."""
    if before is None:
        return False
    after = _torch_random_state()
    try:
        return after is None or not sys.modules["torch"].equal(before, after)
    except Exception:  # noqa: BLE001 - cannot tell, so not shared
        return True


def _fresh_numpy_generator(state):
    """True for the state of numpy's global generator as a fresh import seeds it: nothing
    drawn yet, so at the position and without the cached Gaussian of a generator seeded just now
    (623 of the Mersenne Twister's 624 words with numpy 1.24 and 2.2, not 624 as one might think)."""
    if state is None:
        return True
    try:
        _, _, pos, has_gauss, _ = sys.modules["numpy.random"].RandomState().get_state()
    except Exception:  # noqa: BLE001 - an unusual numpy: cannot tell, so not shared
        return False
    return state[2] == pos and state[3] == has_gauss


class _OsRandomTrace:
    """os.urandom, os.getrandom and random's own reference to urandom (SystemRandom, secrets)
    while a trial import runs (why_not_shared with `installed`): notes whether the import drew
    bytes from the OS for a value it keeps (uuid4, secrets.token_hex, an id or key made at
    import), which every rank forked from the zygote shares. Such a module is shared all the
    same (transformers makes a telemetry session id at import, and importing it afresh in every
    rank at every restart would cost seconds), and the agent names it. Not counted: the draws
    that seed a generator, which the standbys reseed (numpy's seeding calls
    SystemRandom.getrandbits from compiled code, as `secrets.randbits` called directly would),
    and multiprocessing's authentication key (become_standby draws a new one)."""

    drawn = False
    _EXEMPT_MODULES = {"multiprocessing.process"}

    def __init__(self):
        import random

        self._saved = [(os, "urandom", os.urandom)]
        if hasattr(os, "getrandom"):
            self._saved.append((os, "getrandom", os.getrandom))
        if hasattr(random, "_urandom"):
            self._saved.append((random, "_urandom", random._urandom))

    def __enter__(self):
        _OsRandomTrace.drawn = False
        for owner, attribute, original in self._saved:
            setattr(owner, attribute, self._traced(original))
        return self

    def __exit__(self, *_):
        for owner, attribute, original in self._saved:
            setattr(owner, attribute, original)

    @staticmethod
    def _traced(original):
        def draw(*args, **kwargs):
            caller = sys._getframe(1)
            seeding = (caller.f_code.co_name == "getrandbits" and
                       caller.f_globals.get("__name__") == "random" and
                       (caller.f_back is None or
                        caller.f_back.f_globals.get("__name__") != "random"))
            exempt = caller.f_globals.get("__name__") in _OsRandomTrace._EXEMPT_MODULES
            if not seeding and not exempt:
                _OsRandomTrace.drawn = True
            return original(*args, **kwargs)
        return draw


def _thread_count():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def why_not_shared(name, installed=True):
    """Imports `name` here and says why sharing it between ranks would not be what a fresh
    worker sees: a worker variable read (WORKER_VARIABLES, or the whole environment iterated),
    a number drawn from `random`, numpy's global generator or torch's default one (it would be
    the same in every rank), sys.path changed (but for torch's template directory, which
    own_template_dir() makes per worker), or the import failing. For an `installed` module
    (not a part of torch, which is imported as torch itself is) also a thread started (a fork
    copies only the thread that calls it: the zygote could fork no standby). None when it is
    safe; then _OsRandomTrace.drawn says whether it drew bytes from the OS (shared all the
    same: the zygote names it, see trial_import). Leaves the import behind: it runs in a
    throwaway fork (trial_import), or, for a part of torch, in this interpreter itself
    (preload_torch_part)."""
    import contextlib
    import importlib
    import random

    random_state = random.getstate()
    numpy_state = _numpy_random_state()
    torch_state = _torch_random_state()
    path_before = list(sys.path)
    threads_before = _thread_count()
    _TracedEnviron.read = set()
    _TracedEnviron.everything = False
    environ_class = os.environ.__class__
    os.environ.__class__ = _TracedEnviron
    try:
        with _OsRandomTrace() if installed else contextlib.nullcontext():
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 - the script will meet the same error itself
        return "its import failed"
    finally:
        os.environ.__class__ = environ_class
    # The instantiator's template directory is the one addition a worker gets its own copy of.
    _, template = _template_dir()
    if template is not None:
        path_before = [p for p in path_before if p != template.name]
    if [p for p in sys.path if template is None or p != template.name] != path_before:
        return "it changed sys.path"
    seen = sorted(_TracedEnviron.read & WORKER_VARIABLES)
    if _TracedEnviron.everything:
        return "it read the whole environment"
    if seen:
        return "it read " + ", ".join(seen)
    after = _numpy_random_state()
    if random.getstate() != random_state or (
            after != numpy_state if numpy_state is not None else not _fresh_numpy_generator(after)):
        return "it drew random numbers"
    if _torch_drew(torch_state):
        return "it drew random numbers"
    if installed and _thread_count() > threads_before:
        return "it started a thread"
    return None


# torch.distributed.nn.jit.instantiator (which torch._dynamo imports, through FSDP) makes a
# temporary directory at import, appends it to sys.path and removes it at exit: its generated
# RemoteModule templates are imported from there. A worker forked from the zygote gets a
# directory of its own at hand-over, in the same place on sys.path; the zygote's is removed
# when the zygote ends, and a trial import's when the trial ends.
_TEMPLATE_MODULE = "torch.distributed.nn.jit.instantiator"


def _template_dir():
    """The instantiator's TemporaryDirectory, if that module is loaded and has one."""
    import tempfile

    module = sys.modules.get(_TEMPLATE_MODULE)
    temp = getattr(module, "_TEMP_DIR", None)
    return (module, temp) if isinstance(temp, tempfile.TemporaryDirectory) else (None, None)


def own_template_dir():
    """In a worker forked from the zygote: its own template directory instead of the zygote's
    (which the zygote removes; the worker's is removed when the worker exits, as a fresh
    worker's is)."""
    import tempfile

    module, inherited = _template_dir()
    if module is None:
        return
    inherited._finalizer.detach()  # the zygote's directory: not this process's to remove
    mine = tempfile.TemporaryDirectory()
    module._TEMP_DIR = mine
    module.INSTANTIATED_TEMPLATE_DIR_PATH = mine.name
    sys.path[:] = [mine.name if p == inherited.name else p for p in sys.path]


def drop_template_dir(inherited=None):
    """Before os._exit (which runs no finalizer): removes this process's own template dir, not
    `inherited`, the one of the process it was forked from."""
    _, temp = _template_dir()
    if temp is not None and temp is not inherited:
        temp.cleanup()


def leave(code, own_template):
    """Exits a standby that never became a worker at once, with `code`: os._exit, so no
    finalizer or exit handler runs (a standby forked from the zygote would remove the zygote's
    template directory) and nothing waits for the thread making the GPU ready (the driver's
    teardown can wait for a call still inside it). What was written is flushed first, and with
    `own_template` this process's own template directory removed."""
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        if own_template:
            drop_template_dir()
    except BaseException:  # noqa: BLE001 - whatever went wrong, no interpreter exit
        pass
    finally:
        os._exit(code)


def read_within(fd, seconds):
    """What a forked child writes to the pipe `fd` before it exits, or None when it has not
    closed it within `seconds`; closes `fd`."""
    import select

    data, deadline = b"", time.monotonic() + seconds
    readable = select.poll()
    readable.register(fd, select.POLLIN)
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not readable.poll(max(1, int(left * 1000))):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return data
            data += chunk
        return None
    finally:
        os.close(fd)


def read_to_end(fd):
    """Everything a forked child writes to the pipe `fd` before it exits; closes `fd`."""
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    os.close(fd)
    return data


def judged_in_fork(judge, seconds=None):
    """What `judge()` (bytes) returns when run in a throwaway fork of this interpreter, its
    output going nowhere, so that nothing it imports or changes stays here; b"" when the fork
    ended without it. With `seconds`: None when the fork has not ended by then (it is killed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.write(w, judge())
        finally:
            os._exit(0)
    os.close(w)
    verdict = read_to_end(r) if seconds is None else read_within(r, seconds)
    if verdict is None:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return verdict


# The modules shared although their import drew bytes from the OS (_OsRandomTrace): the ready
# message names them, and the agent says so.
SHARED_OS_DRAWS = []


def trial_import(name):
    """why_not_shared(name), judged in a forked child (judged_in_fork), so that nothing of an
    import found unsafe stays in this interpreter: an extension module imported once keeps its
    state even when its Python modules are imported again (numpy's global generator would be
    the same in every rank). Its output goes nowhere; the real import, if any, prints it."""
    def judge():
        _, inherited = _template_dir()  # the parent's, when it has imported torch._dynamo
        why = why_not_shared(name)
        drop_template_dir(inherited)
        if why:
            return ("unsafe:" + why).encode()[:4000]
        return b"safe, drew from the OS" if _OsRandomTrace.drawn else b"safe"

    verdict = judged_in_fork(judge)
    if verdict == b"safe, drew from the OS":
        SHARED_OS_DRAWS.append(name)
        return None
    if verdict == b"safe":
        return None
    text = verdict.decode("utf-8", "replace")
    return text[len("unsafe:"):] if text.startswith("unsafe:") else "its trial import failed"


def preload(names, local_dir):
    """Imports what is safe to share between ranks: installed modules (installed_roots) that
    observe nothing a fresh worker sees differently (trial_import). Anything else is left to the
    script, which then imports it as a fresh interpreter would (docs/design.md#standby-workers
    says how to extend this). The caller has made sys.argv the script's."""
    import importlib

    roots = installed_roots()
    for name in names:
        if not name or is_local(name, local_dir):
            continue
        try:
            if not is_installed(name, roots):
                continue
        except (ImportError, ValueError):
            continue
        if trial_import(name) is None:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the script will meet the same error itself
                pass


def preload_torch_part(name):
    """Imports `name`, a part of torch, here and at once, as torch itself is: a trial in a
    throwaway fork first (trial_import) would import it twice, which cost the first start of a
    torch 2.6 job 1 to 1.3 s for torch._dynamo. It is judged all the same (why_not_shared), as
    it is imported; an interpreter it would make unsafe to share ends with EXIT_UNSAFE_TORCH,
    and the agent starts its workers afresh. A failed import is left to the script. The caller
    has made sys.argv the script's."""
    why = why_not_shared(name, installed=False)
    if why is not None and why != "its import failed":
        _IMPORT_OUTPUT.stop(echo=True)
        sys.stderr.write(f"ddprun standby: {name} cannot be shared between ranks ({why}): the "
                         "workers start afresh; --standby_workers=off starts them so from the outset\n")
        os._exit(EXIT_UNSAFE_TORCH)


# Random generators a module makes for itself at import (`random.Random()`,
# `numpy.random.default_rng()`, `torch.Generator().seed()` at module level): a fresh interpreter
# seeds each from the OS, while every rank forked from the zygote would have the zygote's, the
# same numbers on every rank. The zygote finds them once (module_generators), asks which its
# modules make anew at each import (os_seeded), and each standby reseeds those
# (become_standby). A generator made from a fixed seed stays as it is, as in a fresh worker.
_OS_SEEDED = []  # [(generator, its reseed function)]

# What the imports (torch's and the script's) did to the environment: {name: value, or None
# when they removed it}. A fresh worker's imports do the same to its own environment, so each
# worker applies it over the environment it is handed (become_worker). What they computed it
# from is the same in every rank: an import that reads a worker variable is not shared.
_IMPORTS_ENV = {}


def environment_changes(before, after):
    """{name: new value, or None when removed} from `before` to `after` (dicts)."""
    changes = {name: value for name, value in after.items() if before.get(name) != value}
    changes.update({name: None for name in before if name not in after})
    return changes


def apply_environment_changes(changes):
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class ImportOutput:
    """What the zygote's imports print on stdout and stderr: a fresh worker prints it as it
    imports them, so each rank forked from the zygote prints it as it starts (replay), where it
    would otherwise be lost. While the imports run, descriptors 1 and 2 are memory files (and a
    faulthandler dump goes to the real stderr, so a crash still leaves the zygote's last words
    where the agent reads them); the whole lines in the first LIMIT bytes of each are kept."""

    LIMIT = 4 << 20

    def __init__(self):
        self.kept = [b"", b""]
        self._files = None
        self._saved = None

    def start(self):
        _flush_all()
        files, saved = [], []
        try:
            for name in ("stdout", "stderr"):
                files.append(os.memfd_create(f"ddprun-imports-{name}", os.MFD_CLOEXEC))
            for fd in (1, 2):
                saved.append(os.dup(fd))
        except (AttributeError, OSError):
            for fd in files + saved:
                os.close(fd)
            return  # nothing kept: the output goes where it went before
        self._files, self._saved = files, saved
        os.dup2(files[0], 1)
        os.dup2(files[1], 2)
        _faulthandler_to(saved[1])

    def stop(self, echo=False):
        """Puts descriptors 1 and 2 back and keeps what was printed; with `echo`, writes it
        there too (the zygote is about to exit: the agent shows its last words)."""
        if self._saved is None:
            return
        _flush_all()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved = None
        _faulthandler_to(2)
        for i, f in enumerate(self._files):
            size = os.lseek(f, 0, os.SEEK_END)
            os.lseek(f, 0, os.SEEK_SET)
            kept = _read_up_to(f, min(size, self.LIMIT))
            os.close(f)
            if size > len(kept):
                # Whole lines, then a line that says so on the same stream: what follows (the
                # script's own output) starts a line of its own.
                cut = kept.rfind(b"\n") + 1
                kept = kept[:cut] if cut > 0 else kept
                dropped = size - len(kept)
                stream = ("stdout", "stderr")[i]
                note = (f"(ddprun: the last {dropped} bytes the imports printed on {stream} "
                        "are not repeated)\n")
                kept += (b"" if kept.endswith(b"\n") else b"\n") + note.encode()
            self.kept[i] = kept
        self._files = None
        if echo:
            self.replay()

    def replay(self):
        for fd, data in zip((1, 2), self.kept):
            try:
                while data:
                    data = data[os.write(fd, data):]
            except OSError:
                pass


def _faulthandler_to(fd):
    """Points faulthandler, when it is on (PYTHONFAULTHANDLER), at descriptor `fd`."""
    import faulthandler

    if faulthandler.is_enabled():
        try:
            faulthandler.enable(file=fd, all_threads=True)
        except (TypeError, ValueError, OSError):
            pass  # an interpreter that takes no descriptor: its dump stays where it was


_IMPORT_OUTPUT = ImportOutput()


def _flush_all():
    """Python's streams and C's (a native library's printf at import sits in stdio's buffer)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)
    except (AttributeError, OSError):
        pass


def _read_up_to(fd, size):
    chunks = []
    while size > 0:
        chunk = os.read(fd, min(size, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _numpy_state(generator):
    import pickle

    return pickle.dumps(generator.get_state() if hasattr(generator, "get_state") else
                        generator.bit_generator.state if hasattr(generator, "bit_generator")
                        else generator.state)


def _numpy_reseed(generator):
    if hasattr(generator, "get_state"):  # RandomState
        generator.seed()
    elif hasattr(generator, "bit_generator"):  # Generator
        generator.bit_generator.state = type(generator.bit_generator)().state
    else:  # a bit generator
        generator.state = type(generator)().state


def _torch_reseed(generator):
    if generator.device.type == "cpu":  # the zygote makes no CUDA generator its own state
        generator.seed()


def _with_subclasses(root, but=None):
    """`root` and every class derived from it, but `but` and what derives from that."""
    kinds, todo = set(), [root]
    while todo:
        kind = todo.pop()
        if kind not in kinds and not (but is not None and issubclass(kind, but)):
            kinds.add(kind)
            todo.extend(kind.__subclasses__())
    return kinds


def _generator_kinds():
    """{type: (state, reseed)} for each type of random generator loaded: `state` gives what its
    numbers depend on, comparable with ==; `reseed` seeds it from the OS. SystemRandom draws
    from the OS at each call: nothing to reseed."""
    import random

    kinds = dict.fromkeys(_with_subclasses(random.Random, but=random.SystemRandom),
                          (random.Random.getstate, lambda generator: generator.seed()))
    numpy_random = sys.modules.get("numpy.random")
    for name in ("Generator", "RandomState", "BitGenerator"):
        kind = getattr(numpy_random, name, None)
        if isinstance(kind, type):
            kinds.update(dict.fromkeys(_with_subclasses(kind), (_numpy_state, _numpy_reseed)))
    torch = sys.modules.get("torch")
    kind = getattr(torch, "Generator", None)
    if isinstance(kind, type):
        kinds[kind] = (lambda generator: bytes(generator.get_state().tolist()), _torch_reseed)
    return kinds


def _reseeded_anyway():
    """The global generators that are reseeded in each fork whatever their module does: random's
    own (it reseeds itself), numpy's and torch's default one (become_standby)."""
    places = (("random", "_inst"), ("numpy.random.mtrand", "_rand"), ("torch", "default_generator"))
    return {id(getattr(sys.modules.get(module), name, None)) for module, name in places}


def module_generators(kinds):
    """[(module name, path, generator)] for each generator of `kinds` (_generator_kinds) that a
    loaded module holds as a global (path: (name,)) or that a class it defines holds as a class
    attribute (path: (class, name)), but those reseeded anyway. Only type() and the dictionaries
    themselves are read: an attribute lookup could run a module's code (a lazy import, a
    deprecation warning on the console)."""
    import types

    skip = _reseeded_anyway()
    found = []
    for name, module in list(sys.modules.items()):
        if name == "__main__" or not issubclass(type(module), types.ModuleType):
            continue  # __main__ is this bootstrap
        try:
            for attr, value in list(module.__dict__.items()):
                if type(value) in kinds:
                    if id(value) not in skip:
                        found.append((name, (attr,), value))
                elif issubclass(type(value), type) and vars(value).get("__module__") == name:
                    found.extend((name, (attr, inner), v) for inner, v in list(vars(value).items())
                                 if type(v) in kinds and id(v) not in skip)
        except Exception:  # noqa: BLE001 - a module made unlike others: nothing of its own
            continue
    return found


def _lookup(module, path):
    value = module
    for attr in path:
        value = getattr(value, attr)
    return value


def os_seeded(found, kinds):
    """Of `found` (module_generators), the generators a fresh interpreter seeds anew: one of
    the modules holding it, imported again twice, makes it with another state each time (not
    from a fixed seed, nor from one its import drew from another generator). Judged in a
    throwaway fork (judged_in_fork), within RESEED_PROBE_S: only the fork imports them again.
    A module that cannot be imported again keeps its generators as they are."""
    import importlib

    if not found:
        return []

    def judge():
        differ = []
        for name in dict.fromkeys(name for name, _, _ in found):
            entries = [i for i, (holder, _, _) in enumerate(found) if holder == name]
            try:
                states = []
                for _ in range(2):
                    module = importlib.reload(sys.modules[name])
                    states.append([kinds[type(found[i][2])][0](_lookup(module, found[i][1]))
                                   for i in entries])
            except BaseException:  # noqa: BLE001 - cannot tell (even a SystemExit): left as it is
                continue
            differ += [i for i, a, b in zip(entries, *states) if a != b]
        return json.dumps(differ).encode()

    verdict = judged_in_fork(judge, RESEED_PROBE_S)
    if verdict is None:
        sys.stderr.write(f"ddprun standby: importing again the modules that hold random "
                         f"generators took over {RESEED_PROBE_S:g} s; their generators stay the "
                         f"same in every rank forked from the zygote\n")
    try:
        chosen = {id(found[i][2]) for i in json.loads(verdict or b"")}
    except (ValueError, TypeError, IndexError):
        return []
    return list({id(g): g for _, _, g in found if id(g) in chosen}.values())


def serve_forks(control_fd, title):
    """The zygote's loop: one standby forked per request, until the agent closes the socket
    (then exit 0). Returns only in a forked standby, with its hand-over descriptor. `title`:
    the command line each standby shows (show_as)."""
    agent = os.getppid()
    # A fork copies only the thread that calls it: a thread started by an import (a pool, a
    # watcher) would be missing in every standby, and a lock it held would stay held there.
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        # A module of the script's that starts one is left to the script (why_not_shared): these
        # are torch's, or a thread of Python's own started by one of torch's imports.
        import threading

        named = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        python = f" (Python threads: {', '.join(named)})" if named else ""
        sys.stderr.write(f"ddprun standby: {threads} threads run after the imports{python}, and "
                         "a fork would copy only one; a BLAS or OpenMP pool started at import "
                         "(numpy's OpenBLAS with torch 2.x) starts none with OMP_NUM_THREADS set "
                         "(ddprun sets it to 1 for 2 or more workers per node): set it, or run "
                         "with --standby_workers=off\n")
        os._exit(EXIT_THREADS)
    kinds = _generator_kinds()
    _OS_SEEDED[:] = [(g, kinds[type(g)][1]) for g in os_seeded(module_generators(kinds), kinds)]
    sock = socket.socket(fileno=control_fd)  # the agent's SOCK_SEQPACKET pair: one request each
    ready = {"ready": os.getpid(), "shared_os_draws": SHARED_OS_DRAWS[:16]}
    sock.send(json.dumps(ready).encode())
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, ZYGOTE_REQUEST_MAX, 3)
        if not msg and not fds:
            drop_template_dir()
            os._exit(0)  # the agent closed its end: the job is over
        try:
            env = json.loads(msg.decode("utf-8"))["env"]
            if len(fds) != 3 or not isinstance(env, dict):
                raise ValueError(f"{len(fds)} descriptors")
        except (ValueError, KeyError, TypeError) as e:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": f"bad fork request: {e}"}).encode())
            continue
        try:
            pid = fork_standby(sock, agent, env, fds, title)
        except OSError as e:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": f"fork: {e.strerror}"}).encode())
            continue
        if pid == 0:
            return fds[0]  # this process is the new standby
        for fd in fds:
            os.close(fd)
        reply = {"pid": pid} if pid > 0 else {"error": "fork failed in the intermediate process"}
        sock.send(json.dumps(reply).encode())


def fork_standby(sock, agent, env, fds, title):
    """Forks twice, so the standby's parent (the middle process) exits at once and the agent,
    a child subreaper, adopts it: the agent then reaps and signals it like any process it
    started. Returns the standby's pid in the zygote (-1 if the middle process could not fork),
    and 0 in the standby itself, which is set up by become_standby first."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(r)
        try:
            child = os.fork()
        except OSError:
            os._exit(1)
        if child == 0:
            try:
                # Its own session (and process group) before the zygote reads the pipe to its
                # end, so that no signal to its group can miss once the agent knows its pid. Only
                # the standby can set it: setsid fails in a process that leads a group.
                os.setsid()
                os.close(w)
                sock.close()
                become_standby(agent, env, fds, title)
            except BaseException:  # noqa: BLE001 - never back into the zygote's loop or exit
                os._exit(127)
            return 0
        os.write(w, str(child).encode())
        os._exit(0)
    os.close(w)
    data = read_to_end(r)
    # Once the middle process is reaped it has exited, so the standby already is the agent's.
    os.waitpid(middle, 0)
    return int(data) if data else -1


def become_standby(agent, env, fds, title):
    """In a standby just forked by the zygote: as ddprun's process launcher sets up a process it
    starts, then the standby's environment (its own hand-over descriptor named in it), shown
    with `title` as its command line."""
    handover, out, err = fds
    deadline = time.monotonic() + 5
    while os.getppid() != agent:  # adopted by the agent once the middle process has exited
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.001)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != agent:  # the agent died before prctl: nobody would kill us later
        os._exit(127)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    env = dict(env)
    env[STANDBY_FD_VARIABLE] = str(handover)
    os.environ.clear()
    os.environ.update(env)
    show_as(title, env)
    # A fresh interpreter seeds numpy's global generator and torch's default CPU generator from
    # the OS; a forked copy would share the zygote's, the same numbers on every rank and at every
    # restart. (`random` reseeds itself after a fork; torch's CUDA generators start from one
    # fixed seed in any process.)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:  # noqa: BLE001 - an unusual numpy: leave it as it is
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.default_generator.seed()
        except Exception:  # noqa: BLE001 - an unusual torch: leave it as it is
            pass
    for generator, reseed in _OS_SEEDED:
        try:
            reseed(generator)
        except Exception:  # noqa: BLE001 - an unusual generator: leave it as it is
            pass
    # multiprocessing's authentication key, drawn from the OS as it is imported: each fresh
    # interpreter has its own (a Manager or Listener checks it).
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        try:
            process.current_process().authkey = os.urandom(32)
        except Exception:  # noqa: BLE001 - an unusual multiprocessing: leave it as it is
            pass


CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20  # cuda.h: 0 default, 2 prohibited, 3 exclusive process


class CudaWarmError(Exception):
    """Why a standby could not make its GPU ready (warm_cuda)."""


class BadHandover(Exception):
    """What was wrong with the hand-over message (wait_for_handover)."""


def _cuda_ordinal():
    """The device a rank's script is expected to use, as CUDA numbers the devices this process
    sees: LOCAL_RANK (which ddprun sets to 0 when each rank sees only its own GPU, through
    CUDA_VISIBLE_DEVICES)."""
    text = os.environ.get("LOCAL_RANK", "0")
    if not text.isdigit():
        raise CudaWarmError(f"LOCAL_RANK={text!r} is not a device number")
    return int(text)


def _retain_primary_context(ordinal):
    """Creates device `ordinal`'s primary context through the driver (libcuda), the one CUDA's
    runtime, and so torch, uses once the script touches that device. Nothing of torch changes:
    torch.cuda.is_initialized() stays False and the current device stays the script's."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CudaWarmError(f"NVIDIA's driver library cannot be loaded ({e})") from None

    def check(call, status):
        if status != 0:
            name = ctypes.c_char_p()
            cuda.cuGetErrorName(status, ctypes.byref(name))
            raise CudaWarmError(f"{call} failed with {(name.value or b'?').decode()} ({status})")

    check("cuInit", cuda.cuInit(0))
    count = ctypes.c_int()
    check("cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count)))
    if ordinal >= count.value:
        raise CudaWarmError(f"LOCAL_RANK {ordinal} names no device: this process sees "
                            f"{count.value} (CUDA_VISIBLE_DEVICES="
                            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    device = ctypes.c_int()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), ordinal))
    # In another compute mode than the default, a context a standby holds could keep the rank
    # (or a rank started afresh) off the device.
    compute_mode = ctypes.c_int()
    check("cuDeviceGetAttribute", cuda.cuDeviceGetAttribute(
        ctypes.byref(compute_mode), CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, device))
    if compute_mode.value != 0:
        raise CudaWarmError(f"device {ordinal} is in compute mode {compute_mode.value}, not the "
                            "default (0): a context held by a standby could keep a rank off it")
    context = ctypes.c_void_p()  # retained for the life of the process, as the runtime's is
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))


def _warm_torch(ordinal):
    """Device `ordinal`'s context through torch, then one small training step there: cuBLAS's
    handle and workspace and the first kernels of a forward pass, a backward pass and an SGD
    step are loaded before the script needs them. Draws no random number (the script's
    generators stay as a fresh worker's), frees its tensors and clears the memory statistics a
    script may read. Run in a thread of its own, so the main thread's current device is left
    alone."""
    import torch
    import torch.nn.functional as F

    if torch.version.cuda is None:
        raise CudaWarmError(f"torch {torch.__version__} is built without CUDA")
    if ordinal >= torch.cuda.device_count():
        raise CudaWarmError(f"LOCAL_RANK {ordinal} names no device: torch sees "
                            f"{torch.cuda.device_count()}")
    device = torch.device("cuda", ordinal)
    with torch.cuda.device(device):
        weight = torch.full((64, 64), 0.01, device=device, requires_grad=True)
        bias = torch.zeros(64, device=device, requires_grad=True)
        loss = F.relu(F.linear(torch.ones(32, 64, device=device), weight, bias)).square().mean()
        loss.backward()
        torch.optim.SGD([weight, bias], lr=0.1, momentum=0.9).step()
        torch.cuda.synchronize(device)
        del weight, bias, loss
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.reset_accumulated_memory_stats(device)


def warm_cuda(mode):
    """--standby_cuda: a standby makes its GPU ready while it waits, so that the rank it becomes
    skips that. context: the device's CUDA context (_retain_primary_context); warm: that and
    a first small step through torch (_warm_torch). Run in a standby once its environment is
    the rank's (CUDA reads CUDA_VISIBLE_DEVICES once), never in the zygote, whose forks could
    not use CUDA, in a thread beside the one that waits for the hand-over: a hand-over that
    comes meanwhile (the first group's) is acknowledged at once, and the script starts once
    the GPU is ready (wait_for_handover_beside). A failure is said on the rank's stderr and the
    standby waits without it."""
    before = set(os.listdir("/proc/self/task"))
    try:
        _warm_cuda(mode)
    finally:
        started = _rename_started_threads(before)
        tunables = os.environ.get("GLIBC_TUNABLES", "")
        # glibc's malloc only: a preloaded one (tcmalloc) may move the heap's end from any thread.
        if ("MALLOC_ARENA_MAX" not in os.environ and "arena_max" not in tunables
                and not os.environ.get("LD_PRELOAD")):
            _QUIET_THREADS.update(started)


def _rename_started_threads(before):
    """The threads started since `before` (thread ids) and not yet ended, renamed
    (_rename_threads). A thread the warm-up started may itself start one while they are
    renamed, which takes the name it had: renamed until a pass finds no new thread (bounded)."""
    started = set()
    for _ in range(8):
        fresh = set(os.listdir("/proc/self/task")) - before - started
        if not fresh:
            break
        _rename_threads(fresh)
        started |= fresh
    return started


def _rename_threads(tids):
    """Threads started by this thread took its name, CUDA_THREAD_NAME, unless they named
    themselves: they get the main thread's (as wait_for_handover_beside found it: the main
    thread may still bear CUDA_THREAD_NAME for a moment), as when the script starts them."""
    main_name = _MAIN_THREAD_NAME[0] if _MAIN_THREAD_NAME else None
    if main_name is None:
        return
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", "r+b") as f:
                if f.read().strip() == CUDA_THREAD_NAME:
                    f.seek(0)
                    f.write(main_name)
        except OSError:
            pass


def _warm_cuda(mode):
    try:
        ordinal = _cuda_ordinal()
        if mode not in ("context", "warm"):
            raise CudaWarmError("expected context or warm")
        # Through ctypes, which lets the main thread run meanwhile (it acknowledges the
        # hand-over); torch's own start of CUDA holds the interpreter's lock.
        _retain_primary_context(ordinal)
        if mode == "warm":
            _warm_torch(ordinal)
    except CudaWarmError as e:
        sys.stderr.write(f"ddprun standby: --standby_cuda={mode}: {e}; this standby waits "
                         "without its GPU ready\n")
    except Exception as e:  # noqa: BLE001 - torch's own errors (a busy or broken device)
        sys.stderr.write(f"ddprun standby: --standby_cuda={mode}: {type(e).__name__}: {e}; "
                         "this standby waits without its GPU ready\n")


# The name of the thread that makes a standby's GPU ready (warm_cuda), as /proc/<pid>/task/*/comm
# shows it while it runs: bench/recovery_bench.py and the tests wait until it has gone.
CUDA_THREAD_NAME = b"ddprun-cuda"
# A rank handed over before its GPU is ready says so after this many seconds, then every
# CUDA_WAIT_REPEAT_S.
CUDA_WAIT_SAY_S = 10
CUDA_WAIT_REPEAT_S = 60
PR_SET_NAME = 15
_MAIN_THREAD_NAME = []  # the main thread's own name, kept before it lends CUDA_THREAD_NAME
# read()'s system call number, as /proc/<pid>/syscall shows it (<asm/unistd.h>), by machine.
_READ_SYSCALL = {"x86_64": "0", "aarch64": "63", "ppc64le": "3", "s390x": "3", "riscv64": "63"}


def waits_ready(pid):
    """True when the standby `pid` blocks in read() on a socket, waiting for its hand-over, with
    its GPU ready (no thread named CUDA_THREAD_NAME left, --standby_cuda): what
    bench/recovery_bench.py and the standby tests wait for before they make a rank fail."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            call = f.read().split()
        # read(fd, ...), its first argument the descriptor; on a machine whose read() number is
        # not known here, any call blocked on the socket.
        read = _READ_SYSCALL.get(os.uname().machine)
        if (read is not None and call[0] != read) or not os.readlink(
                f"/proc/{pid}/fd/{int(call[1], 16)}").startswith("socket:"):
            return False
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
                if f.read().strip() == CUDA_THREAD_NAME:
                    return False
        return True
    except (OSError, ValueError, IndexError):
        return False


def wait_for_handover_beside(fd, mode):
    """wait_for_handover(fd) in this thread while warm_cuda(mode) runs in a thread of its own
    (named CUDA_THREAD_NAME): the acknowledgement never waits for it, and this thread still
    blocks reading the hand-over as a plain standby does. Returns what wait_for_handover does
    and that thread (None when none could start), which wait_until_ready waits for."""
    import threading

    # A thread takes its name from the thread that starts it: named from its first moment, it
    # is never seen unnamed (waits_ready would then be true before the GPU is ready).
    libc = ctypes.CDLL(None)
    with open(f"/proc/self/task/{os.getpid()}/comm", "rb") as f:
        own_name = f.read().strip()
    _MAIN_THREAD_NAME.append(own_name)
    libc.prctl(PR_SET_NAME, CUDA_THREAD_NAME, 0, 0, 0)
    try:
        helper = threading.Thread(target=warm_cuda, args=(mode,), name=CUDA_THREAD_NAME.decode(),
                                  daemon=True)
        helper.start()
    except RuntimeError as e:  # no thread to be had (a pids limit): wait as a plain standby
        sys.stderr.write(f"ddprun standby: --standby_cuda={mode}: cannot start a thread ({e}); "
                         "this standby waits without its GPU ready\n")
        helper = None
    finally:
        libc.prctl(PR_SET_NAME, own_name, 0, 0, 0)
    # A bad hand-over raises BadHandover: main() leaves with os._exit, not waiting for the GPU.
    return wait_for_handover(fd), helper


def wait_until_ready(helper, mode):
    """In a standby that became a worker: waits for the thread making its GPU ready. The
    rank's script starts once the GPU is ready (its own first CUDA call would wait for the
    driver anyway); one that takes long is said on the rank's output, not waited for in
    silence. A SIGINT meanwhile ends this process as it ends a fresh one: Python's
    KeyboardInterrupt, its finalization (the rank's own template directory is already in
    place), then death by the signal itself, never exit(), whose driver teardown could wait
    for the call still inside the driver."""
    waited, step = 0, CUDA_WAIT_SAY_S
    while True:
        helper.join(step)
        if not helper.is_alive():
            break
        waited, step = waited + step, CUDA_WAIT_REPEAT_S
        sys.stderr.write(f"ddprun standby: --standby_cuda={mode}: this rank's GPU is not ready "
                         f"after {waited} s (its CUDA call has not returned); its script starts "
                         "once it is\n")
        sys.stderr.flush()
    # join() returns before the kernel has ended the thread: show_as counts the threads.
    gone_by = time.monotonic() + 1
    while os.path.exists(f"/proc/self/task/{helper.native_id}") and time.monotonic() < gone_by:
        time.sleep(0.001)


def wait_for_handover(fd):
    """(the worker's environment, the script and arguments it runs instead of this process's
    own or None, the command line a fresh start of the worker would have or None), or None for
    end of file without a message."""
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    if not chunks:
        os.close(fd)
        return None
    try:
        doc = json.loads(b"".join(chunks).decode("utf-8"))
        env = doc["env"]
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                for k, v in env.items()):
            raise ValueError("bad variable")
        argv, cmdline = doc.get("argv"), doc.get("cmdline")
        for name, value in (("argv", argv), ("cmdline", cmdline)):
            if value is not None and (not isinstance(value, list) or not value
                                      or not all(isinstance(a, str) for a in value)):
                raise ValueError(f"bad {name}")
    except (ValueError, KeyError, TypeError) as e:
        os.close(fd)
        raise BadHandover(str(e)) from None
    # From here on this process is the worker: ddprun waits for this byte before counting it.
    try:
        os.write(fd, ACK)
    finally:
        os.close(fd)
    return env, argv, cmdline


def become_worker(env, cmdline, run_path, is_module, target, args):
    # os.environ and the C environment (getenv, what libraries and child processes see) both
    # become exactly the worker's: clear() unsets each variable, assignment sets it.
    os.environ.clear()
    os.environ.update(env)
    # What the imports changed in the environment, as a fresh worker's imports would. Not in
    # /proc/self/environ (show_as): a fresh process's shows its start, not later changes.
    apply_environment_changes(_IMPORTS_ENV)
    if cmdline is not None:
        # ps, pgrep -f and /proc/<pid>/environ see the worker as its fresh start would show it,
        # and so does sys.orig_argv.
        show_as(cmdline, env)
        sys.orig_argv = list(cmdline)
    # torch read OMP_NUM_THREADS when it was imported; apply the worker's value now.
    threads = env.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    # torch.distributed read TORCH_DISTRIBUTED_DEBUG when it was imported: read it again.
    import torch.distributed

    torch.distributed.set_debug_level_from_env()
    if run_path:
        # As `python -c CODE script args` with CODE runpy.run_path(script): "" (the current
        # directory) first on the path, argv[0] the script.
        sys.path.insert(0, "")
        sys.argv = [target] + list(args)
    elif is_module:
        # As `python -m`: the current directory first on the path, argv[0] set by runpy.
        sys.path.insert(0, os.getcwd())
        sys.argv = ["-m"] + list(args)
    else:
        # As `python script.py`: the script's real directory first on the path, argv[0] as given.
        sys.path.insert(0, os.path.dirname(os.path.realpath(target)))
        sys.argv = [target] + list(args)


def wait_for_store(env):
    """Rank 0 hosts the c10d store (TORCHELASTIC_USE_AGENT_STORE=False) and, handed over at the
    same moment, may not listen yet when another rank connects; torch's TCPStore client then
    sleeps a whole second before it tries again. Probe MASTER_ADDR:MASTER_PORT every 5 ms first,
    as the C++ SDK does (wait_for_listener), for at most STORE_WAIT_S: never longer than the
    sleep it saves. A fresh start spends longer than that importing torch."""
    if env.get("RANK", "0") == "0" or env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return
    try:
        address = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    except (KeyError, ValueError):
        return
    deadline = time.monotonic() + STORE_WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(address, timeout=0.05):
                return
        except OSError:
            time.sleep(0.005)


def fresh_main_module(file_path):
    """A new, empty __main__ module, installed in sys.modules as the interpreter would."""
    import types
    from importlib.machinery import SourceFileLoader

    module = types.ModuleType("__main__")
    if file_path is not None:
        module.__file__ = file_path
        module.__cached__ = None
        module.__loader__ = SourceFileLoader("__main__", file_path)
    module.__spec__ = None
    module.__package__ = None
    module.__annotations__ = {}
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    return module


_SCRIPT_STARTED = False  # run_script() has begun: an exception from here on is the script's


def run_script(run_path, is_module, target):
    global _SCRIPT_STARTED
    _SCRIPT_STARTED = True
    if run_path:
        import runpy

        # What --run_path runs: runpy.run_path gives __main__ the path as typed.
        fresh_main_module(None)
        runpy.run_path(target, run_name="__main__")
        return
    if is_module:
        import runpy

        fresh_main_module(None)
        # What `python -m` itself calls: the module runs in the __main__ module's namespace.
        runpy._run_module_as_main(target, alter_argv=True)
        return
    # Not runpy.run_path: it gives __file__ the path as typed, where Python 3.9+ gives
    # __main__ an absolute __file__ (and keeps sys.argv[0] as typed): the working directory
    # joined to the path as typed, not normalized (`../x.py` from /a/b gives /a/b/../x.py).
    path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
    with open(path, "rb") as f:
        source = f.read()
    module = fresh_main_module(path)
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, module.__dict__)


def without_bootstrap(tb):
    """A traceback from the first frame that is not this bootstrap's (the script's); None when
    every frame is the bootstrap's (a SyntaxError from compiling the script: the interpreter
    shows none for it either)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == _BOOTSTRAP_FILE:
        tb = tb.tb_next
    return tb


def report_uncaught(error):
    """As the interpreter reports an uncaught exception, without this bootstrap's frames."""
    tb = without_bootstrap(error.__traceback__)
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def launched_as(is_module, target, args):
    """This interpreter's command line without the bootstrap: `python -u script args` (or
    `-m module`), after the label the zygote and standbys show."""
    orig = list(getattr(sys, "orig_argv", [sys.executable, "-u"]))
    interpreter = orig[:orig.index(sys.argv[0])] if sys.argv[0] in orig else orig[:1]
    return interpreter + (["-m"] if is_module else []) + [target] + list(args)


def main():
    cmd = Command(sys.argv[1:])
    zygote, run_path, is_module = cmd.zygote, cmd.run_path, cmd.is_module
    target, args = cmd.target, cmd.args
    # What ps shows while it imports and waits (a rank shows its own command line once handed).
    standby_title = ["ddprun standby:"] + launched_as(is_module, target, args)
    show_as(["ddprun zygote:"] + standby_title[1:] if zygote else standby_title)
    # `python ddprun_standby.py` put this file's directory first on the path: the worker must
    # not see it, and nothing is preloaded from it.
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(_BOOTSTRAP_FILE):
        del sys.path[0]
    fd = int(os.environ[ZYGOTE_FD_VARIABLE if zygote else STANDBY_FD_VARIABLE])
    env_before = dict(os.environ)
    if zygote:
        _IMPORT_OUTPUT.start()  # a standby's own output goes to its rank's pipes already
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except Exception as e:  # noqa: BLE001
        _IMPORT_OUTPUT.stop(echo=True)
        sys.stderr.write(f"ddprun standby: {sys.executable} cannot import torch: {e}\n")
        os._exit(EXIT_NO_TORCH)
    except BaseException:  # SystemExit, KeyboardInterrupt: said as they would be
        _IMPORT_OUTPUT.stop(echo=True)
        raise
    local_dir = os.getcwd() if is_module else os.path.dirname(os.path.realpath(target))
    names = list(cmd.preload)
    # What the script's imports see in sys.argv: as `python script.py args` has it; `python -m`
    # has "-m" there until runpy finds the module.
    saved_argv = sys.argv
    sys.argv = (["-m"] if is_module else [target]) + list(args)
    # From torch 2.0 the first optimizer a script makes imports torch._dynamo (torch.optim keeps
    # dynamo out of its methods by a wrapper that imports it on first use): 1 s on a 2-core
    # machine, about 5 s on a GPU machine's torch (docs/benchmarks.md, "On a GPU"). Ranks forked
    # from a zygote that has it skip that at every restart.
    try:
        if int(torch.__version__.split(".")[0]) >= 2:
            preload_torch_part("torch._dynamo")
        if is_module:
            # The module's own file when it is a plain module under the current directory.
            names += top_level_imports(os.path.join(local_dir, *target.split(".")) + ".py")
        else:
            names += top_level_imports(target)
        preload(names, local_dir)
    finally:
        sys.argv = saved_argv
        _IMPORT_OUTPUT.stop()
    _IMPORTS_ENV.update(environment_changes(env_before, dict(os.environ)))
    if zygote:
        fd = serve_forks(fd, standby_title)  # returns in each forked standby
    helper = None
    try:
        if cmd.cuda is None:
            handed = wait_for_handover(fd)
        else:  # in a standby, never in the zygote: a fork copies no CUDA state
            handed, helper = wait_for_handover_beside(fd, cmd.cuda)
    except BadHandover as e:
        sys.stderr.write(f"ddprun standby: bad hand-over from ddprun: {e}\n")
        leave(EXIT_BAD_HANDOVER, own_template=not zygote)
    if handed is None:
        leave(0, own_template=not zygote)  # never became a worker: nothing to report
    env, own_argv, cmdline = handed
    if zygote:
        own_template_dir()
    if helper is not None:
        wait_until_ready(helper, cmd.cuda)
    if own_argv is not None:  # this rank's own script and arguments (${local_rank} replaced)
        target, args = own_argv[0], own_argv[1:]
    become_worker(env, cmdline, run_path, is_module, target, args)
    wait_for_store(env)
    del env, handed
    _IMPORT_OUTPUT.replay()  # empty but in a rank forked from the zygote
    try:
        run_script(run_path, is_module, target)
    except (SystemExit, KeyboardInterrupt):
        raise  # exit code, and SIGINT's own exit, exactly as in a fresh interpreter
    except BaseException as e:  # noqa: BLE001
        report_uncaught(e)
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as interrupt:
        # The interpreter reports it and ends by SIGINT, as a fresh one does. Raised in the
        # script, it shows the script's frames only: re-raised bare, from Python 3.11 with the
        # traceback it has now; before, bare raise keeps the one it had, so this frame stays.
        if _SCRIPT_STARTED:
            trimmed = without_bootstrap(interrupt.__traceback__)
            if sys.version_info < (3, 11):
                raise interrupt.with_traceback(trimmed)
            interrupt.__traceback__ = trimmed
        raise
