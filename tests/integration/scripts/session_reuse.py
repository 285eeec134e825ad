"""Run as pid 1 of a pid namespace of its own (unshare --pid --fork --mount --mount-proc), as
root: a worker of `ddprun --cleanup subreaper` ends early while its group runs on; its pid, the
id of its session, is then taken by an unrelated daemon that starts a session, forks and exits,
leaving a member whose leader is gone. ddprun is SIGKILLed: the daemon's member must outlive
it. Prints "daemon alive: True|False"; any other ending is an error (exit 2). Every process
here ends with this one (the namespace's init). Usage: session_reuse.py DDPRUN DIR"""
import os
import signal
import subprocess
import sys
import time

ddprun, work = sys.argv[1], sys.argv[2]
early_file = os.path.join(work, "early")


def wait_for(check, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


# Rank 0 writes its pid and exits 0; rank 1 sleeps, so the group runs on. (ddprun makes `$$$$`
# the shell's `$$`, as torchrun does.)
worker = ('if [ "$LOCAL_RANK" = 0 ]; then echo $$$$ > "$0.tmp" && mv "$0.tmp" "$0"; '
          'else exec sleep 600; fi')
job = subprocess.Popen([ddprun, "--cleanup", "subreaper", "--nproc_per_node", "2",
                        "--no_python", "/bin/sh", "-c", worker, early_file],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
if not wait_for(lambda: os.path.exists(early_file), 30):
    print("rank 0 did not start")
    sys.exit(2)
early = int(open(early_file).read())
# Rank 0 gone and its session empty; the watcher has looked at least twice since.
if not wait_for(lambda: not os.path.exists(f"/proc/{early}"), 10):
    print("rank 0 did not end")
    sys.exit(2)
time.sleep(2.5)
# The next process forked gets pid `early`: it leads a new session, forks a member, exits.
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(early - 1))
r, w = os.pipe()
leader = os.fork()
if leader == 0:
    os.setsid()
    member = os.fork()
    if member == 0:
        os.execv("/bin/sleep", ["sleep", "600"])
    os.write(w, str(member).encode())
    os._exit(0)
os.close(w)
member = int(os.read(r, 64))
os.waitpid(leader, 0)
if leader != early or os.getsid(member) != early:
    print(f"pid {early} was not taken (got {leader}, session {os.getsid(member)})")
    sys.exit(2)
time.sleep(1.5)  # looked at again
job.send_signal(signal.SIGKILL)
job.wait()


def member_state():
    try:
        return open(f"/proc/{member}/stat").read().rsplit(") ", 1)[1][0]
    except OSError:
        return "gone"


time.sleep(1.5)  # the watcher's kills
print("daemon alive:", member_state() not in ("gone", "Z"))
