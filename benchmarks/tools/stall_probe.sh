#!/usr/bin/env bash
# What a long-running process and its descendants are doing, every INTERVAL seconds, until it exits:
#     bash benchmarks/tools/stall_probe.sh PID [FIRST_DELAY_S] [INTERVAL_S] >> probe.txt
# Per sample: memory, then for the process and each descendant its state (R running, S sleeping,
# D uninterruptible: disk or driver), kernel wait channel, CPU %, resident KB and command line, then
# py-spy's Python and native stacks of every Python process among them (where `py-spy` is on PATH
# or in /tmp/site/bin: carry its wheel in .whl), and a SIGUSR1 to PID (benchmarks/dit/dit.py prints its
# threads' stacks on it here; where it never reaches Python, py-spy's stacks still do;
# PROBE_USR1=0 for a process without such a handler, which the signal would end). Used on the GPU
# machine when a kopt.compile ran past its time with the GPU idle and its log said only the step it
# was in.
set -u
root=$1; first=${2:-150}; interval=${3:-60}
spy=$(command -v py-spy || echo /tmp/site/bin/py-spy)
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$s" ] && [ "${s:0:1}" != Z ]; }  # a zombie has exited
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
sleep "$first"
while alive "$root"; do
    echo "=== $(date +%T) ==="
    free -m | sed -n 2p
    pids=$(echo "$root" $(descendants "$root"))  # one line, single spaces
    ps -o pid,ppid,stat,wchan:24,pcpu,rss,etime,args -p "${pids// /,}" | cut -c1-220
    for p in $pids; do
        case "$(cat /proc/"$p"/comm 2>/dev/null)" in
            python*|pt_*)
                echo "--- py-spy $p"
                timeout 60 "$spy" dump --native --pid "$p" 2>&1 | head -80 ;;
        esac
    done
    [ "${PROBE_USR1:-1}" = 1 ] && kill -USR1 "$root" 2>/dev/null
    sleep "$interval"
done
