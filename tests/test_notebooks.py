"""The notebooks run end to end, as a reader would run them."""

import pathlib

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
# The notebooks that train run shorter here: after the cell tagged "parameters" comes
# one with these values, as papermill injects them. Every cell still runs.
SMALL = {
    "dqn_per": "total_timesteps, seeds = 12_000, (0,)",
    "ppo_gae": "total_timesteps, seeds = 10_240, (0,)",
}


def with_small_parameters(book, name: str):
    """`book` with `SMALL[name]` run after its parameters cell (the cell must exist)."""
    if name not in SMALL:
        return book
    tagged = [i for i, cell in enumerate(book.cells)
              if "parameters" in cell.get("metadata", {}).get("tags", [])]  # fmt: skip
    assert len(tagged) == 1, f"{name}: one cell tagged 'parameters'"
    book.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(SMALL[name]))
    return book


def test_every_notebook_of_the_issue_is_there():
    names = {path.stem for path in NOTEBOOKS}
    assert {"quickstart", "ppo_gae", "dqn_per", "sequences"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    book = with_small_parameters(nbformat.read(path, as_version=4), path.stem)
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
