"""Every public name is documented with an example that the doctests run."""

import doctest

import pytest

import jaxbuf


def examples_of(value) -> list:
    """The `>>>` examples in the docstring of `value` (for an instance, of its class)."""
    return doctest.DocTestParser().get_examples(getattr(value, "__doc__", None) or "")


@pytest.mark.parametrize("name", sorted(jaxbuf.__all__))
def test_public_name_has_a_docstring_with_an_example(name):
    value = getattr(jaxbuf, name)
    assert (getattr(value, "__doc__", None) or "").strip(), f"jaxbuf.{name} has no docstring"
    assert examples_of(value), f"jaxbuf.{name}'s docstring has no `>>>` example"


def test_the_check_fails_without_an_example():
    def undocumented():
        pass

    def described():
        """Says what it does, shows nothing."""

    assert not examples_of(undocumented) and not examples_of(described)
    assert not examples_of({"a": 1})  # a plain dict carries dict's docstring, no example
    assert examples_of(jaxbuf.STEP_KEYS)  # ours carries its own
