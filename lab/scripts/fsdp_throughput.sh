#!/bin/sh
# ZeRO-1/2/3 vs DDP at N=2, default model, interleaved, 3 repetitions
C=${C:-build/libtrain/coll-train}
A="--steps 12 --eval-every 0 --quiet --ranks 2"
for rep in 1 2 3; do
  for m in "ddp" "fsdp --zero 1" "fsdp --zero 2" "fsdp --zero 3"; do
    out=$($C $A --parallel $m 2>&1)
    tok=$(echo "$out" | grep -o '[0-9]* tok/s' | head -1)
    exp=$(echo "$out" | grep -o 'exposed comm [0-9.]* ms' | head -1)
    echo "$rep | $m | $tok | $exp"
  done
done
