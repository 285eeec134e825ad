"""For the standby tests' scripts: do the agent's standbys wait for their hand-over yet?"""
import importlib.util
import os

# The bootstrap's own readiness check, loaded from its file: the probes compare sys.path, which
# must stay as the script's.
_spec = importlib.util.spec_from_file_location("ddprun_standby", os.path.join(
    os.path.dirname(os.path.realpath(__file__)), "..", "..", "..", "agent", "python",
    "ddprun_standby.py"))
_bootstrap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bootstrap)
waits_ready = _bootstrap.waits_ready


def command_line(pid):
    """What ps shows as `pid`'s command: /proc/<pid>/cmdline, its arguments joined by spaces."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").replace(b"\0", b" ").decode()


def agent_children():
    """The pids of the processes whose parent is the agent (our parent)."""
    agent = os.getppid()
    pids = []
    for task in os.listdir(f"/proc/{agent}/task"):
        with open(f"/proc/{agent}/task/{task}/children") as f:
            pids += [int(pid) for pid in f.read().split()]
    return pids


def blocks_reading_its_handover(pid):
    """True when `pid` is one of ddprun's Python standbys (its command line says so) waiting
    for its hand-over, its GPU ready with --standby_cuda (the bootstrap's waits_ready)."""
    try:
        return command_line(pid).startswith("ddprun standby: ") and waits_ready(pid)
    except OSError:
        return False


def standbys_waiting():
    """True once two standbys under the agent (our parent) block reading their hand-over."""
    return sum(blocks_reading_its_handover(pid) for pid in agent_children()) >= 2
