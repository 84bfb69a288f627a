#!/usr/bin/env bash
# What the live server costs a run, two ways, on the quick start (shortened), run alternately
# without the server and with it while a client polls it as the page does (api/snapshot and
# api/events each second, api/history and the page once), PAIRS times:
#   - tokens/s, the log stage's figure at the last step, each run and the medians (noisy: on two
#     busy cores a pair differs by a few percent either way, whatever the server does);
#   - CPU time, read from /proc/PID/task/*/stat while the run lasts: the server's own threads
#     (named live-listener and live-worker) and the monitor thread, which renders what the server
#     sends, against the whole process. The server's share of the process's CPU time is what it
#     can take from training on a machine whose cores training fills; the monitor's extra time
#     counts as the server's (with the server against without it, in the same pair).
# Run it on an otherwise quiet machine, and note the load it prints.
#
#   tools/bench_live.sh [PAIRS] [STEPS]       (defaults: 3 pairs of 60-step runs)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PIPELINE=${PIPELINE:-$ROOT/build/tools/pipeline}
PAIRS=${1:-3}
STEPS=${2:-60}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cd "$ROOT"
python3 - "$PIPELINE" "$PAIRS" "$STEPS" "$WORK" <<'PY'
import json, os, re, statistics, subprocess, sys, threading, time, urllib.request

pipeline, pairs, steps, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tick = os.sysconf("SC_CLK_TCK")


def cpu_by_thread(pid, seen):
    """Updates seen[tid] = (name, CPU seconds) from /proc; threads that ended keep their last."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seen[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)  # utime + stime


def poll(log, proc):
    """Polls the run's server as the page does, until the run ends."""
    url = None
    while proc.poll() is None and url is None:
        m = re.search(r"live page: (http://\S+)", open(log).read())
        url = m.group(1) if m else None
        time.sleep(0.1)
    get = lambda p: urllib.request.urlopen(url + p, timeout=5).read()
    try:
        get("")
        get("api/history")
        while proc.poll() is None:
            get("api/snapshot")
            get("api/events")
            time.sleep(1)
    except Exception:
        pass  # the run ended


def run(kind):
    d = os.path.join(work, "run-" + kind)
    subprocess.run(["rm", "-rf", d], check=True)
    args = [pipeline, "run", "quickstart.toml", "--set", f"training.steps={steps}", "--set", "eval.every=0",
            "--set", "checkpoint.at_end=false", "--set", "logging.live=off", "--set", "run.dir=" + d]
    if kind == "served":
        args += ["--serve", "0"]
    log = os.path.join(work, kind + ".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    client = threading.Thread(target=poll, args=(log, proc)) if kind == "served" else None
    if client:
        client.start()
    seen = {}
    while proc.poll() is None:
        cpu_by_thread(proc.pid, seen)
        time.sleep(0.2)
    if client:
        client.join()
    if proc.returncode != 0:
        sys.exit(f"bench_live: pipeline run failed ({kind}); log: {open(log).read()[-2000:]}")
    last = open(os.path.join(d, "metrics.jsonl")).read().strip().splitlines()[-1]
    total = sum(c for _, c in seen.values())
    of = lambda prefix: sum(c for n, c in seen.values() if n.startswith(prefix))
    return {"tok_s": json.loads(last)["tokens_per_s"], "cpu": total, "live": of("live-"), "monitor": of("monitor")}


shares, plain_tok, served_tok = [], [], []
for i in range(1, pairs + 1):
    a, b = run("plain"), run("served")
    extra = b["live"] + max(0.0, b["monitor"] - a["monitor"])
    shares.append(100 * extra / b["cpu"])
    plain_tok.append(a["tok_s"])
    served_tok.append(b["tok_s"])
    load = open("/proc/loadavg").read().split()[:3]
    print(f"pair {i}: without the server {a['tok_s']:.0f} tokens/s, with it and a client polling {b['tok_s']:.0f} "
          f"({100 * (b['tok_s'] / a['tok_s'] - 1):+.2f}%); CPU: process {a['cpu']:.2f} s and {b['cpu']:.2f} s, "
          f"server threads {b['live']:.2f} s, monitor {a['monitor']:.2f} s and {b['monitor']:.2f} s: the server's "
          f"share {shares[-1]:.2f}% (load {' '.join(load)})", flush=True)
mp, ms = statistics.median(plain_tok), statistics.median(served_tok)
print(f"median: without {mp:.0f} tokens/s, with {ms:.0f} tokens/s: {100 * (ms / mp - 1):+.2f}%; "
      f"the server's share of the process's CPU time: median {statistics.median(shares):.2f}%, "
      f"most {max(shares):.2f}%")
PY
