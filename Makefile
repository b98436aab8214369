# The README's commands. Each one sets everything up first (scripts/bootstrap.sh, idempotent).
.PHONY: run demo test test-random bench setup

setup:
	bash scripts/bootstrap.sh

run: setup
	.venv/bin/fedsim run

demo: setup
	.venv/bin/fedsim demo

# the suite on every core (pytest-xdist; tests that share an expensive fixture on one worker).
# -p no:benchmark: no test here times anything (the suites in benchmarks/ run in child processes),
# and pytest-benchmark warns that xdist turns its timing off
test: setup
	.venv/bin/python -m pytest -q -n auto --dist loadgroup -p no:benchmark --durations=25

# opt-in: fresh random seeds and hypothesis examples (make test runs fixed ones); a failure prints
# its seed, rerun it with --seed=N
test-random: setup
	.venv/bin/python -m pytest -q --random-seeds

bench: setup
	.venv/bin/python -m pytest benchmarks/ --benchmark-only -q
	.venv/bin/python scripts/fidelity.py --size full --out .benchmarks/fidelity-full-cpu.json
