#!/bin/bash
# The Fig. 4-style curve (issue 31 item 4, re-run for issue 43): the flic-paper preset on both toys at
# each client count given (default 20 50 100), 5 seeds, one run at a time under nice -n 15 with one
# thread. Per cell two runs: Local + FLIC at the preset (the official schedule, subsampling and last
# round are the preset's own since issue 43), and HetFedRep (docs/flic.md: FLIC without its alignment,
# W2 and anchor-sample terms, the representation trained from round 0); writes
# OUTDIR/{preset,hetfedrep}-TOY-N/ and a .log beside each.
# The dataset strings are the preset's with only the client count changed: 2,000 training rows per
# class shared among the 3N/20 clients that hold it (40000/N per client, before the subsampling);
# test rows likewise (2,000 per class on linear-mapping, 1,000 on noisy-features).
# usage: studies/flic-schedule/fig4.sh OUTDIR [N ...]; FEDSIM names the command (default: fedsim);
# run from the repository root.
set -e
out=$1; shift
counts=("${@:-20 50 100}"); counts=(${counts[*]})
LM='toy:linear-mapping?n_classes=20&classes_per_client=3&latent_dim=5&separation=0.5&dims=3-100'
NF='toy:noisy-features?n_classes=20&classes_per_client=3&latent_dim=5&separation=0.8&dims=6-15&noise=1.0'
for n in "${counts[@]}"; do
  if ! [[ $n =~ ^[1-9][0-9]*$ ]] || (( 40000 % n )); then echo "fig4.sh: client count '$n' is not a whole number dividing 40000 (2,000 rows x 20 classes); use e.g. 20, 50, 100, 200" >&2; exit 2; fi
done
mkdir -p "$out"
for n in "${counts[@]}"; do
  for toy in linear-mapping noisy-features; do
    if [ "$toy" = linear-mapping ]; then ds="$LM&n_spaces=$n&n_train=$((40000 / n))&n_test=$((40000 / n))&subsample=1"
    else ds="$NF&n_spaces=$n&n_train=$((40000 / n))&n_test=$((20000 / n))&subsample=1"; fi
    for run in preset hetfedrep; do
      if [ "$run" = preset ]; then extra=()
      else extra=(--algorithms flic --set flic.rep_start_round=0 --set flic.lam=0 --set flic.anchor_ce=0 --set flic.align_epochs=0); fi
      OMP_NUM_THREADS=1 nice -n 15 ${FEDSIM:-fedsim} run --preset flic-paper --dataset "$ds" --clients "$n" --seeds 5 \
          "${extra[@]}" --threads 1 --quiet --out "$out/$run-$toy-$n" > "$out/$run-$toy-$n.log" 2>&1
      echo "$run $toy $n done $(date -u +%T)"
    done
  done
done
