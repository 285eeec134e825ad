"""For the standby tests' scripts: do the agent's standbys wait for their hand-over yet?"""
import os


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


def readying_gpu(pid):
    """True while the standby's thread named ddprun-cuda (--standby_cuda) runs."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                if f.read().strip() == "ddprun-cuda":
                    return True
        except OSError:
            pass
    return False


def blocks_reading_its_handover(pid):
    """True when `pid` is one of ddprun's Python standbys (its command line says so) and blocks
    in read() on a socket, waiting for its hand-over, with its GPU ready (--standby_cuda)."""
    try:
        if not command_line(pid).startswith("ddprun standby: ") or readying_gpu(pid):
            return False
        with open(f"/proc/{pid}/syscall") as f:
            call = f.read().split()
        # read(fd, ...): syscall 0 on x86-64, its first argument the descriptor.
        return call[0] == "0" and os.readlink(
            f"/proc/{pid}/fd/{int(call[1], 16)}").startswith("socket:")
    except (OSError, ValueError, IndexError):
        return False


def standbys_waiting():
    """True once two standbys under the agent (our parent) block reading their hand-over."""
    return sum(blocks_reading_its_handover(pid) for pid in agent_children()) >= 2
