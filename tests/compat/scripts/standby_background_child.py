"""For tests/compat/python_standby_test.cpp: starts a child that stays in the rank's process
group (as `cmd &` in a shell would), appends "child<LOCAL_RANK> <pid>" to the file named by its
first argument, and waits to be killed. The child's command line names that file."""
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    pids = sys.argv[1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3011)", pids])
    with open(pids, "a", encoding="utf-8") as out:
        out.write(f"child{os.environ['LOCAL_RANK']} {child.pid}\n")
    time.sleep(3011)
