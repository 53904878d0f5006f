"""The ``embodied`` command line.

    embodied train [RECIPE] [key=value ...]     train (default recipe: maniskill_pushcube_ppo)
    embodied eval RUN_DIR|CHECKPOINT|RECIPE [episodes=N] [suite=ID episodes_per_task=N] [key=value ...]
    embodied recipes                            list bundled recipes
    embodied plan RECIPE [key=value ...] [--profile]   show the M2Flow planner's choice
    embodied config RECIPE [KEY] [key=value ...]        every config key: value, type, default, doc
    embodied plot RUN_DIR [--out FILE] [--metric KEY ...]   a run's learning curve (default RUN_DIR/learning_curve.png)
    embodied demos ENV_ID [episodes=N] [out=PATH] [obs_mode=rgb|state]   a scripted expert's demonstrations (ManiSkill .h5 + .json)
    embodied sft RECIPE|POLICY demos=PATH[,PATH] [out=DIR] [key=value ...]   behaviour-clone a policy on demonstrations

User errors (bad keys, unknown recipes or envs, missing checkpoints) print one paragraph and exit
with code 2; nothing is written to an existing run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import io
from pathlib import Path
from typing import Any

from embodied.config import apply_overrides, load_yaml, parse_override
from embodied.errors import ExitCode, FailureContext, Terminated, UserError, exit_code_of, exit_on_signals, fill_paragraph
from embodied.logs import console_logging, debug_enabled, report_failure, write_traceback_file
from embodied.runtime.cluster import apply_torch_process_env
from embodied.runtime.watchdog import start_watchdog

apply_torch_process_env()  # before anything loads torch: the driver runs policies too

EXIT_USER_ERROR = 2
LOG = logging.getLogger("embodied")


def _split_recipe(args: list[str]) -> tuple[str | None, list[str]]:
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def build_train_config(args: list[str]):
    """The config of ``embodied train ARGS`` (recipe, overrides, resume), of the schema of the
    recipe's workflow."""
    from pipelines.recipes import DEFAULT_RECIPE, load_recipe
    from pipelines.workflow import schema_of

    recipe, overrides = _split_recipe(args)
    resume = None
    rest = []
    for text in overrides:
        key, value = parse_override(text)
        if key == "resume":
            resume = str(value)
        else:
            rest.append(text)
    if resume is not None:
        from embodied.checkpoint import find_checkpoint
        from pipelines.rundir import has_checkpoint

        if not (Path(resume) / "config.yaml").is_file():
            find_checkpoint(resume)  # no run there at all: the checkpoint error says what was expected
            raise UserError(f"resume={resume!r} is not a run dir (no config.yaml in it).")
        data = load_yaml(Path(resume) / "config.yaml")
        data["resume"] = resume
        data.setdefault("run", {})["dir"] = resume
        if recipe is not None and recipe != data.get("recipe"):
            raise UserError(f"resume={resume} continues recipe {data.get('recipe')!r}; do not name another recipe ({recipe!r}).")
        cfg = apply_overrides(schema_of(data), data, rest)
        if not has_checkpoint(resume):  # it failed before its first checkpoint: it starts again from its beginning
            return cfg
        find_checkpoint(resume, fallback=cfg.resume_fallback)  # a corrupt latest checkpoint: a clear error now
        return _without_init(cfg)
    _, data = load_recipe(recipe or DEFAULT_RECIPE)
    return apply_overrides(schema_of(data), data, rest)


def _without_init(cfg):
    """A resumed run's config without ``policy.init``: its checkpoint holds every tensor that trains,
    which is all a warm start or an init file sets (and a warm start's cache entry may be gone)."""
    policy = getattr(cfg, "policy", None)
    if getattr(policy, "init", None) is None:
        return cfg
    import dataclasses

    return dataclasses.replace(cfg, policy=dataclasses.replace(policy, init=None))


def cmd_train(args: list[str]) -> int:
    # SIGTERM and SIGHUP (the terminal closed) end it with 143 / 129 after the cleanup of `finally`
    # blocks, before the run too (the runner counts them while it runs: pipelines.runner.GracefulStop)
    with exit_on_signals():
        return _train(args)


def _train(args: list[str]) -> int:
    # The config first: a bad key, value or recipe is a one-paragraph error before the runner and
    # the checkpoint code load and before the watchdog process starts (a typo: 5.5 -> 3.6 CPU-s;
    # the rest is torch, which the config's schema still imports through the workflow registry)
    cfg = build_train_config(args)

    from embodied.checkpoint import find_checkpoint
    from embodied.logs import open_run_log
    from pipelines.rundir import RunDir, has_checkpoint
    from pipelines.runner import Runner
    from pipelines.workflow import WORKFLOWS

    # Before any process of the run starts: a killed driver (kill -9, the OOM killer) leaves no
    # Ray processes, workers or env processes behind (embodied.runtime.watchdog).
    start_watchdog()
    workflow = WORKFLOWS.get(cfg.workflow).build(cfg)
    continues = cfg.resume is not None and has_checkpoint(cfg.resume)  # else a new run, or one started again
    spaces = workflow.preflight()  # env id, policy vs action space, files: fail before a run dir is touched
    # behaviour cloning first (cached), when the recipe asks for it; a resumed run has its weights
    cfg, warm = warm_start(cfg) if not continues else (cfg, None)
    if warm is not None:  # the workflow starts from the cloned weights (policy.init)
        workflow = WORKFLOWS.get(cfg.workflow).build(cfg)
    if continues:  # the new config must build the model the checkpoint holds
        workflow.check_checkpoint(find_checkpoint(cfg.resume, fallback=cfg.resume_fallback), *spaces)
        if finished(cfg, workflow):
            return 0
    with RunDir.create(cfg, resume=cfg.resume is not None) as run, open_run_log(run.path):
        LOG.info(f"[embodied] recipe {cfg.recipe} -> {run.path} (logs in {run.path / 'logs'})")
        if warm is not None:
            warm.write_summary(run.path)
        runner = Runner(cfg, run, workflow)
        try:
            summary = runner.run()
        except BaseException as exc:  # one paragraph on the terminal, the traceback in the log
            try:
                return report(exc, runner.failure_context())
            except OSError:  # the terminal is gone (closed: SIGHUP): the log has it all
                return exit_code_of(exc)
        _print_summary(summary, run.path)
    return 0


def finished(cfg, workflow) -> bool:
    """Whether ``resume=`` names a run that already did its budget (``algo.total_env_steps`` or
    less than its checkpoint's steps) and wrote its final summary: then one line says so and how to
    train longer, and nothing is written (its summary.json stays as it is)."""
    from embodied.checkpoint import find_checkpoint
    from embodied.errors import resume_command
    from pipelines.rundir import RunDirLock

    run_dir = Path(cfg.resume)
    RunDirLock.ensure_free(run_dir)  # still training, or still closing after its summary: "in use"
    try:
        state = json.loads((find_checkpoint(run_dir, fallback=cfg.resume_fallback) / "state.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    done, total = int(state.get("env_steps", 0)), int(workflow.total_steps)
    if done < total or not isinstance(summary, dict) or summary.get("interrupted"):
        return False
    unit = workflow.unit if workflow.unit != "steps" else "env steps"
    budget = total_budget_key(workflow)
    more = max(2 * done, done + workflow.steps_per_iteration)
    LOG.info(f"[embodied] {run_dir} is finished: it trained {done:,} {unit} ({budget}={total:,} asks for "
             f"{'no more' if done == total else 'fewer'}); nothing was done and its summary.json is unchanged. To train "
             f"longer, give a larger budget: `{resume_command(run_dir, f'{budget}={more}')}`")
    return True


def total_budget_key(workflow) -> str:
    """The config key of a run's budget: ``algo.total_prompts`` of a run counting prompts, else
    ``algo.total_env_steps``."""
    return "algo.total_prompts" if workflow.unit == "prompts" else "algo.total_env_steps"


def warm_start(cfg):
    """``cfg`` with ``policy.init`` set to its behaviour-cloning warm start (``warmstart.*``, cached),
    and the warm start's result; ``(cfg, None)`` for configs without one (other workflows, no
    ``warmstart.expert``)."""
    if getattr(getattr(cfg, "warmstart", None), "expert", None) is None:
        return cfg, None
    from pipelines.warmstart import apply_warm_start

    return apply_warm_start(cfg)


def _print_summary(summary: dict[str, Any], run_dir: Path | None = None) -> None:
    keys = ["env_steps", "wall_s", "train/episode_return", "eval/episode_return", "eval/success_rate", "perf/env_steps_per_s",
            "reward/acc", "perf/samples_per_s", "eval/greedy_acc", "eval/sampled_acc"]
    parts = []
    for k in keys:
        if summary.get(k) is not None:
            v = summary[k]
            parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    where = f" (run dir: {run_dir})" if run_dir else ""
    LOG.info("[embodied] done: " + ", ".join(parts) + where)


#: ``embodied eval`` keys that are not config keys: the suite evaluation's (pipelines/suite_eval.py).
SUITE_KEYS = ("suite", "episodes_per_task", "out")
#: ``embodied eval`` shorthands for ``eval.*`` keys.
EVAL_KEYS = ("episodes", "num_envs", "deterministic", "video")


def cmd_eval(args: list[str]) -> int:
    """``embodied eval TARGET [episodes=N] [suite=ID episodes_per_task=N out=DIR] [key=value ...]``.

    TARGET is a run dir or checkpoint (its config and weights), or a recipe (its initial policy:
    a pretrained ``policy.path``, a warm start, ``policy.init``). Without ``suite=`` the policy
    runs ``eval.episodes`` episodes of its env and the result is printed as JSON; with it, every
    task the suite id names (``libero_spatial``, ``PushCube-v1,PickCube-v1``, ...) runs
    ``episodes_per_task`` episodes and the per-task table is printed and written, as JSON and
    Markdown with a video per task, to ``out`` (default: ``<run dir>/suite-<suite>-<checkpoint>``,
    or ``runs/<recipe>-suite-<suite>`` for a recipe)."""
    if not args:
        raise UserError("embodied eval needs a run dir, checkpoint or recipe: embodied eval RUN_DIR [episodes=N] "
                        "[suite=libero_spatial episodes_per_task=N] [key=value ...]")
    target, rest = args[0], args[1:]
    suite: dict[str, Any] = {}
    overrides = []
    for text in rest:
        key, value = parse_override(text)
        if key in SUITE_KEYS:
            suite[key] = value
        else:
            overrides.append(f"eval.{text}" if key in EVAL_KEYS else text)
    if "suite" not in suite and set(suite) - {"suite"}:
        raise UserError(f"embodied eval: {', '.join(sorted(suite))} belong to a suite evaluation; add suite=ID "
                        "(a LIBERO suite such as libero_spatial, or comma-separated env ids).")
    evaluation = load_evaluation(target, overrides)
    if "suite" not in suite:
        result = evaluation.evaluate()
        print(json.dumps(result, indent=2))
        return 0
    # a suite's table comes with a video per task unless video=false is given
    video = evaluation.cfg.eval.video if any(o.startswith("eval.video=") for o in overrides) else True
    table, out = evaluation.evaluate_suite(str(suite["suite"]), suite.get("episodes_per_task", 50), suite.get("out"), video)
    print(table.to_markdown(), end="")
    videos = sum(1 for t in table.tasks if t.video)
    print(f"\nwritten: {out / 'suite_results.json'}, {out / 'suite_results.md'}"
          + (f" and {videos} video(s) in {out / 'videos'}" if videos else ""))
    return 0


def load_evaluation(target: str, overrides: list[str]):
    """The :class:`pipelines.evaluate_cli.Evaluation` of ``target`` (a run dir, checkpoint or recipe)."""
    from pipelines.evaluate_cli import Evaluation

    return Evaluation.of(target, overrides, build_train_config)


def cmd_config(args: list[str]) -> int:
    from pipelines import config_reference as ref

    if args[:1] == ["--markdown"]:
        print(ref.render_markdown(all_recipe_configs()), end="")
        return 0
    recipe, rest = _split_recipe(args)
    keys = [a for a in rest if "=" not in a]
    overrides = [a for a in rest if "=" in a]
    cfg = build_train_config(([recipe] if recipe else []) + overrides)
    if not keys:
        print(ref.format_config(cfg.recipe, cfg))
    for key in keys:
        print(ref.format_key(cfg.recipe, cfg, key))
    return 0


def all_recipe_configs() -> dict[str, Any]:
    """Every bundled recipe's resolved config, by name."""
    from pipelines.recipes import RECIPES

    return {name: build_train_config([name]) for name in RECIPES.names()}


def cmd_recipes(args: list[str]) -> int:
    """The bundled recipes; with ``--all`` also every registered policy, env adapter, algorithm,
    advantage estimator and workflow (what ``policy.name``, ``env.adapter``, ``algo.name``,
    ``algo.adv_estimator`` and a recipe's ``workflow`` accept)."""
    from pipelines.recipes import DEFAULT_RECIPE, RECIPES

    sections: list[tuple[str, Any, str]] = [("recipes", RECIPES, DEFAULT_RECIPE)]
    if "--all" in args:
        import policies.models  # noqa: F401  (registers the built-in policies)
        from embodied.algorithms import AlgoConfig
        from embodied.algorithms.base import ALGORITHMS, build_algorithm
        from embodied.rl import ADVANTAGE_ESTIMATORS
        from envs.registry import ADAPTERS, load_builtin_adapters as load_adapters
        from pipelines.workflow import WORKFLOWS, schema_of
        from policies.registry import POLICIES

        build_algorithm(AlgoConfig())  # registers the built-in algorithms
        load_adapters()
        schema_of({})  # registers the built-in workflows
        sections += [("policies (policy.name)", POLICIES, ""), ("env adapters (env.adapter)", ADAPTERS, ""),
                     ("algorithms (algo.name)", ALGORITHMS, ""), ("advantage estimators (algo.adv_estimator)", ADVANTAGE_ESTIMATORS, ""),
                     ("workflows (a recipe's workflow)", WORKFLOWS, "")]
    for title, registry, default in sections:
        if len(sections) > 1:
            print(f"{title}:")
        width = max(len(n) for n in registry.names())
        for name in registry.names():
            mark = " (default)" if name == default else ""
            print(f"{'  ' if len(sections) > 1 else ''}{name:<{width}}  {registry.doc(name)}{mark}")
    return 0


COMMANDS = {
    "train": (cmd_train, "train a policy: embodied train [RECIPE] [key=value ...]"),
    "eval": (cmd_eval, "evaluate a run, checkpoint or recipe: embodied eval PATH [episodes=N] [suite=ID episodes_per_task=N]"),
    "recipes": (cmd_recipes, "list the bundled recipes (--all: also policies, env adapters, algorithms, workflows)"),
    "config": (cmd_config, "document the config: embodied config RECIPE [KEY] [key=value ...]"),
}


def register_command(name: str, fn, help_text: str) -> None:
    COMMANDS[name] = (fn, help_text)


def main(argv: list[str] | None = None) -> int:
    import pipelines.plan_cli  # noqa: F401  (registers `embodied plan`)
    import pipelines.plot_cli  # noqa: F401  (registers `embodied plot`)
    import pipelines.demos_cli  # noqa: F401  (registers `embodied demos`)
    import pipelines.sft_cli  # noqa: F401  (registers `embodied sft`)

    console_logging()
    parser = argparse.ArgumentParser(
        prog="embodied",
        description="Embodied: RL for embodied policies with an M2Flow planner.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {n:<8} {h}" for n, (_, h) in COMMANDS.items()),
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="command")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    fn = COMMANDS[ns.command][0]
    try:
        code = fn(ns.args)
        sys.stdout.flush()  # here, not at exit: a reader that went away (`| head`) is handled below
        return code
    except UserError as err:
        msg = str(err).split("\n--- traceback")[0]
        print(fill_paragraph(f"embodied {ns.command}: error: {msg}"), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("embodied: interrupted", file=sys.stderr)
        return 130
    except Terminated as stop:  # SIGTERM / SIGHUP before a run started (exit_on_signals)
        try:
            print(f"embodied: {stop}", file=sys.stderr)
        except OSError:
            pass
        return stop.exit_code
    except Exception as exc:  # before or outside a run: a corrupt checkpoint (4), an env failing (3), a bug (1)
        if isinstance(exc, BrokenPipeError) and _stdout_gone():  # `embodied config RECIPE | head`
            return _quiet_broken_pipe()
        if debug_enabled():
            raise
        return report(exc, FailureContext(doing=f"preparing `embodied {ns.command}`", log_path=write_traceback_file(exc)))


def report(exc: BaseException, context: FailureContext) -> int:
    """:func:`embodied.logs.report_failure` (the traceback to the log, the paragraph to the
    terminal; the exit code), the paragraph wrapped by :func:`embodied.errors.fill_paragraph`:
    paths and the resume command stay whole on one line, to copy and paste."""
    out = io.StringIO()
    code = report_failure(exc, context, stream=out, width=sys.maxsize)
    sys.stderr.write(fill_paragraph(out.getvalue()) + "\n")
    sys.stderr.flush()
    return code


#: The exit code when the reader of stdout went away (`embodied config RECIPE | head`): 128 + SIGPIPE,
#: what a program that the shell's SIGPIPE ended returns (`set -o pipefail` sees the same as for `cat`).
EXIT_BROKEN_PIPE = ExitCode.BROKEN_PIPE


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _quiet_broken_pipe() -> int:
    """End quietly after stdout's reader went away: nothing more is written to it (Python's flush at
    exit would raise again), no message, no log file."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return int(EXIT_BROKEN_PIPE)


if __name__ == "__main__":
    # `python -m pipelines.cli`: run the importable module, the one `embodied plan` registers into
    from pipelines.cli import main as _main

    sys.exit(_main())
