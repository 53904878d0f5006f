"""GRPO on a language model against the library users compare it with: TRL's ``GRPOTrainer``,
side by side in one run.

Both train the project's tiny reasoning model (``reasoning_grpo_tiny``: the tiny Qwen2 from the
cached SFT warm start, reversed two-digit addition) on the same prompts with the same verifier
(``exact``, through the project's :class:`~pipelines.reasoning.verifiers.RewardFunction`) and the
same settings, taken from the recipe (:func:`shared_settings`): prompts per iteration, group size,
minibatches and what they hold, learning rate (constant), clip range, gradient clip, the loss
aggregation, sampling (temperature 1, top-k and top-p off), maximum prompt and response lengths,
Adam (eps 1e-5, no weight decay), no KL term, and the number of iterations. An *iteration* (a step
here) generates ``B x G`` responses, scores them and trains on them in ``M`` minibatches: one
``embodied train`` iteration, ``M`` TRL optimizer steps (``steps_per_generation = M``).

What a minibatch holds is set for both sides by ``--minibatch-mix`` (``algo.minibatch_mix``):
``shuffled`` (the default: TRL's own way, its responses shuffled across groups before they are
cut into its optimizer steps; Embodied then trains on the whole batch, one chunk, nothing streams)
or ``groups`` (whole groups per minibatch, Embodied's streaming default; TRL's shuffle turned off).

* ``trl``: ``GRPOTrainer`` in this process, on the CPU, with one torch thread (``--trl-threads``;
  on this tiny model one thread is TRL's faster setting, as it is for each Embodied worker); timed
  by a callback at each optimizer step, its generation and reward calls timed inside.
* ``embodied``: ``embodied train reasoning_grpo_tiny`` as a user runs it (a subprocess: Ray
  workers, the planner's plan from the profile cache), per-iteration numbers from its
  ``metrics.jsonl``.

They alternate, ``--rounds`` rounds each (TRL, Embodied, TRL, ...), round r with seed r on both
sides, because the host's speed drifts. Per side: the median over rounds of the median seconds per
iteration (each round's first iteration left out: start-up), generated tokens per second of
generation, trainer tokens (prompt + response, real tokens, no padding) per second of training;
then Embodied's throughput over TRL's. Held-out accuracy after the same iterations: both final
models go through the same evaluation, :func:`pipelines.reasoning.sft.evaluate_accuracy` on the
recipe's 500 held-out problems (greedy, and 4 samples at temperature 1).

Target: Embodied at least 1.5x TRL's throughput at equal or better held-out accuracy.

    pip install -e ".[reasoning,compare]"          # trl, an optional peer
    python -m benchmarks.reasoning_vs_trl [--iterations 60] [--rounds 5] [--trl-threads 1] [--minibatch-mix shuffled]

Writes ``benchmarks/results/reasoning_vs_trl.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_args, result_path, save_result

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "reasoning_grpo_tiny"
TARGET_SPEEDUP = 1.5
#: TRL's ``loss_type`` that computes each ``algo.loss_agg_mode`` as Embodied does with one
#: accumulation step: a mean over the minibatch's own tokens (``bnpo``; TRL's default ``dapo``
#: divides by the whole generation batch's tokens / ``steps_per_generation``, which scales each
#: step by how far its token count is from the average), over its sequences (``grpo``), or a token
#: sum over sequences x the response limit (``dr_grpo``)
TRL_LOSS_TYPES = {"token-mean": "bnpo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
#: ``algo.minibatch_mix`` values, as ``--minibatch-mix`` takes them
MINIBATCH_MIXES = ("shuffled", "groups")


@dataclass(frozen=True)
class Settings:
    """What both sides are given: the recipe's values (and ``iterations``)."""

    prompts_per_iteration: int
    group_size: int
    minibatches: int
    minibatch_mix: str
    iterations: int
    lr: float
    clip_low: float
    clip_high: float
    max_grad_norm: float
    loss_agg_mode: str
    norm_adv_by_std: bool
    max_prompt_length: int
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    eval_samples: int

    @property
    def responses_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.group_size

    @property
    def responses_per_minibatch(self) -> int:
        return self.responses_per_iteration // self.minibatches


def recipe_config(iterations: int, overrides: list[str] = ()) -> Any:
    """The recipe's ReasoningConfig with ``iterations`` (and ``overrides``), as ``embodied train`` builds it."""
    from embodied.config import apply_overrides
    from pipelines.reasoning.config import ReasoningConfig
    from pipelines.recipes import load_recipe

    _, data = load_recipe(RECIPE)
    return apply_overrides(ReasoningConfig, data, [f"algo.iterations={iterations}", *overrides])


def shared_settings(cfg: Any) -> Settings:
    """The settings both sides get, from a reasoning config. Refuses what TRL cannot match."""
    algo, kwargs = cfg.algo, cfg.policy.kwargs
    if (algo.epochs != 1 or algo.use_kl_loss or algo.anneal_lr or algo.loss_agg_mode not in TRL_LOSS_TYPES
            or algo.clip_ratio_c is not None or algo.entropy_coeff):
        raise ValueError("the comparison maps one epoch, no KL loss, no dual clip, no entropy bonus, a constant lr "
                         "and token-mean / seq-mean losses")
    return Settings(
        prompts_per_iteration=cfg.data.train_batch_size, group_size=algo.group_size, minibatches=algo.num_minibatches,
        minibatch_mix=algo.minibatch_mix, iterations=cfg.total_iterations, lr=algo.lr,
        clip_low=algo.clip_ratio_low if algo.clip_ratio_low is not None else algo.clip_ratio,
        clip_high=algo.clip_ratio_high if algo.clip_ratio_high is not None else algo.clip_ratio,
        max_grad_norm=algo.max_grad_norm, loss_agg_mode=algo.loss_agg_mode, norm_adv_by_std=algo.norm_adv_by_std_in_grpo,
        max_prompt_length=cfg.data.max_prompt_length, max_new_tokens=cfg.max_new_tokens,
        temperature=float(kwargs.get("temperature", 1.0)), top_k=int(kwargs.get("top_k", 0)),
        top_p=float(kwargs.get("top_p", 1.0)), eval_samples=cfg.eval.samples,
    )


def trl_arguments(s: Settings, output_dir: str, seed: int) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments that give TRL the same run: B x G responses per generation,
    trained in M optimizer steps of B x G / M responses, one pass, no KL, constant lr, Adam eps 1e-5
    (what the steps hold, ``s.minibatch_mix``, is :func:`run_trl`'s to set)."""
    return {
        "output_dir": output_dir, "seed": seed, "use_cpu": True, "report_to": [], "save_strategy": "no",
        "logging_steps": 1, "disable_tqdm": True, "dataloader_num_workers": 0, "bf16": False, "fp16": False,
        "num_generations": s.group_size,
        "per_device_train_batch_size": s.responses_per_minibatch,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": s.minibatches,
        "num_iterations": 1,
        "max_steps": s.iterations * s.minibatches,
        "max_completion_length": s.max_new_tokens,
        "learning_rate": s.lr, "lr_scheduler_type": "constant", "warmup_steps": 0,
        "optim": "adamw_torch", "adam_epsilon": 1e-5, "weight_decay": 0.0,
        "max_grad_norm": s.max_grad_norm,
        "beta": 0.0, "epsilon": s.clip_low, "epsilon_high": s.clip_high,
        "loss_type": TRL_LOSS_TYPES[s.loss_agg_mode], "scale_rewards": "group" if s.norm_adv_by_std else "none",
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
        "mask_truncated_completions": False, "shuffle_dataset": True,
    }


def embodied_overrides(run_dir: Path, seed: int, s: Settings) -> list[str]:
    """``embodied train`` overrides: the run dir, the seed, the iterations and what a minibatch
    holds; the final evaluation only (the benchmark evaluates both sides itself), the plan held
    fixed, no logging sinks."""
    return [f"run.dir={run_dir}", f"seed={seed}", f"algo.iterations={s.iterations}",
            f"algo.minibatch_mix={s.minibatch_mix}", "eval.every=0", "checkpoint.every=0", "plan.replan_threshold=0",
            "logging.wandb=false", "logging.tensorboard=false"]


# -- the two sides -------------------------------------------------------------------------------------------


def run_trl(s: Settings, cfg: Any, seed: int, work: Path, threads: int = 0) -> dict[str, Any]:
    """TRL's GRPOTrainer on the warm-start model and the recipe's prompts (``threads`` torch
    threads; 0: torch's default); per-iteration timings and the final model's directory.

    TRL shuffles an iteration's responses before cutting them into its optimizer steps, so each
    step sees part of every group (``s.minibatch_mix=shuffled``); with ``groups`` that shuffle is
    off, and each step trains on whole groups, as Embodied's streamed minibatches do."""
    from unittest import mock

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pipelines.reasoning.preflight import prepare
    from pipelines.reasoning.verifiers import RewardFunction
    from policies.lm.policy import render_prompt

    prepared = prepare(cfg, log=lambda line: None)
    model_dir = cfg.policy.kwargs["model_path"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat_template = cfg.policy.kwargs.get("chat_template", "auto")
    rows = [{"prompt": render_prompt(tokenizer, r.prompt, chat_template, model_dir)[0], "ground_truth": r.ground_truth,
             "data_source": r.data_source} for r in prepared.train]
    reward = RewardFunction(cfg.reward)

    def verifier(prompts: list[str], completions: list[str], ground_truth: list[str], data_source: list[str],
                 **_: Any) -> list[float]:
        return reward(completions, ground_truth, data_source).scores

    times: dict[str, list[float]] = {"step_end": [], "generate_s": [], "reward_s": [], "prepare_s": []}
    tokens: dict[str, list[int]] = {"prompt": [], "completion": []}

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):  # noqa: ANN001, ANN202 (TRL's signature)
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            times["generate_s"].append(time.perf_counter() - t0)
            tokens["prompt"].append(sum(len(ids) for ids in out[0]))
            tokens["completion"].append(sum(len(ids) for ids in out[1]))
            return out

        def _calculate_rewards(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            t0 = time.perf_counter()
            out = super()._calculate_rewards(*args, **kwargs)
            times["reward_s"].append(time.perf_counter() - t0)
            return out

        def _generate_and_score_completions(self, inputs):  # noqa: ANN001, ANN202
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            times["prepare_s"].append(time.perf_counter() - t0)
            return out

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            times["step_end"].append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            times["step_end"].append(time.perf_counter())

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = TimedGRPOTrainer(
        model=model, reward_funcs=verifier, args=GRPOConfig(**trl_arguments(s, str(work / "trl"), seed)),
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[StepClock()],
    )
    keep_order = mock.patch("trl.trainer.grpo_trainer.shuffle_sequence_dict", lambda batch: batch)
    t0 = time.perf_counter()
    with keep_order if s.minibatch_mix == "groups" else contextlib.nullcontext():
        trainer.train()
    train_wall_s = time.perf_counter() - t0
    final = work / "trl_final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    reward.close()
    ends, m = times["step_end"], s.minibatches
    iteration_s = [ends[(i + 1) * m] - ends[i * m] for i in range(len(times["generate_s"]))]
    rows_out = []
    for i, seconds in enumerate(iteration_s):
        generate_s, reward_s = times["generate_s"][i], times["reward_s"][i]
        train_s = seconds - generate_s - reward_s  # the old logprobs' forward pass, advantages, the M updates
        passes_tokens = tokens["prompt"][i] + tokens["completion"][i]  # one pass (num_iterations = 1)
        rows_out.append({
            "iteration_s": seconds, "generate_s": generate_s, "reward_s": reward_s, "train_s": train_s,
            "old_logprobs_and_advantages_s": times["prepare_s"][i] - generate_s - reward_s,
            "rollout_tokens_per_s": tokens["completion"][i] / generate_s,
            "trainer_tokens_per_s": passes_tokens / train_s,
        })
    return {"rows": rows_out, "train_wall_s": train_wall_s, "model_dir": str(final), "torch_threads": torch.get_num_threads()}


def run_embodied(s: Settings, seed: int, work: Path, recipe: str = RECIPE) -> dict[str, Any]:
    """``embodied train <recipe>`` in a subprocess (``s``'s iterations and minibatches); its
    per-iteration metrics and run dir."""
    run_dir = work / "embodied"
    cmd = [sys.executable, "-m", "pipelines.cli", "train", recipe, *embodied_overrides(run_dir, seed, s)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=3600)
    command_s = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"embodied train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metrics = [m for m in metrics if "time/iteration_s" in m]
    rows = [{
        "iteration_s": m["time/iteration_s"], "generate_s": m["time/generate_s"], "reward_s": m["time/reward_s"],
        "train_s": m["time/train_s"], "sync_s": m["time/sync_s"], "train_wait_s": m.get("time/train_wait_s"),
        "rollout_tokens_per_s": m["perf/rollout_tokens_per_s"], "trainer_tokens_per_s": m["perf/trainer_tokens_per_s"],
    } for m in metrics]
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text()).get("plan", {}) if (run_dir / "plan.json").exists() else {}
    return {"rows": rows, "command_s": command_s, "run_dir": str(run_dir), "plan": plan,
            "run_eval": {k: v for k, v in summary.items() if k.startswith("eval/")}}


def held_out(cfg: Any, model_dir: str | None = None, run_dir: str | None = None) -> dict[str, float]:
    """The same evaluation for both sides: the policy of ``model_dir`` (a Hugging Face directory) or
    of the final checkpoint of ``run_dir``, on the recipe's held-out problems (greedy and sampled)."""
    import dataclasses

    import torch

    from embodied.checkpoint import MODEL_FILE, latest_checkpoint
    from pipelines.reasoning.preflight import prepare
    from pipelines.reasoning.sft import evaluate_accuracy
    from policies.registry import build_policy
    from safetensors.torch import load_file

    val = prepare(cfg, log=lambda line: None).val
    kwargs = dict(cfg.policy.kwargs)
    if model_dir is not None:
        kwargs["model_path"] = model_dir
    policy = build_policy(dataclasses.replace(cfg.policy, kwargs=kwargs), None, None)
    if run_dir is not None:
        checkpoint = latest_checkpoint(Path(run_dir))
        assert checkpoint is not None, f"{run_dir} has no checkpoint"
        state = load_file(str(checkpoint / MODEL_FILE))
        missing, unexpected = policy.load_state_dict(state, strict=False)
        trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
        if unexpected or trainable & set(missing):
            raise RuntimeError(f"checkpoint does not fit the policy: missing {missing[:5]}, unexpected {unexpected[:5]}")
    torch.manual_seed(0)
    return evaluate_accuracy(policy, val, samples=cfg.eval.samples, batch_size=cfg.eval.batch_size, seed=10_000_000)


# -- the numbers ---------------------------------------------------------------------------------------------

#: per-iteration numbers a side reports (medians over its iterations, then over rounds)
ROW_KEYS = ("iteration_s", "rollout_tokens_per_s", "trainer_tokens_per_s", "generate_s", "reward_s", "train_s")


def round_medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of a round's iterations, the first (start-up) left out when there are others."""
    kept = rows[1:] if len(rows) > 1 else rows
    out = {}
    for key in {k for r in kept for k in r}:
        values = [r[key] for r in kept if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = statistics.median(values)
    return out


def summarize(rounds: list[dict[str, Any]], s: Settings) -> dict[str, Any]:
    """Per side: the median over rounds of each round's medians and of its held-out accuracy;
    Embodied over TRL (time: TRL's seconds over Embodied's, so > 1 means Embodied is faster)."""
    sides: dict[str, dict[str, Any]] = {}
    for side in ("trl", "embodied"):
        mine = [r for r in rounds if r["side"] == side]
        if not mine:
            continue
        medians = [r["medians"] for r in mine]
        sides[side] = {key: statistics.median(m[key] for m in medians if key in m)
                       for key in sorted({k for m in medians for k in m})}
        for acc in ("eval/greedy_acc", "eval/sampled_acc"):
            sides[side][acc] = statistics.median(r["held_out"][acc] for r in mine)
        sides[side]["responses_per_s"] = s.responses_per_iteration / sides[side]["iteration_s"]
        sides[side]["rounds"] = len(mine)
    out: dict[str, Any] = {"sides": sides}
    if len(sides) == 2:
        trl, ours = sides["trl"], sides["embodied"]
        speedup = trl["iteration_s"] / ours["iteration_s"]
        out["speedup"] = {
            "iteration": speedup,
            "rollout_tokens_per_s": ours["rollout_tokens_per_s"] / trl["rollout_tokens_per_s"],
            "trainer_tokens_per_s": ours["trainer_tokens_per_s"] / trl["trainer_tokens_per_s"],
        }
        out["greedy_acc_points"] = 100 * (ours["eval/greedy_acc"] - trl["eval/greedy_acc"])
        out["target_met"] = speedup >= TARGET_SPEEDUP and ours["eval/greedy_acc"] >= trl["eval/greedy_acc"]
    return out


def table(summary: dict[str, Any]) -> str:
    """The result as a markdown table (one row per side, the ratio last)."""
    lines = ["| | s / iteration (median) | generated tokens/s | trainer tokens/s | held-out greedy | sampled |",
             "|---|---:|---:|---:|---:|---:|"]
    for side, label in (("trl", "TRL GRPOTrainer"), ("embodied", "embodied train")):
        if side in summary["sides"]:
            v = summary["sides"][side]
            lines.append(f"| {label} | {v['iteration_s']:.3f} | {v['rollout_tokens_per_s']:,.0f} | "
                         f"{v['trainer_tokens_per_s']:,.0f} | {100 * v['eval/greedy_acc']:.1f}% | "
                         f"{100 * v['eval/sampled_acc']:.1f}% |")
    if "speedup" in summary:
        x = summary["speedup"]
        lines.append(f"| Embodied / TRL | **{x['iteration']:.2f}x** | {x['rollout_tokens_per_s']:.2f}x | "
                     f"{x['trainer_tokens_per_s']:.2f}x | {summary['greedy_acc_points']:+.1f} points | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=60, help="GRPO iterations per round (both sides)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per side, alternating TRL, Embodied, ...")
    parser.add_argument("--sides", default="trl,embodied", help="which sides to run (comma-separated)")
    parser.add_argument("--trl-threads", type=int, default=1, help="torch threads of the TRL side (0: torch's default)")
    parser.add_argument("--minibatch-mix", choices=MINIBATCH_MIXES, default="shuffled",
                        help="what both sides' minibatches hold (algo.minibatch_mix): responses shuffled across groups "
                             "(TRL's way) or whole groups (Embodied's streaming default; TRL's shuffle off)")
    add_output_args(parser, "reasoning_vs_trl")
    args = parser.parse_args(argv)
    sides = [side for side in args.sides.split(",") if side]
    cfg = recipe_config(args.iterations, [f"algo.minibatch_mix={args.minibatch_mix}"])
    s = shared_settings(cfg)
    print(f"[reasoning_vs_trl] {s.prompts_per_iteration} prompts x {s.group_size} responses of at most "
          f"{s.max_new_tokens} tokens, {s.minibatches} minibatches ({s.minibatch_mix}), {s.iterations} iterations, "
          f"{args.rounds} round(s) per side", flush=True)
    from pipelines.reasoning.preflight import prepare

    prepare(cfg, log=lambda line: print(line, flush=True))  # the cached SFT warm start: model and data for both
    load_before = os.getloadavg()
    rounds = []
    t_start = time.perf_counter()
    for r in range(args.rounds):
        for side in sides:
            with tempfile.TemporaryDirectory(prefix=f"vs_trl_{side}_") as tmp:
                work = Path(tmp)
                if side == "trl":
                    result = run_trl(s, cfg, seed=r, work=work, threads=args.trl_threads)
                    accuracy = held_out(cfg, model_dir=result["model_dir"])
                else:
                    result = run_embodied(s, seed=r, work=work)
                    accuracy = held_out(cfg, run_dir=result["run_dir"])
            medians = round_medians(result["rows"])
            rounds.append({"side": side, "round": r, "seed": r, "medians": medians, "held_out": accuracy,
                           **{k: v for k, v in result.items() if k not in ("model_dir", "run_dir")}})
            print(f"  round {r} {side:8s}: {medians['iteration_s']:.3f} s/iteration, generation "
                  f"{medians['rollout_tokens_per_s']:,.0f} tokens/s, trainer {medians['trainer_tokens_per_s']:,.0f} "
                  f"tokens/s, held-out greedy {100 * accuracy['eval/greedy_acc']:.1f}%", flush=True)
    summary = summarize(rounds, s)
    print(table(summary))
    if "target_met" in summary:
        print(f"target ({TARGET_SPEEDUP}x at equal or better greedy accuracy): "
              f"{'met' if summary['target_met'] else 'NOT met'}")
    out = {"settings": asdict(s), "trl_threads": args.trl_threads, "trl_arguments": trl_arguments(s, "<tmp>", 0),
           "embodied_overrides": embodied_overrides(Path("<tmp>"), 0, s), "summary": summary,
           "table": table(summary), "rounds": rounds, "wall_s": time.perf_counter() - t_start,
           "conditions": {"load_avg_1_5_15_before": load_before, "load_avg_1_5_15_after": os.getloadavg(),
                          "cpu_cores": len(os.sched_getaffinity(0))}}
    save_result(result_path("reasoning_vs_trl", args), "reasoning_vs_trl", argv, out)
    return out


if __name__ == "__main__":
    main()
