"""Time from `pipeline run` to the first training step, on a dataset (Parquet or prepared):

    first_step.py PIPELINE DATASET RUN_DIR

Runs the quick-start config (a small model on the CPU, so the step itself is short) for 2 steps
with eval off, and times, from the moment the process is started, the first "step 1/" line. The
first batch reached train before that line by the step's own time, which metrics.jsonl gives
(host_ms of forward, backward and step): the time to the first batch is printed as both."""
import json
import os
import subprocess
import sys
import time

pipeline, dataset, run_dir = sys.argv[1:4]
args = [pipeline, "run", "quickstart.toml", "--set", 'data.dataset="%s"' % dataset, "--set", "eval.every=0",
        "--set", "training.steps=2", "--set", "logging.every=1", "--set", 'logging.live="off"',
        "--set", "checkpoint.at_end=false", "--set", "checkpoint.every=0", "--set", 'run.dir="%s"' % run_dir]
t0 = time.monotonic()
p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
first = None
out = []
for line in p.stdout:
    out.append(line)
    if first is None and line.startswith("step") and " 1/" in line:
        first = time.monotonic() - t0
rc = p.wait()
if rc != 0 or first is None:
    sys.exit("first_step.py: pipeline run failed (%d):\n%s" % (rc, "".join(out[-20:])))
with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    step1 = json.loads(f.readline())
step_s = sum(step1.get("host_ms", {}).values()) / 1e3
print(json.dumps({"dataset": dataset, "first_step_line_s": round(first, 3), "step_s": round(step_s, 3),
                  "first_batch_s": round(first - step_s, 3)}))
