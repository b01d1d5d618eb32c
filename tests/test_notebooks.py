"""The notebooks run end to end, as a reader would run them."""

import pathlib

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_every_notebook_of_the_issue_is_there():
    names = {path.stem for path in NOTEBOOKS}
    assert {"quickstart", "ppo_gae", "dqn_per", "sequences"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on failure
    errors = [
        output
        for cell in book.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
