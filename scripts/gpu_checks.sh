#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go (a GPU machine is lent only now and then):
#   1. benchmarks.vla_real_size: openvla-7b shapes in bf16 -- decoding, a LoRA step, weight sync,
#      offload/onload of the weights, LoRA gradients and AdamW state;
#   2. the tests marked `gpu` (FSDP2 on NCCL, bf16 weights GPU -> GPU bit for bit, a GPU layout's
#      ranks, a 1B-parameter offload, the VLA policies in bf16 on CUDA, batched envs on CUDA,
#      ManiSkill's GPU simulation where ManiSkill is installed);
#   3. a short planned training run with the rollout and trainer on the GPU (the planner
#      profiles the components on this machine's cores and GPU, calibration measures its best
#      candidates over the first iterations, and the run settles on the fastest).
#   4. MuJoCo MJX on the GPU: installs this project with its mjx extra (mujoco-mjx, gymnasium, ray,
#      ...) and, unless JAX already sees the GPU, JAX's CUDA build for torch's CUDA major, keeping
#      torch, JAX and the nvidia-* wheels that are there; runs tests/envs/test_mjx.py's gpu test;
#      measures env steps/s of mjx/HalfCheetah at 1k, 4k and 16k envs with JAX's and torch's GPU
#      memory (benchmarks.mjx_throughput); asks the planner for 4096 envs with the simulator, the
#      rollout and the trainer on the GPU (`embodied plan --json`: its choice, gpu sharing
#      included, against the sequential plan); and trains PPO on it with that plan, calibration
#      measuring the best candidates (the run's plan.json: the choice against what it measured).
#
#     bash scripts/gpu_checks.sh OUT_DIR     # results and logs land in OUT_DIR
#     WHEELS=DIR bash scripts/gpu_checks.sh OUT_DIR   # a machine without PyPI: pip installs from DIR
#
# STEPS="vla tests run mjx" (the default) picks the steps. Each step has its own time limit and a failing step does not stop the next ones; the script
# exits non-zero when any step failed.
set -u -o pipefail
out=${1:?usage: scripts/gpu_checks.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
steps=" ${STEPS:-vla tests run mjx} "
step() {  # step NAME SECONDS LOG COMMAND...: runs COMMAND for at most SECONDS, its output also in LOG
    local name=$1 limit=$2 log=$3
    shift 3
    echo "=== $name (limit ${limit}s) $(date +%T)"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia_smi.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" \
    | tee -a "$out/nvidia_smi.txt"

# VLA_ARGS=--tiny runs the same code on a tiny model (a check of this script on a machine without a GPU)
[[ $steps == *" vla "* ]] && step vla_real_size "${VLA_LIMIT:-200}" "$out/vla_real_size.log" \
    python3 -m benchmarks.vla_real_size ${VLA_ARGS:-} --out "$out/vla_real_size.json"

[[ $steps == *" tests "* ]] && step gpu_tests "${TEST_LIMIT:-170}" "$out/pytest_gpu.log" python3 -m pytest -p no:cacheprovider -m gpu -rs -q --durations=10 \
    tests/embodied/test_offload.py tests/embodied/test_weights.py tests/policies/vla/test_policy.py tests/envs/test_batched.py \
    tests/envs/test_maniskill.py tests/pipelines/test_gpu_scaleout.py

smoke=$(mktemp -d)
[[ $steps == *" run "* ]] && step planned_run_on_cuda "${RUN_LIMIT:-150}" "$out/planned_run.log" env EMBODIED_CACHE="$smoke/cache" python3 -m pipelines.cli train \
    colorreach_openvla_ppo_tiny warmstart.expert=null workers.rollout_device=cuda workers.trainer_device=cuda \
    algo.total_env_steps="${RUN_STEPS:-16384}" plan.calibrate=0.3 eval.episodes=16 plan.profile=true logging.wandb=false \
    logging.progress=lines run.dir="$smoke/run"
for f in plan.json summary.json metrics.jsonl; do
    [ -f "$smoke/run/$f" ] && cp "$smoke/run/$f" "$out/planned_run_$f"
done

# MJX. pip may add packages but never swap torch, JAX or the CUDA libraries under them: they are
# constraints at the versions installed. JAX's CUDA build is installed only where JAX sees no GPU.
if [[ $steps == *" mjx "* ]]; then
    python3 -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|jax|jaxlib|jax-cuda[0-9]+-[a-z]+|nvidia-[a-z0-9-]+)==' \
        > "$out/mjx_constraints.txt" || true
    wanted=(-e ".[mjx]")
    if ! python3 -c "import jax; jax.devices('gpu')" >/dev/null 2>&1; then
        wanted+=("jax[cuda$(python3 -c "import torch; print((torch.version.cuda or '12').split('.')[0])")]")
    fi
    # WHEELS: no index; the build backend (setuptools) is the one installed
    [ -n "${WHEELS:-}" ] && wanted+=(--no-index --find-links "$WHEELS" --no-build-isolation)
    step mjx_install "${MJX_INSTALL_LIMIT:-300}" "$out/mjx_install.log" python3 -m pip install -q --disable-pip-version-check \
        -c "$out/mjx_constraints.txt" "${wanted[@]}"
    python3 -c "import jax, mujoco, mujoco.mjx; print('jax', jax.__version__, jax.devices(), 'mujoco', mujoco.__version__)" 2>&1 \
        | tee -a "$out/mjx_install.log"
    step mjx_gpu_tests "${MJX_TEST_LIMIT:-150}" "$out/mjx_pytest_gpu.log" python3 -m pytest -p no:cacheprovider -m gpu -rs -q \
        tests/envs/test_mjx.py
    step mjx_throughput "${MJX_BENCH_LIMIT:-240}" "$out/mjx_throughput.log" env EMBODIED_CACHE="$smoke/cache" \
        python3 -m benchmarks.mjx_throughput --task HalfCheetah --num-envs 1024 4096 16384 --device cuda --rounds 2 \
        --window 1.0 --out "$out/mjx_throughput.json"
    # the local backend: the env, rollout and trainer as threads of one process on the one GPU; the
    # plan step's profile (same cache) is the run's
    gpu_run=(mjx_halfcheetah_ppo env.num_envs=4096 workers.env_device=cuda workers.rollout_device=cuda
             workers.trainer_device=cuda cluster.backend=local)
    step mjx_plan "${MJX_PLAN_LIMIT:-240}" "$out/mjx_plan.log" env EMBODIED_CACHE="$smoke/cache" python3 -m pipelines.cli plan \
        "${gpu_run[@]}" --json "$out/mjx_plan.json" --out "$out/mjx_plan.png"
    step mjx_ppo_on_cuda "${MJX_RUN_LIMIT:-300}" "$out/mjx_ppo.log" env EMBODIED_CACHE="$smoke/cache" python3 -m pipelines.cli train \
        "${gpu_run[@]}" algo.total_env_steps="${MJX_RUN_STEPS:-4194304}" plan.profile=true plan.calibrate=0.5 \
        eval.episodes=64 eval.num_envs=64 logging.wandb=false logging.progress=lines run.dir="$smoke/mjx_run"
    for f in plan.json summary.json metrics.jsonl; do
        [ -f "$smoke/mjx_run/$f" ] && cp "$smoke/mjx_run/$f" "$out/mjx_ppo_$f"
    done
fi
exit $status
