"""For the standby tests' scripts: do the agent's standbys wait for their hand-over yet?"""
import os


def blocks_reading_its_handover(pid):
    """True when `pid` runs ddprun's Python bootstrap and blocks in read() on a socket: a standby
    waiting for its hand-over (the zygote, which forks standbys, waits in recvmsg instead). Its
    environment cannot say which descriptor: a forked standby's /proc/<pid>/environ still shows
    the zygote's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"ddprun_standby.py" not in f.read():
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
    agent = os.getppid()
    found = 0
    for task in os.listdir(f"/proc/{agent}/task"):
        with open(f"/proc/{agent}/task/{task}/children") as f:
            pids = f.read().split()
        for pid in pids:
            if blocks_reading_its_handover(pid):
                found += 1
    return found >= 2
