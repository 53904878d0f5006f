"""The replay buffer: uniform sampling over what is stored, n-step returns within an episode
(termination vs truncation, the stream's newest step), the ring's wrap-around, demonstrations mixed
in at a fixed share, and its state round trip. Every number is computed by hand."""

from __future__ import annotations

import pytest
import torch

from embodied.rl.replay import ReplayBuffer, Transitions, mixed_sample

GAMMA = 0.5


def steps(rewards, terminated=None, truncated=None, first_obs=0.0):
    """(T, B) transitions whose obs is ``first_obs + t`` (env column b adds 100 * b) and next obs
    ``obs + 0.5``; actions equal the obs."""
    r = torch.tensor(rewards, dtype=torch.float32)
    T, B = r.shape
    obs = (first_obs + torch.arange(T, dtype=torch.float32)[:, None] + 100 * torch.arange(B)[None, :]).unsqueeze(-1)
    flag = lambda x: torch.zeros(T, B, dtype=torch.bool) if x is None else torch.tensor(x, dtype=torch.bool)  # noqa: E731
    return Transitions({"state": obs}, obs.clone(), r, {"state": obs + 0.5}, flag(terminated), flag(truncated))


def buffer(capacity=8, num_envs=1):
    return ReplayBuffer(capacity, num_envs, {"state": (1,)}, (1,))


def test_one_step_samples_are_the_stored_transitions():
    buf = buffer(capacity=6, num_envs=2)
    buf.extend(steps([[1.0, 10.0], [2.0, 20.0]], terminated=[[False, False], [True, False]]))
    s = buf.gather(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]), GAMMA)
    assert s.rewards.tolist() == [1.0, 2.0, 20.0]
    assert s.discounts.tolist() == [GAMMA, 0.0, GAMMA]  # the termination does not bootstrap
    assert s.obs["state"][:, 0].tolist() == [0.0, 1.0, 101.0]
    assert s.next_obs["state"][:, 0].tolist() == [0.5, 1.5, 101.5]
    assert len(buf) == 4


def test_three_step_returns_stop_at_a_termination_and_bootstrap_at_a_truncation():
    # env 0: steps 0..4, terminated at step 2; env 1: truncated at step 1, a new episode from step 2
    buf = buffer(capacity=10, num_envs=2)
    buf.extend(steps([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0], [8.0, 8.0], [16.0, 16.0]],
                     terminated=[[0, 0], [0, 0], [1, 0], [0, 0], [0, 0]],
                     truncated=[[0, 0], [0, 1], [0, 0], [0, 0], [0, 0]]))
    s = buf.gather(torch.tensor([0, 1, 2, 0, 2]), torch.tensor([0, 0, 0, 1, 1]), GAMMA, n_step=3)
    # env 0 from 0: 1 + .5*2 + .25*4, then the termination: no bootstrap
    # env 0 from 1: 2 + .5*4, terminated; env 0 from 2: 4, terminated
    # env 1 from 0: 1 + .5*2, truncated at step 1: bootstrap from its final obs with gamma**2
    # env 1 from 2: 4 + .5*8 + .25*16, three steps taken: gamma**3 from step 4's next obs
    assert s.rewards.tolist() == [3.0, 4.0, 4.0, 2.0, 12.0]
    assert s.discounts.tolist() == [0.0, 0.0, 0.0, 0.25, 0.125]
    assert s.next_obs["state"][:, 0].tolist() == [2.5, 2.5, 2.5, 101.5, 104.5]


def test_bootstrap_terminated_keeps_the_discount_but_ends_the_sum():
    buf = buffer(capacity=4)
    buf.extend(steps([[1.0], [2.0], [4.0]], terminated=[[0], [1], [0]]))
    s = buf.gather(torch.tensor([0]), torch.tensor([0]), GAMMA, n_step=3, bootstrap_terminated=True)
    assert s.rewards.tolist() == [2.0] and s.discounts.tolist() == [0.25]
    assert s.next_obs["state"][:, 0].tolist() == [1.5]


def test_an_n_step_sum_stops_at_the_newest_stored_step_and_at_the_ring_wrap():
    buf = buffer(capacity=4)
    buf.extend(steps([[1.0], [2.0]]))
    s = buf.gather(torch.tensor([1]), torch.tensor([0]), GAMMA, n_step=3)
    assert s.rewards.tolist() == [2.0] and s.discounts.tolist() == [GAMMA]  # only one step is stored after it
    buf.extend(steps([[4.0], [8.0], [16.0]], first_obs=2.0))  # 5 steps into 4 rows: step 0 is overwritten
    assert len(buf) == 4 and buf.pos == 1
    # physical row 0 now holds step 4 (the newest); row 1 holds step 1 (the oldest)
    s = buf.gather(torch.tensor([1, 3, 0]), torch.tensor([0, 0, 0]), GAMMA, n_step=3)
    assert s.rewards.tolist() == [2.0 + 2.0 + 2.0, 8.0 + 8.0, 16.0]  # the ring wraps from row 3 to row 0
    assert s.discounts.tolist() == [0.125, 0.25, 0.5]
    assert s.obs["state"][:, 0].tolist() == [1.0, 3.0, 4.0]


def test_uniform_sampling_draws_every_stored_transition_alike():
    buf = buffer(capacity=8, num_envs=2)
    buf.extend(steps([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]))
    g = torch.Generator().manual_seed(0)
    s = buf.sample(60_000, g, GAMMA)
    counts = torch.bincount(s.rewards.long(), minlength=6).float() / 60_000
    assert torch.allclose(counts, torch.full((6,), 1 / 6), atol=0.01)
    again = buf.sample(60_000, torch.Generator().manual_seed(0), GAMMA)
    assert torch.equal(s.rewards, again.rewards)  # the generator decides the draw


def test_demonstrations_fill_their_share_of_every_batch():
    online, demos = buffer(), buffer()
    online.extend(steps([[1.0]] * 4))
    demos.extend(steps([[-1.0]] * 4))
    g = torch.Generator().manual_seed(0)
    s = mixed_sample(online, demos, 10, 0.5, g, GAMMA)
    assert s.rewards.tolist() == [-1.0] * 5 + [1.0] * 5
    assert mixed_sample(online, None, 10, 0.5, g, GAMMA).rewards.tolist() == [1.0] * 10
    assert mixed_sample(online, demos, 10, 0.25, g, GAMMA).rewards.tolist() == [-1.0] * 2 + [1.0] * 8  # round(2.5) = 2


def test_the_state_round_trip_restores_the_buffer_exactly():
    buf = buffer(capacity=4, num_envs=2)
    buf.extend(steps([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], truncated=[[0, 0], [1, 0], [0, 0]]))
    copy = buffer(capacity=4, num_envs=2)
    copy.load_state(buf.state())
    a = buf.sample(32, torch.Generator().manual_seed(3), GAMMA, n_step=2)
    b = copy.sample(32, torch.Generator().manual_seed(3), GAMMA, n_step=2)
    assert torch.equal(a.rewards, b.rewards) and torch.equal(a.discounts, b.discounts)
    assert torch.equal(a.next_obs["state"], b.next_obs["state"]) and copy.pos == buf.pos
    with pytest.raises(ValueError, match="does not fit"):
        buffer(capacity=4, num_envs=1).load_state(buf.state())
