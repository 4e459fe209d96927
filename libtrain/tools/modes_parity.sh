#!/usr/bin/env bash
# modes_parity.sh — runs every coll-train mode on one small model and seed and writes each
# run's per-step losses, as hexadecimal floats (bit for bit), to OUTDIR/<mode>.losses.
# Two trees (before and after a refactor) give the same bits when
#
#   libtrain/tools/modes_parity.sh OLD/coll-train /tmp/old
#   libtrain/tools/modes_parity.sh NEW/coll-train /tmp/new
#   diff -r /tmp/old /tmp/new
#
# prints nothing. Resumes and reshardings resume their own tree's checkpoints (a
# refactor may change the checkpoint format, not what a resumed run computes).
set -euo pipefail
cli=$1
out=$2
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--layers 2 --channels 32 --heads 4 --max-seq 32 --seq 16 --batch 4 --steps 6
       --threads 1 --eval-every 0 --sample-len 0 --quiet --seed 7)

run() { # name, flags...
    local name=$1
    shift
    "$cli" "${model[@]}" "$@" --losses "$out/$name.losses" >"$work/$name.log" 2>&1 || {
        echo "modes_parity: $name failed:" >&2
        cat "$work/$name.log" >&2
        return 1
    }
    echo "$name: $(wc -l <"$out/$name.losses") steps"
}

run none
run ddp2 --parallel ddp --ranks 2
run ddp2_no_overlap --parallel ddp --ranks 2 --no-overlap
run ddp2_accum2 --parallel ddp --ranks 2 --accum 2
run ddp3_accum2_no_overlap --parallel ddp --ranks 3 --accum 2 --no-overlap --bucket-mb 0.01
run fsdp2_zero1 --parallel fsdp --zero 1 --ranks 2
run fsdp2_zero2 --parallel fsdp --zero 2 --ranks 2
run fsdp2_zero3 --parallel fsdp --zero 3 --ranks 2
run fsdp3_zero3_accum2 --parallel fsdp --zero 3 --ranks 3 --accum 2
run tp2 --tp 2
run tp2_sp --tp 2 --sp
run tp2_x_ddp2 --tp 2 --ranks 4 --parallel ddp
run tp2_x_fsdp2 --tp 2 --ranks 4 --parallel fsdp --zero 3
if command -v mpirun.openmpi >/dev/null; then
    run ddp2_mpi --parallel ddp --ranks 2 --backend mpi
fi

# resume: stop after step 3 with a checkpoint, continue to step 6
ck() { echo "$work/$1/ckpt_00000003.bin"; }
run none_first3 --ckpt-dir "$work/none" --ckpt-every 3 --stop-after 3
run none_resumed --resume "$(ck none)"
run ddp2_first3 --parallel ddp --ranks 2 --ckpt-dir "$work/ddp" --ckpt-every 3 --stop-after 3
run ddp2_resumed --parallel ddp --ranks 2 --resume "$(ck ddp)"
# resharding: FSDP at 4 ranks resumed at 2 (twice the batch: the same global batch) and
# in one process; TP at 2 resumed in one process and as FSDP at 2 ranks
run fsdp4_first3 --parallel fsdp --ranks 4 --batch 2 --ckpt-dir "$work/fsdp" --ckpt-every 3 \
    --stop-after 3
run fsdp4_as_fsdp2 --parallel fsdp --ranks 2 --batch 4 --resume "$(ck fsdp)"
run fsdp4_as_none --batch 8 --resume "$(ck fsdp)"
run tp2_first3 --tp 2 --ckpt-dir "$work/tp" --ckpt-every 3 --stop-after 3
run tp2_as_none --resume "$(ck tp)"
run tp2_as_fsdp2 --parallel fsdp --ranks 2 --batch 2 --resume "$(ck tp)"
# pipelines: --pp 2 (1f1b, 2 micro-batches of 2 rows: the others' global batch of 4)
# stopped and resumed; resharded in one process, as TP at 2 and as --pp 2 gpipe; a
# one-process checkpoint resumed as --pp 2; --pp 2 x --tp 2 resumed as --pp 2
pp=(--pp 2 --micro-batches 2 --batch 2)
run pp2_first3 "${pp[@]}" --ckpt-dir "$work/pp" --ckpt-every 3 --stop-after 3
run pp2_resumed "${pp[@]}" --resume "$(ck pp)"
run pp2_as_none --resume "$(ck pp)"
run pp2_as_tp2 --tp 2 --resume "$(ck pp)"
run pp2_as_gpipe "${pp[@]}" --schedule gpipe --resume "$(ck pp)"
run none_as_pp2 "${pp[@]}" --resume "$(ck none)"
run pp2_tp2_first3 "${pp[@]}" --tp 2 --ckpt-dir "$work/pptp" --ckpt-every 3 --stop-after 3
run pp2_tp2_as_pp2 "${pp[@]}" --resume "$(ck pptp)"
