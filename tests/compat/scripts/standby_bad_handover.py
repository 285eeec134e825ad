"""For tests/compat/python_standby_test.cpp: starts ddprun's Python standby bootstrap as the agent
does (its hand-over descriptor in DDPRUN_STANDBY_FD), waits until it blocks reading the hand-over,
sends it a message that is not a hand-over, and prints as JSON its exit status, its stderr and
whether the stand-in driver's context (FAKE_CUDA_LOG) was made before it exited. With `sigint`
last, sends a good hand-over instead and, once it is acknowledged, a SIGINT.

    standby_bad_handover.py BOOTSTRAP CUDA_MODE|off SCRIPT [bad|sigint]
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time


def blocked_reading(pid, fd):
    """Whether `pid`'s main thread waits in a system call on descriptor `fd` (its hand-over)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            call = f.read().split()
        return len(call) > 1 and call[0] not in ("running", "-1") and int(call[1], 16) == fd
    except (OSError, ValueError):
        return False


def driver_log():
    try:
        with open(os.environ.get("FAKE_CUDA_LOG", "/nonexistent")) as f:
            return f.read()
    except OSError:
        return ""


def main():
    bootstrap, cuda, script = sys.argv[1:4]
    sigint = sys.argv[4:] == ["sigint"]
    ours, theirs = socket.socketpair()
    fd = theirs.fileno()
    argv = [sys.executable, "-u", bootstrap, "--room=" + "r" * 64]
    if cuda != "off":
        argv.append("--cuda=" + cuda)
    proc = subprocess.Popen(argv + ["--", script], pass_fds=[fd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            env=dict(os.environ, DDPRUN_STANDBY_FD=str(fd)))
    theirs.close()
    deadline = time.monotonic() + 60
    # With a context: sent while the stand-in driver makes it (and holds what its teardown at
    # exit() waits for, as a real driver can: the standby must leave with _exit).
    while not (blocked_reading(proc.pid, fd)
               and (cuda == "off" or "making-context" in driver_log())):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            sys.exit(f"the standby never waited for its hand-over: {proc.communicate()[1]!r}")
        time.sleep(0.02)
    acknowledged = False
    if sigint:
        ours.sendall(b'{"env": {}}')
        ours.shutdown(socket.SHUT_WR)
        ours.settimeout(30)
        acknowledged = ours.recv(1) != b""
        time.sleep(1)  # now waiting for its GPU, before the script
        proc.send_signal(signal.SIGINT)
    else:
        ours.sendall(b'{"env": ')
        ours.shutdown(socket.SHUT_WR)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        sys.exit("the standby did not exit within 60 s of a bad hand-over or a SIGINT")
    if not sigint:
        acknowledged = ours.recv(1) != b""
    print(json.dumps({"code": proc.returncode, "err": err.decode(errors="replace"),
                      "acknowledged": acknowledged,
                      "context_made": "cuDevicePrimaryCtxRetain" in driver_log()}))


if __name__ == "__main__":
    main()
