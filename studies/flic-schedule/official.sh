#!/bin/bash
# The official FLIC code (arakotom/flic, a scratch copy outside this repository) at the flic-paper
# setting beside fig4.sh: its FLIC ("no-hlayers", the FLIC-HL shape of fedsim's FLIC) and Local on
# its toy TOY (toy_3: linear mapping, toy_2: noisy features), for each client count and seed given,
# one run at a time. T 50, r 0.1, M 10, batch 100, Adam 1e-3, 3 classes per client are its defaults,
# written out here; the alignment is reduced from its default (--align_epochs 100 --align_bs 10,
# hours on this CPU) to --align_epochs 10 --align_bs 100. Writes OUTDIR/official-NAME-Nclients.json
# (studies/flic-schedule/official_run.py; NAME linear-mapping or noisy-features).
# usage: studies/flic-schedule/official.sh SCRATCH DEPS OUTDIR TOY "N ..." "SEED ..."; run from the repository root.
set -e
scratch=$1; deps=$2; out=$3; toy=$4; counts=($5); seeds=($6)
case $toy in toy_3) name=linear-mapping ;; toy_2) name=noisy-features ;;
  *) echo "official.sh: TOY is toy_3 (linear mapping) or toy_2 (noisy features), not '$toy'" >&2; exit 2 ;; esac
for n in "${counts[@]}"; do  # its noniid_tensor deals 20 classes into 3N equal shards
  if ! [[ $n =~ ^[1-9][0-9]*$ ]] || (( 3 * n % 20 )); then
    echo "official.sh: client count '$n': the official toy needs 3N divisible by 20 classes (20, 40, 60, 100, ...)" >&2; exit 2; fi
done
common=(--dataset "$toy" --shard_per_user 3 --num_classes 20 --frac 0.1 --epochs 50 --local_ep 10 --local_bs 100 --lr 0.001)
for n in "${counts[@]}"; do
  for s in "${seeds[@]}"; do
    python studies/flic-schedule/official_run.py "$scratch" "$deps" "$out/official-$name-${n}clients.json" FLIC main_flic.py \
        --seed "$s" --num_users "$n" "${common[@]}" --model_type no-hlayers --local_rep_ep 1 \
        --reg_w 0.001 --reg_class_prior 0.001 --start_optimize_rep 20 --align_epochs 10 --align_bs 100
    python studies/flic-schedule/official_run.py "$scratch" "$deps" "$out/official-$name-${n}clients.json" Local main_het_competitor.py \
        --seed "$s" --alg local --num_users "$n" "${common[@]}"
  done
done
