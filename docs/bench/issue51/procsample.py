"""The box's CPU seconds by kind of process while a command runs: `python3 procsample.py OUT.tsv` samples /proc
every 2 s until SIGTERM, then writes seconds and kind, most first. A kind is pytest-xdist's workers, a `homeai
serve` child, Chromium, or the command line's first words. A process that lives under 2 s is missed, and a
process's last 2 s before it exits are not counted, so the figures are a floor."""
import os
import signal
import sys
import time
from collections import Counter

HZ = os.sysconf("SC_CLK_TCK")


def kind(pid: int) -> str | None:
    try:
        words = [w.decode(errors="replace") for w in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0") if w]
    except OSError:
        return None
    line = " ".join(words)
    if not words:
        return None
    if words[1:3] == ["-u", "-c"]:
        return "pytest-xdist's workers (the tests, their in-process daemons, llama.cpp)"
    if "-c" in words[1:3]:
        return "python -c (a script a test runs)"
    if "pytest" in line:
        return "pytest (the controller)"
    if "chrom" in words[0]:
        return "chromium"
    if "homeai" in line and "serve" in words:
        return "homeai serve (a test's child process)"
    return " ".join([os.path.basename(words[0]), *(os.path.basename(w) for w in words[1:3])])


def ticks(pid: int) -> int | None:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError):
        return None


def main(out: str) -> None:
    seen: dict[int, list] = {}  # pid -> [kind, ticks counted so far]
    spent: Counter = Counter()

    def write(*_):
        with open(out, "w") as f:
            f.writelines(f"{v / HZ:.1f}\t{k}\n" for k, v in spent.most_common())
        sys.exit(0)

    signal.signal(signal.SIGTERM, write)
    first = True
    while True:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid, t = int(name), ticks(int(name))
            if t is None:
                continue
            if pid not in seen:
                k = kind(pid)
                if k is None:
                    continue
                seen[pid] = [k, t if first else 0]  # running before: only what it spends from now
            k, counted = seen[pid]
            if t > counted:
                spent[k] += t - counted
                seen[pid][1] = t
        first = False
        time.sleep(2)


if __name__ == "__main__":
    main(sys.argv[1])
