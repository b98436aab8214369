# The README's commands. Each one sets everything up first (scripts/bootstrap.sh, idempotent).
.PHONY: run demo test test-random bench setup

setup:
	bash scripts/bootstrap.sh

run: setup
	.venv/bin/fedsim run

demo: setup
	.venv/bin/fedsim demo

test: setup
	.venv/bin/python -m pytest -q --durations=25

# opt-in: fresh random seeds and hypothesis examples (make test runs fixed ones); a failure prints
# its seed, rerun it with --seed=N
test-random: setup
	.venv/bin/python -m pytest -q --random-seeds

bench: setup
	.venv/bin/python -m pytest benchmarks/ --benchmark-only -q
	.venv/bin/python scripts/fidelity.py --size full --out .benchmarks/fidelity-full-cpu.json
