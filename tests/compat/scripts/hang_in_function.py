"""A torch script that prints one line and then hangs inside a named function (the hang
forensics test): ddprun's watchdog counts the line as progress, judges the silence a hang and
makes the interpreter print where it is before killing it."""
import time

import torch  # noqa: F401  a torch script, as most under ddprun are


def stuck_in_a_collective():
    print("step 1 done", flush=True)
    time.sleep(600)


stuck_in_a_collective()
