"""``embodied demos ENV_ID [episodes=N] [out=PATH] [obs_mode=rgb|state|state+rgb] [image_size=PX] [seed=S] ...``:
a scripted expert's successful episodes of a ManiSkill, Meta-World or LIBERO task, in ManiSkill's trajectory format.

The experts (:mod:`pipelines.demo_sources`): ManiSkill's (:mod:`envs.experts.maniskill`:
PushCube-v1, PickCube-v1, StackCube-v1) act on the simulator's privileged state through the
``pd_ee_delta_pos`` controller; Meta-World's own scripted policies (``metaworld/<task>``,
``metaworld_mt10``, ``metaworld_mt50``: every task of the suite into one file) act on the
adapter's ``state``; LIBERO's (:mod:`envs.experts.libero`: ``libero_spatial``, ``libero_object``
and their tasks ``<suite>/<k>``) pick and place from each task's BDDL goal on privileged object
poses, from the official initial states (attempt i starts from state ``(seed + i) mod 50``).
Only episodes the env's own ``success`` calls successful are written (:mod:`pipelines.demos`).
A progress line follows every episode; the last line is a JSON summary (file, kept, attempted,
success rate, seeds, and for a suite each task's).

    embodied demos PickCube-v1 episodes=100 image_size=32           # rgb frames for a tiny VLA
    embodied demos StackCube-v1 episodes=500 out=demos/stack.h5     # 128 px (ManiSkill's camera size)
    embodied demos PushCube-v1 episodes=20 obs_mode=state
    embodied demos metaworld_mt10 episodes=50 image_size=64         # 50 per task, one file
    embodied demos metaworld/drawer-open-v3 episodes=20 obs_mode=state
    embodied demos libero_object episodes=50                         # 50 per task; rgb renders 2 cameras (slow on CPU)
    embodied demos libero_spatial/4 episodes=10 obs_mode=state

Keys: episodes (100, per task), out (demos/<ENV_ID>/scripted/trajectory.<obs_mode>.pd_ee_delta_pos.physx_cpu.h5;
Meta-World, LIBERO: trajectory.<obs_mode>.mujoco.h5), obs_mode (rgb), image_size (128), seed (0: attempt i
resets with seed+i), max_episode_steps (ManiSkill 100, Meta-World 500, LIBERO 280), max_attempts (2 * episodes + 10
per task), control_mode (ManiSkill: pd_ee_delta_pos or pd_ee_delta_pose), overwrite (false).
"""

from __future__ import annotations

from embodied.errors import UserError
from pipelines.cli import register_command


def cmd_demos(args: list[str]) -> int:
    from pipelines.demos import parse_demo_args, record_demos, summary_json

    if not args or "=" in args[0] or args[0] in ("-h", "--help"):
        if args[:1] in (["-h"], ["--help"]):
            print(__doc__)
            return 0
        raise UserError("embodied demos needs a task: embodied demos ENV_ID [episodes=N] [out=PATH] [obs_mode=rgb|state] "
                        "[image_size=PX] (tasks with a scripted expert: PushCube-v1, PickCube-v1, StackCube-v1, "
                        "metaworld/<task>, metaworld_mt10, metaworld_mt50, libero_spatial, libero_object, <suite>/<k>).")
    summary = record_demos(parse_demo_args(args[0], args[1:]))
    print(summary_json(summary))
    return 0


register_command("demos", cmd_demos, "record a scripted expert's demonstrations: embodied demos ENV_ID [episodes=N] [out=PATH]")
