#!/usr/bin/env bash
# The GPU checks a session lent a device machine runs first, as one command (see README "GPU checks").
# Run from the repository root on the device machine, with the wheels it lacks in .whl/ (see
# ../.library/device/README.md); every log lands in $OUT (or /tmp/device-out). All of it runs past one call's 10 minutes:
# SKIP_PAIRS=1 runs the GPU checks alone (about 5 minutes); SKIP_CHECKS=1 the steps/s pairs alone, and PAIRS names
# which (default: small issue issue-k8 mid medium, about 12 minutes: two calls, e.g. PAIRS="issue issue-k8" then the rest).
set -o pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/device-out}; mkdir -p "$out"
pairs() {  # whether this pairs run is wanted (the name, padded with spaces)
  [ -z "$SKIP_PAIRS" ] && [[ " ${PAIRS:-small issue issue-k8 mid medium} " == *"$1"* ]]
}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  # a .pth file, not PYTHONPATH: the benchmarks give their child processes an environment of their own
  printf "/tmp/site\n%s\n" "$PWD" > "$(python3 -c "import site; print(site.getsitepackages()[0])")/vram-bench-device.pth"
fi
date -u; nproc; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/nvidia-smi.txt"
[ -z "$SKIP_CHECKS" ] && timeout 150 python3 -m pytest -m cuda tests/test_cuda.py tests/test_device_seam.py tests/test_step_values.py tests/test_loadbench.py -o addopts="" -q -p no:cacheprovider 2>&1 | tee "$out/pytest-cuda.txt"
[ -z "$SKIP_CHECKS" ] && timeout 270 python3 bench/gpu_checks.py --out /tmp/gpu-checks 2>&1 | tee "$out/gpu-checks.txt"
# What reading the loss every step (a device sync) costs against a loop that never waits, and vram-bench beside them.
[ -z "$SKIP_CHECKS" ] && timeout ${SYNC_S:-110} python3 bench/loss_sync.py --rounds 3 --steps 1500 2>&1 | tee "$out/loss-sync.txt"
# ... and which piece of vram-bench's step path that difference is (the loss's copy off the GPU, the step's peak, ...).
[ -z "$SKIP_CHECKS" ] && timeout 60 python3 bench/step_path.py 2>&1 | tee "$out/step-path.txt"
# Issue 17's steps/s target on a machine with free cores (gloo on CPU, 2 ranks), as interleaved pairs of windows
# (bench/distributed_pairs.py: both jobs stay loaded and take turns), at three step sizes.
pairs " small " && CUDA_VISIBLE_DEVICES= timeout ${SMALL_S:-150} python3 bench/distributed_pairs.py --pairs ${SMALL_PAIRS:-20} 2>&1 | tee "$out/pairs-small.txt"
# The issue's own step size (about 2.3 ms here), and the same with vram-bench's per-step path done 8 times less often:
# the gap that goes away with K=8 is what that path costs (2026-11-30: 0.933 against 1.011).
pairs " issue " && CUDA_VISIBLE_DEVICES= timeout ${ISSUE_S:-170} python3 bench/distributed_pairs.py --model issue --pairs ${ISSUE_PAIRS:-24} 2>&1 | tee "$out/pairs-issue.txt"
pairs " issue-k8 " && CUDA_VISIBLE_DEVICES= timeout ${ISSUE_S:-170} python3 bench/distributed_pairs.py --model issue --pairs ${ISSUE_PAIRS:-24} --train-steps-per-step 8 2>&1 | tee "$out/pairs-issue-k8.txt"
pairs " mid " && CUDA_VISIBLE_DEVICES= timeout ${MID_S:-120} python3 bench/distributed_pairs.py --model mid --window 3 --pairs ${MID_PAIRS:-10} 2>&1 | tee "$out/pairs-mid.txt"
pairs " medium " && CUDA_VISIBLE_DEVICES= timeout ${MEDIUM_S:-120} python3 bench/distributed_pairs.py --model medium --pairs ${MEDIUM_PAIRS:-5} 2>&1 | tee "$out/pairs-medium.txt"
true  # a run left out is not a failure
