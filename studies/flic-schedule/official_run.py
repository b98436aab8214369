"""Run one script of a scratch copy of the official FLIC code (arakotom/flic) and store what it prints.

Nothing of the official code is in this repository: SCRATCH is a copy made outside it (docs/flic.md,
"Against the official code", lists the three scratch-only changes it needs), DEPS a folder holding
the torchvision placeholder (DEPS/tvstub) and pandas (DEPS itself, pip --target). The script's
per-round test accuracies (mean over clients, %) are read from its printed lines; the last one is
its final round, in which every client trains. CPU time is the child's user + system time. The run
is stored in OUT.json under runs/METHOD/SEED (the file is created or added to; the log beside it).

usage: python studies/flic-schedule/official_run.py SCRATCH DEPS OUT.json METHOD SCRIPT.py [its arguments]
"""
import json
import os
import re
import resource
import subprocess
import sys
import time

ROUND = re.compile(r"^(?:Round\s+\d+|Final Round),.*[Aa]ccuracy: ([0-9.]+)$")
LAST10 = re.compile(r"^Average accuracy final 10 rounds: ([0-9.]+)$")


def main(argv):
    if len(argv) < 5:
        sys.exit(__doc__.strip().splitlines()[-1])
    scratch, deps, out, method, script, args = argv[0], argv[1], argv[2], argv[3], argv[4], argv[5:]
    if "--seed" not in args:
        sys.exit("official_run.py: give the script's --seed explicitly (the run is stored under it)")
    seed = args[args.index("--seed") + 1]
    if not os.path.isfile(os.path.join(scratch, script)):
        sys.exit(f"official_run.py: {script} not found in SCRATCH={scratch}; make the scratch copy first")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(deps, "tvstub"), deps]))
    cmd = ["nice", "-n", "15", sys.executable, "-u", script, *args, "--savedir", f"{out}.save/{method}-{seed}/"]
    start = time.time()
    proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
    wall = time.time() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    log = f"{out}.{method}-{seed}.log"
    with open(log, "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.exit(f"official_run.py: {script} exited {proc.returncode}; see {log}")
    lines = proc.stdout.splitlines()
    accs = [float(m.group(1)) for m in map(ROUND.match, lines) if m]
    last10 = [float(m.group(1)) for m in map(LAST10.match, lines) if m]
    record = {
        "command": " ".join(["python", "-u", script, *args]),
        "accuracy_per_round": accs,
        "final_round_all_clients": accs[-1],
        "last_regular_round": accs[-2],
        "official_last10_mean": last10[0] if last10 else None,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "wall_s": round(wall, 1),
    }
    stored = {"runs": {}}
    if os.path.exists(out):
        with open(out) as f:
            stored = json.load(f)
    stored["runs"].setdefault(method, {})[seed] = record
    with open(out, "w") as f:
        json.dump(stored, f, indent=1)
    print(f"{script} {' '.join(args)}: final {accs[-1]:.2f}, cpu {record['cpu_s']} s, wall {record['wall_s']} s")


if __name__ == "__main__":
    main(sys.argv[1:])
