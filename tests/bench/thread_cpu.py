#!/usr/bin/env python3
"""Each thread's share of a command's CPU time, read from /proc, for machines without `perf`.

    python3 tests/bench/thread_cpu.py SHARES -- COMMAND [ARGS...]

Runs COMMAND (its stdout and stderr pass through), reads each thread's CPU time under
/proc/PID/task/ every 10 ms while it runs, and writes to SHARES one line per thread name,
"NAME PERCENT", the same lines scaling_bench.sh reads from `perf report --sort comm`.
A thread's CPU time is its last reading: `schedstat`'s nanoseconds where the kernel has them,
else `stat`'s utime + stime, whose clock ticks (10 ms) round a thread's short bursts down to
nothing. A thread that lives less than 10 ms, and the CPU a thread spends in its last 10 ms,
are missed, so the shares are a little low for short-lived threads (a parquet decoding thread
lives for one shard). The process's whole CPU time (user + system, its threads that ended
included, in seconds) and its peak resident set (KiB) go to SHARES.cpu; each thread name's seconds
on a CPU and seconds runnable but waiting for one (schedstat's second field: more threads than
cores, or a VM's host taking them) to SHARES.runq, "NAME RUN_S WAIT_S". Exits with the command's
status.
"""
import os
import subprocess
import sys
import time


def read_threads(pid: int, seen: dict) -> None:
    """Updates seen[tid] = (name, CPU time, run-queue time) for every thread of pid alive now."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The name is in parentheses and may hold spaces; the fields after it are fixed.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                # Nanoseconds on a CPU, and runnable but waiting for one.
                cpu, runq = (int(x) for x in f.read().split()[:2])
        except (OSError, ValueError, IndexError):
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
            runq = 0
        seen[tid] = (name, cpu, runq)


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    shares_path, command = sys.argv[1], sys.argv[3:]
    child = subprocess.Popen(command)
    seen: dict = {}
    while True:
        read_threads(child.pid, seen)
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid == child.pid:
            break
        time.sleep(0.01)
    by_name: dict = {}
    runq_by_name: dict = {}
    for name, cpu, runq in seen.values():
        by_name[name] = by_name.get(name, 0) + cpu
        runq_by_name[name] = runq_by_name.get(name, 0) + runq
    total = sum(by_name.values()) or 1
    with open(shares_path, "w") as out:
        for name, cpu in sorted(by_name.items(), key=lambda kv: -kv[1]):
            out.write(f"{name} {100 * cpu / total:.2f}\n")
    with open(shares_path + ".cpu", "w") as out:
        out.write(f"{usage.ru_utime + usage.ru_stime:.3f} {usage.ru_maxrss}\n")
    with open(shares_path + ".runq", "w") as out:
        for name, cpu in sorted(by_name.items(), key=lambda kv: -kv[1]):
            out.write(f"{name} {cpu / 1e9:.3f} {runq_by_name[name] / 1e9:.3f}\n")
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
