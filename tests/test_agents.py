"""The example agents: their pieces against references, and a smoke run of each loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuf
from jaxbuf.examples import offline_cql, rdqn_cartpole, sac_pendulum


def test_squashed_gaussian_log_density_matches_the_change_of_variables():
    mean, log_std = jnp.array([[0.3, -1.0]]), jnp.array([[-0.5, 0.2]])
    action, log_prob = sac_pendulum.squashed_sample(mean, log_std, jax.random.key(0), 2.0)
    u = np.arctanh(np.asarray(action, np.float64) / 2.0)
    std = np.exp(np.asarray(log_std, np.float64))
    gaussian = -0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std * np.sqrt(2 * np.pi))
    jacobian = np.log(2.0 * (1.0 - np.tanh(u) ** 2))  # d(2 tanh u)/du
    np.testing.assert_allclose(log_prob, np.sum(gaussian - jacobian, axis=-1), rtol=1e-4)
    assert np.all(np.abs(np.asarray(action)) <= 2.0)


@pytest.mark.parametrize(
    "run",
    [
        lambda: sac_pendulum.main(0, True, config={"total_timesteps": 2_000, "num_chunks": 1,
                                                   "learning_starts": 500, "eval_envs": 2}),
        lambda: rdqn_cartpole.main(0, True, prioritized=True, config={
            "total_timesteps": 3_200, "num_chunks": 1, "learning_starts": 1_600,
            "eval_envs": 2}),
    ],
    ids=["sac", "recurrent-prioritized"],
)  # fmt: skip
def test_agents_train_and_evaluate(run):
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32 counts and floats
        result = run()
    assert np.all(np.isfinite(result))


def test_offline_agent_records_a_dataset_and_trains_on_every_transition(tmp_path):
    config = {"record_timesteps": 20_000, "epochs": 1, "eval_envs": 2}
    with jax.numpy_dtype_promotion("standard"):
        score = offline_cql.main(0, True, str(tmp_path), config=config)
    assert np.isfinite(score)
    assert len(jaxbuf.io.read_dataset(tmp_path / "dqn")["reward"]) == 20_000


def test_the_torch_dqn_learns_from_host_loop_blocks_like_from_the_numpy_buffer():
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    from jaxbuf.examples import dqn_torch

    sizes = {}
    for kind in ("numpy", "jaxbuf"):
        buffer = (dqn_torch.NumpyBuffer(0) if kind == "numpy"
                  else dqn_torch.JaxbufBuffer(0, steps_per_call=4))  # fmt: skip
        rng = np.random.default_rng(0)
        for _ in range(8):
            obs = rng.normal(size=(dqn_torch.ENVS, 4)).astype(np.float32)
            action, done = rng.integers(0, 2, dqn_torch.ENVS), rng.random(dqn_torch.ENVS) < 0.2
            if kind == "numpy":
                buffer.add(obs, action, np.ones(8), done, obs)
            else:
                buffer.add(obs, action, np.ones(8), done, np.zeros(8, bool), obs)
        batch = buffer.sample()
        sizes[kind] = [tuple(x.shape) for x in batch]
        # the same targets' pieces: discount 0 after a termination, gamma otherwise
        assert set(np.unique(batch[3].numpy())) <= {0.0, np.float32(dqn_torch.GAMMA)}
    assert sizes["numpy"] == sizes["jaxbuf"]
    parameters, _ = dqn_torch.train("jaxbuf", 0, steps=600, steps_per_call=8)
    assert parameters and all(np.isfinite(v.numpy()).all() for v in parameters.values())
