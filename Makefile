# The two commands of the README. Each one sets everything up first (scripts/bootstrap.sh).
.PHONY: demo test bench setup

setup:
	bash scripts/bootstrap.sh

demo: setup
	.venv/bin/fedsim demo

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python -m pytest benchmarks/ --benchmark-only -q
