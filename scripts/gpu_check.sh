#!/usr/bin/env bash
# gpu_check.sh — the GPU run (issue 43), on a machine with a GPU and no network.
#
#   scripts/gpu_prepare.sh                       # HERE, once: fetches .gpu/debs
#   # on the GPU machine (device tool: carry [".gpu"]), all of it in one call of about
#   # 4 minutes on an H200 (2026-11-30: 238 s), bounded by GPU_BUDGET:
#   GPU_BUDGET=330 scripts/gpu_check.sh torchbuild build test torch bench train
#   # here, without a GPU, every step up to the first one that needs a GPU (GPU_PYTHON:
#   # a python3 with torch >= 2 for the torch stages, e.g. /opt/libcoll/torch-2.15/bin/python3):
#   GPU_PYTHON=... scripts/gpu_check.sh --rehearse torchbuild build test bench train torch
#
# Stages (any order, each appends to its own file under $OUT, default ./gpu-results):
#   build  unpacks .gpu/debs into /tmp/gpu-prefix (Criterion, OpenBLAS, pkgconf; a
#          fallback library only where the machine lacks it), configures build-gpu with
#          CUDA required and the CUDA tests on test/shim's runner (-Dcriterion_shim: on the
#          GPU machine Criterion's workers did not start, 2026-11-24), builds everything
#          (build.log), and writes env.txt (GPU, driver,
#          nvcc, torch).  A later stage builds first if build-gpu is missing.
#   test   the CUDA tests, none skipped when a GPU is there: test_cuda (kernels against
#          reduce.c, the device matrix at 2, 4 and 8 ranks, through a cudaStream_t too, a
#          killed and an aborted rank) and libtrain's train_cuda (the GPU against the CPU,
#          and its losses against PyTorch's on the GPU) (tests.log); then the
#          closing line of scripts/summary.py over them.
#   bench  coll-bench --device cuda: all_reduce, all_gather, reduce_scatter and broadcast
#          at N = 2, 4, 8 ranks on the machine's GPUs, 1 KiB to 1 GiB (256 MiB at 4 and 8
#          ranks while the device path is slow), each table headed
#          by the device-to-device copy rate coll-bench measures in the same run; the
#          8-byte all-reduce latency at N = 2, blocking and stream-ordered (bench.txt).
#   train  libtrain on the GPU (train.txt): GPT-2 small's shape (12 layers, 768 channels,
#          12 heads, sequence 1024; byte vocabulary) in coll-train --device cuda against
#          the same model in PyTorch (libtrain/tools/bench_torch.py), both fp32 with TF32
#          off, once each; DDP over libcoll with 2 and 4 ranks on the GPU(s), the
#          first with --trace (ddp2.json); NCCL with 2 ranks (on one GPU it refuses: its
#          answer is recorded).
#   torchbuild  starts the torch stage's build in the background (first in a call, so
#          that it overlaps the GPU stages).
#   torch  the PyTorch binding (torch/backend.cpp, a c10d::Backend) built against the
#          machine's python3 and its torch in build-torch (-Dtorch_python; the module and
#          libcoll only), then torch/tools/cuda_probe.py: CUDA tensors on 2 ranks against
#          CPU references, async ordering, 20 DDP steps -> torch.txt.  GPU_TORCH_SUITE=1
#          also builds and runs the binding's whole suite case (test_torch; minutes).
# Every stage prints what it runs; summary.txt gets one line per stage with its status.
# Must never: download anything, install into / (the prefix is under /tmp), or stop at
# the first failure (each stage runs whatever it can and says what failed).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-results}
mkdir -p "$OUT"
P=/tmp/gpu-prefix
B=$ROOT/build-gpu
REHEARSE=0
STAGES=()
for a in "$@"; do
  case $a in
  --rehearse) REHEARSE=1 ;;
  build | test | bench | train | torch | torchbuild) STAGES+=("$a") ;;
  *) echo "gpu_check: unknown argument '$a' (stages: build test bench train torch torchbuild; --rehearse)" >&2; exit 2 ;;
  esac
done
((${#STAGES[@]})) || STAGES=(build test bench train)
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
# GPU_BUDGET=S: the whole run must end within S seconds of its start (a device call's
# limit); the bench and train stages then start no run that the budget cannot hold, and
# bound each by what is left.  0 (default): no budget.
T0=$(date +%s)
BUDGET=${GPU_BUDGET:-0}
# bound SECS: prints the timeout for a run of at most SECS, or nothing when the budget
# has less than 10 s left.
bound() {
  local want=$1 left
  ((BUDGET > 0)) || { echo "$want"; return; }
  left=$((BUDGET - ($(date +%s) - T0)))
  ((left >= 10)) || return 0
  echo $((want < left ? want : left))
}
have_gpu() { nvidia-smi -L >/dev/null 2>&1; }

# ---- the carried prefix -------------------------------------------------------------
prefix() {
  [ -d .gpu/debs ] || { echo "gpu_check: no .gpu/debs: run scripts/gpu_prepare.sh here first" >&2; return 1; }
  if [ ! -f $P/.done ]; then
    mkdir -p $P
    for f in .gpu/debs/*.deb; do dpkg-deb -x "$f" $P || return 1; done
    # A fallback library only where the machine has none of that name.
    for f in .gpu/fallback/*.deb; do
      [ -e "$f" ] || continue
      local t; t=$(mktemp -d)
      dpkg-deb -x "$f" "$t"
      find "$t" -name 'lib*.so.*' -type f -o -name 'lib*.so.*' -type l | while read -r l; do
        ldconfig -p | grep -q " $(basename "$l") " ||
          { mkdir -p $P/fallback; cp -a "$l" $P/fallback/; }
      done
      rm -rf "$t"
    done
    # The carried .pc files name /usr: point them into the prefix (a sysroot for
    # pkg-config would wrongly move the machine's own .pc files there too).
    find $P -name '*.pc' -exec sed -i "s|/usr/|$P/usr/|g; s|=/usr\$|=$P/usr|" {} +
    # criterion.pc requires libffi, libgit2 and nanomsg's .pc files (their -dev packages,
    # which only a static link needs); the shared library names them itself.
    find $P -name 'criterion.pc' -exec sed -i '/^Requires/d' {} +
    touch $P/.done
  fi
  local lib=$P/usr/lib/x86_64-linux-gnu
  export PATH=$P/usr/bin:$PATH
  export PKG_CONFIG_PATH=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig
  # ld resolves the carried libraries' own needs (libgit2 for Criterion ...) through
  # LD_LIBRARY_PATH too, and the test programs find them there at run time.
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:$P/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=$lib:$lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}
}

stage_build() {
  {
    echo "== $(date -u +%FT%TZ) $(uname -srm)"
    nvidia-smi 2>&1 || echo "(no nvidia-smi: no GPU here)"
    nvcc --version 2>&1 | tail -2
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
    meson --version 2>&1 | sed 's/^/meson /'
    ninja --version 2>&1 | sed 's/^/ninja /'
    nproc
    ls -ld /dev/shm && df -h /dev/shm
  } >"$OUT/env.txt" 2>&1
  prefix || { summary "build: FAILED (no carried prefix)"; return 1; }
  local cuda=enabled
  [ $REHEARSE = 1 ] && ! command -v nvcc >/dev/null && cuda=auto
  (
    echo "== meson setup (PKG_CONFIG_PATH=$PKG_CONFIG_PATH)"
    if [ ! -f "$B/build.ninja" ]; then
      meson setup "$B" -Dwerror=true -Dcuda=$cuda -Dtrain=enabled -Dpeers=disabled \
        -Dbuildtype=release -Dcriterion_shim=true || exit 1
    fi
    grep -E "Run-time dependency (criterion|openblas)|Program nvcc" "$B/meson-logs/meson-log.txt" | tail -4
    echo "== ninja"
    ninja -C "$B" || exit 1
  ) >"$OUT/build.log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then summary "build: ok ($(grep -c '^\[' "$OUT/build.log") steps)"
  else summary "build: FAILED (tail of build.log:)"; tail -20 "$OUT/build.log" | tee -a "$OUT/summary.txt"; fi
  return $rc
}

ensure_built() { [ -f "$B/build.ninja" ] && prefix && ninja -C "$B" >/dev/null 2>&1 || stage_build; }

stage_test() {
  ensure_built || { summary "test: not run (no build)"; return 1; }
  if ! have_gpu && [ $REHEARSE = 0 ]; then summary "test: no GPU on this machine (nvidia-smi -L failed)"; fi
  # The whole coll suite is CI's; here only what needs the GPU, in bounded groups so that
  # a hang (the stream matrices hung on 2026-11-24) costs its group only (at most 480 s in
  # all, inside a 600 s device call with the build).  Each group
  # keeps its own log (meson-logs/<name>.json) for summary.py.
  local plain="cuda::classify_host_pointers cuda::driver_seen_when_loaded
    cuda::driver_check_while_loading cuda::device_rows_priced_and_chosen
    cuda::kernel_table_complete cuda::device_buffer_sentences
    cuda::select_per_pair cuda::host_path_with_cuda_off cuda::host_path_with_cuda_auto
    cuda::stream_create_without_gpu cuda::kernels_match_cpu cuda::killed_rank_device
    cuda::aborted_rank_device cuda::device_tests"
  local blocking="cuda::matrix_2_ranks cuda::matrix_4_ranks cuda::matrix_8_ranks
    cuda::matrix_4_ranks_dev_oneshot cuda::matrix_4_ranks_dev_twoshot cuda::matrix_2_ranks_ring"
  local stream="cuda::matrix_2_ranks_stream cuda::matrix_4_ranks_stream cuda::matrix_8_ranks_stream
    cuda::matrix_3_ranks_dev_twoshot_stream cuda::matrix_2_ranks_coll_stream
    cuda::matrix_4_ranks_coll_stream"
  group() { # name seconds suite [cases...]
    local name=$1 secs=$2 suite=$3; shift 3
    echo "== $(date -u +%T) $name ($suite ${*:-all cases}; at most ${secs}s)"
    timeout "$secs" meson test -C "$B" --no-rebuild --verbose --logbase "$name" \
      --timeout-multiplier 2 "$suite" ${1:+--test-args "$*"}
    echo "== $(date -u +%T) $name: exit $?"
  }
  # Two groups at a time (16 cores; the ranks share the one GPU either way), each bounded
  # so that a hang costs its group only: at most 90 + 200 s. train_cuda gets 90 s for
  # cuda::losses_match_pytorch, which imports torch twice (its probe, then
  # tools/reference.py --device cuda; ~10 s warm, more from a cold disk) with the python3
  # first on PATH whose torch sees the GPU, or $TRAIN_CUDA_PYTHON when it is set.
  {
    group train_cuda 90 train_cuda >"$OUT/tests_train.log" 2>&1 &
    group cuda_plain 60 cuda $plain
    wait $! # not `wait`: that would wait for the background torch build too
    group cuda_stream 200 cuda $stream >"$OUT/tests_stream.log" 2>&1 &
    group cuda_blocking 150 cuda $blocking
    wait $!
    pkill -9 -x test_cuda; pkill -9 -x test_train_cuda
    cat "$OUT/tests_train.log" "$OUT/tests_stream.log"
    rm -f "$OUT/tests_train.log" "$OUT/tests_stream.log"
  } >"$OUT/tests.log" 2>&1
  for l in train_cuda cuda_plain cuda_blocking cuda_stream; do
    [ -f "$B/meson-logs/$l.json" ] || { summary "test: $l: no log (cut off before it ran)"; continue; }
    python3 scripts/summary.py "$B/meson-logs/$l.json" | tail -1 | sed "s/^/test: $l: /" | tee -a "$OUT/summary.txt"
  done
  # the per-case lines: what passed, what failed and skipped and why
  grep -hE '^\[(PASS|FAIL|SKIP)' "$OUT/tests.log" | sort | uniq -c | sort -rn | head -60 >>"$OUT/tests.log"
}

stage_bench() {
  ensure_built || { summary "bench: not run (no build)"; return 1; }
  local cb="$B/bench/coll-bench" f="$OUT/bench.txt" rc=0
  if ! have_gpu; then
    summary "bench: no GPU on this machine; running one size to rehearse the command lines"
  fi
  : >"$f"
  # a run that hangs (the stream-ordered one did, 2026-11-24) must not take the stage
  local tmo=60
  run() {
    echo "\$ ${COLL_ALGO:+COLL_ALGO=$COLL_ALGO }$*" >>"$f"
    local t; t=$(bound $tmo)
    [ -n "$t" ] || { rc=1; echo "(not run: GPU_BUDGET spent)" >>"$f"; return; }
    timeout "$t" "$@" >>"$f" 2>&1; local st=$?; [ $st = 0 ] || { rc=1; echo "(exit $st)" >>"$f"; }
  }
  local big=1G
  have_gpu || big=1K
  # the small-message latency first (blocking, then stream-ordered), and one checked
  # pass: short runs that a cut-off sweep must not lose
  run "$cb" all_reduce --device cuda --ranks 2 -b 8 -e 8 -n 2000 -w 200 -c 0 -z 1 --stats
  run "$cb" all_reduce --device cuda --ranks 2 -b 8 -e 8 -n 2000 -w 200 -c 0 -z 0
  run "$cb" all_reduce --device cuda --ranks 2 -b 1K -e 64M -f 16 -n 5 -w 1 -c 1 -z 1
  have_gpu || { summary "bench: rehearsed"; return 0; }
  # the acceptance sizes: 256 MiB and 1 GiB all-reduce at 2 and 4 ranks, blocking and on
  # a stream, and the forced rows side by side
  for n in 2 4; do
    run "$cb" all_reduce --device cuda --ranks $n -b 256M -e 1G -f 4 -n 10 -w 3 -c 1 -z 1
    run "$cb" all_reduce --device cuda --ranks $n -b 256M -e 1G -f 4 -n 10 -w 3 -c 0 -z 0
  done
  # the per-rank rows beside the one-GPU row, in the same run (the tuner's choice is
  # dev_onegpu on one GPU)
  COLL_ALGO=dev_oneshot run "$cb" all_reduce --device cuda --ranks 2 -b 8 -e 8 -n 1000 -w 100 -c 0 -z 1 --stats
  COLL_ALGO=dev_twoshot run "$cb" all_reduce --device cuda --ranks 2 -b 256M -e 256M -n 10 -w 3 -c 0 -z 1
  tmo=90
  for n in 2 4 8; do
    for c in all_reduce all_gather reduce_scatter broadcast; do
      run "$cb" $c --device cuda --ranks $n -b 1K -e 256M -f 8 -n 10 -w 2 -c 0 -z 1
    done
  done
  summary "bench: $([ $rc = 0 ] && echo ok || echo 'some runs failed, see bench.txt')"
}

stage_train() {
  ensure_built || { summary "train: not run (no build)"; return 1; }
  local ct="$B/libtrain/coll-train" f="$OUT/train.txt" rc=0
  : >"$f"
  run() {
    echo "\$ $*" >>"$f"
    local t; t=$(bound 420)
    [ -n "$t" ] || { rc=1; echo "(not run: GPU_BUDGET spent)" >>"$f"; return; }
    timeout "$t" "$@" >>"$f" 2>&1; local st=$?; [ $st = 0 ] || { rc=1; echo "(exit $st)" >>"$f"; }
  }
  local gpt2=(--layers 12 --channels 768 --heads 12 --seq 1024 --max-seq 1024 --batch 4)
  local steps=12
  have_gpu || steps=2
  for rep in 1; do
    run "$ct" --device cuda "${gpt2[@]}" --steps $steps --eval-every 0 --sample-len 0
    run python3 libtrain/tools/bench_torch.py --device cuda --tf32 0 "${gpt2[@]}" --steps $steps
    have_gpu || break
  done
  local small=(--layers 12 --channels 768 --heads 12 --seq 256 --max-seq 256 --batch 8
               --steps 10 --eval-every 0 --sample-len 0)
  run "$ct" --device cuda --parallel ddp --ranks 2 --backend coll "${small[@]}" --trace "$OUT/ddp2.json"
  # the same without overlap: what the buckets cost when nothing hides them
  run "$ct" --device cuda --parallel ddp --ranks 2 --backend coll --no-overlap "${small[@]}"
  run "$ct" --device cuda --parallel ddp --ranks 4 --backend coll "${small[@]}"
  run "$ct" --device cuda --parallel ddp --ranks 2 --backend nccl "${small[@]}"
  summary "train: $([ $rc = 0 ] && echo ok || echo 'some runs failed (NCCL on one GPU is expected to), see train.txt')"
}

# The binding's build (build-torch: libcoll and the module only), apart from build-gpu
# because it is built against the machine's python3 and torch.  torch_build_start runs
# it in the background (the stage `torchbuild`, first in a call, so that it overlaps the
# GPU stages); stage_torch waits for it, or builds it there.
TORCH_PID=
torch_build() {
  local py T=$ROOT/build-torch
  py=${GPU_PYTHON:-$(command -v python3)}
  echo "== $py: $("$py" -c 'import torch,sys; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1)"
  if [ ! -f "$T/build.ninja" ]; then
    meson setup "$T" -Dwerror=true -Dcuda=auto -Dtrain=disabled -Dpeers=disabled \
      -Dbuildtype=release -Dtorch_python="$py" || return 1
  fi
  grep -E "libcoll_torch:" "$T/meson-logs/meson-log.txt" | tail -1
  if [ "${GPU_TORCH_SUITE:-0}" = 1 ]; then ninja -C "$T"; else ninja -C "$T" "torch/libcoll_torch$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"; fi &&
    echo "== built"
}
stage_torchbuild() {
  prefix || return 1
  torch_build >"$OUT/torch.txt" 2>&1 &
  TORCH_PID=$!
  summary "torchbuild: started in the background"
}

stage_torch() {
  prefix || { summary "torch: not run (no carried prefix)"; return 1; }
  local f="$OUT/torch.txt" py T=$ROOT/build-torch
  py=${GPU_PYTHON:-$(command -v python3)}
  if [ -n "$TORCH_PID" ]; then wait "$TORCH_PID" 2>/dev/null; else torch_build >"$f" 2>&1; fi
  if ! grep -q "^== built" "$f"; then summary "torch: build FAILED (see torch.txt)"; return 1; fi
  if ! grep -q "libcoll_torch: built" "$f"; then summary "torch: module not built: $(grep -o 'not built.*' "$f" | head -1)"; return 1; fi
  # PyTorch's distributed_test needs expecttest, which that machine's Python lacks.
  if ! "$py" -c 'import expecttest' 2>/dev/null && ls .gpu/wheels/expecttest-*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --target /tmp/gpu-site .gpu/wheels/expecttest-*.whl >>"$f" 2>&1
    export PYTHONPATH=/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  # The binding's whole suite (CPU tensors, PyTorch's own tests) is CI's, on the CPU;
  # GPU_TORCH_SUITE=1 runs it here too (minutes).
  if [ "${GPU_TORCH_SUITE:-0}" = 1 ]; then
    timeout 420 meson test -C "$T" --no-rebuild --print-errorlogs torch >>"$f" 2>&1
    python3 scripts/summary.py "$T/meson-logs/testlog.json" | tail -1 | sed 's/^/torch: suite /' | tee -a "$OUT/summary.txt"
    grep -E '^\[(PASS|FAIL|SKIP|ERR )' "$T/meson-logs/testlog.txt" >>"$f"
  fi
  echo "== cuda_probe" >>"$f"
  PYTHONPATH=$T/torch timeout 120 "$py" torch/tools/cuda_probe.py >>"$f" 2>&1
  local st=$? said
  said=$(grep -c 'all checks passed' "$f")
  summary "torch: cuda_probe exit $st ($said of 2 ranks: all checks passed; torch.txt has each check)"
}

summary "gpu_check $(git rev-parse --short HEAD 2>/dev/null) on $(hostname): stages ${STAGES[*]}$([ $REHEARSE = 1 ] && echo ' (rehearsal)')"
for s in "${STAGES[@]}"; do "stage_$s"; done
exit 0
