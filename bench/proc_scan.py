"""Processes found through /proc, for the benchmarks that count what a job leaves behind."""
import os


def live_pids(mark: str, skip: tuple[str, ...] = ()) -> list[int]:
    """Pids of running (not zombie) processes whose command line holds `mark` and none of
    `skip`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark in cmd and state != "Z" and not any(s in cmd for s in skip):
            out.append(int(pid))
    return out
