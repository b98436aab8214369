#!/bin/bash
# The flic-paper preset on its four cells (both toys, 20 and 50 clients), 3 seeds, one run at a time,
# with the extra arguments given (a --set, --algorithms, --config); writes OUTDIR/TAG-CELL/.
# usage: studies/flic-schedule/sweep.sh OUTDIR TAG [fedsim run arguments...]
# FEDSIM names the command (default: fedsim); DATA_EXTRA is appended to each dataset string
# (e.g. "&subsample=1"); run from the repository root.
set -e
out=$1; tag=$2; shift 2
LM='toy:linear-mapping?n_classes=20&classes_per_client=3&latent_dim=5&separation=0.5&dims=3-100'
NF='toy:noisy-features?n_classes=20&classes_per_client=3&latent_dim=5&separation=0.8&dims=6-15&noise=1.0'
cells=("linear-mapping-20|$LM&n_spaces=20&n_train=2000&n_test=2000|20"
       "noisy-features-20|$NF&n_spaces=20&n_train=2000&n_test=1000|20"
       "linear-mapping-50|$LM&n_spaces=50&n_train=800&n_test=800|50"
       "noisy-features-50|$NF&n_spaces=50&n_train=800&n_test=400|50")
for cell in "${cells[@]}"; do
  IFS='|' read -r name ds n <<< "$cell"
  OMP_NUM_THREADS=1 nice -n 15 ${FEDSIM:-fedsim} run --preset flic-paper --dataset "$ds$DATA_EXTRA" --clients "$n" --seeds 3 \
      "$@" --threads 1 --quiet --out "$out/$tag-$name" > "$out/$tag-$name.log" 2>&1
  echo "$tag $name done $(date -u +%T)"
done
