"""The skip check (`skips.py`): a skip's stated condition is checked where it skipped."""

import pytest
from skips import needs, skip_holds


@pytest.mark.parametrize(
    "reason, holds",
    [
        ("could not import 'no_such_module_here': No module named 'no_such_module_here'", True),
        ("could not import 'no_such_package_here.sub'", True),
        ("could not import 'jaxbuf': some import error", False),  # installed: the skip hid it
        ("needs pytest >= 1.0 (installed: 8.0)", False),
        ("needs pytest >= 999 (installed: 8.0)", True),
        ("needs no-such-distribution >= 1.0 (installed: None)", True),
        # what importorskip's minversion said of gymnax 1.0.1, which has no __version__
        ("module 'gymnax' has __version__ None, required is: '1.0'", False),
        ("no reason given", False),
    ],
)
def test_a_skip_holds_only_where_its_condition_does(reason, holds):
    assert skip_holds(reason) is holds
    assert skip_holds(f"Skipped: {reason}") is holds


def test_needs_reads_the_installed_metadata():
    needs("pytest", "1.0")  # installed: does not skip
    with pytest.raises(pytest.skip.Exception, match=r"needs pytest >= 999 \(installed: "):
        needs("pytest", "999")
