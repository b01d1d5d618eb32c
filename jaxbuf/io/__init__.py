"""A buffer's state in and out of the process: states built from data (`from_data`,
`dataset_to_state`, `vault_to_state`, `buffer_from_config`), datasets on disk, Flashbax
Vaults, export to NumPy and PyTorch, and a checkpoint's metadata. `save` and `restore`
are at the top level (`jaxbuf.save`).

Modules: checkpoints (`checkpoint`, `checkpoint_leaves`), datasets (`dataset`), Flashbax
Vaults (`vault`), export (`exporting`, `access`), configuration files (`config`). Each
public name is imported on first use; the `if TYPE_CHECKING:` imports are the list.

Rule (tests/test_layout.py): io imports the wings below it, never `loop`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxbuf import _public

if TYPE_CHECKING:
    from jaxbuf.io.access import take_all as take_all
    from jaxbuf.io.checkpoint import load_metadata as load_metadata
    from jaxbuf.io.config import buffer_from_config as buffer_from_config
    from jaxbuf.io.dataset import DatasetWriter as DatasetWriter
    from jaxbuf.io.dataset import dataset_to_state as dataset_to_state
    from jaxbuf.io.dataset import read_dataset as read_dataset
    from jaxbuf.io.exporting import export as export
    from jaxbuf.io.exporting import read_export as read_export
    from jaxbuf.io.exporting import stored_items as stored_items
    from jaxbuf.io.exporting import to_torch as to_torch
    from jaxbuf.io.vault import read_vault as read_vault
    from jaxbuf.io.vault import vault_to_state as vault_to_state
    from jaxbuf.kinds.replay import from_data as from_data

__getattr__, __dir__, __all__ = _public.attach(__name__, __file__)
