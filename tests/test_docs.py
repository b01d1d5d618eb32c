"""Every public name is documented with an example that the doctests run."""

import dataclasses
import doctest
import inspect
import pydoc

import jax
import pytest
from helpers import public_names, resolve

import jaxbuf
from jaxbuf.core.time_ring import DoneKey


def examples_of(value) -> list:
    """The `>>>` examples in the docstring of `value` (for an instance, of its class)."""
    return doctest.DocTestParser().get_examples(getattr(value, "__doc__", None) or "")


# jaxbuf.ray's and jaxbuf.brax's names need a Ray cluster or Brax to run: their docstrings
# say what they do, and tests/test_ray.py and tests/test_brax.py run them.
EXAMPLED = [name for name in public_names() if not name.startswith(("jaxbuf.ray.", "jaxbuf.brax."))]


@pytest.mark.parametrize("name", EXAMPLED)
def test_public_name_has_a_docstring_with_an_example(name):
    value = resolve(name)
    assert (getattr(value, "__doc__", None) or "").strip(), f"{name} has no docstring"
    assert examples_of(value), f"{name}'s docstring has no `>>>` example"


def test_the_check_fails_without_an_example():
    def undocumented():
        pass

    def described():
        """Says what it does, shows nothing."""

    assert not examples_of(undocumented) and not examples_of(described)
    assert not examples_of({"a": 1})  # a plain dict carries dict's docstring, no example
    assert examples_of(jaxbuf.rl.STEP_KEYS)  # ours carries its own


def every_buffer():
    """A buffer of every kind, sampler and transform, by name."""
    done = DoneKey("done")
    mesh = jax.make_mesh((1,), ("data",))
    buffers = {}
    for sampler in (jaxbuf.uniform(), jaxbuf.prioritized()):
        name = sampler.config.kind
        buffers |= {
            f"replay/{name}": jaxbuf.make_replay_buffer(8, 2, sampler=sampler),
            f"trajectory/{name}": jaxbuf.make_trajectory_buffer(2, 8, 2, 2, sampler=sampler),
            f"transition/{name}": jaxbuf.make_transition_buffer(2, 8, 2, sampler=sampler),
            f"episode/{name}": jaxbuf.make_episode_buffer(
                2, 8, 2, 4, done_fn=done, sampler=sampler
            ),
        }
    buffers["vectorized"] = jaxbuf.vectorize(buffers["trajectory/prioritized"], 2)
    buffers["sharded"] = jaxbuf.shard(buffers["replay/prioritized"], mesh)
    buffers["queue"] = jaxbuf.make_queue(8, 2, 2)
    buffers["rollout"] = jaxbuf.make_rollout_buffer(4, 2, discount=0.9, gae_lambda=0.9)
    return buffers


@pytest.mark.parametrize("name", sorted(every_buffer()))
def test_help_of_every_function_of_every_buffer_shows_its_shapes(name):
    buffer = every_buffer()[name]
    assert isinstance(buffer, jaxbuf.types.BufferLike)
    for field in dataclasses.fields(buffer):
        fn = getattr(buffer, field.name)
        if not callable(fn) or field.name in ("layout", "sampler"):
            continue
        text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
        doc = inspect.getdoc(fn) or ""
        shown = all(line.strip() in text for line in doc.splitlines())
        assert len(doc) > 40 and shown, f"{name}.{field.name} has no docstring in help()"
        assert "`[" in doc or "scalar" in doc, f"{name}.{field.name}'s docstring gives no shape"
        assert "self" not in str(inspect.signature(fn)), f"{name}.{field.name}"
