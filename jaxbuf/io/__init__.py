"""A buffer's state in and out of the process: checkpoints (`checkpoint`,
`checkpoint_leaves`), datasets (`dataset`), Flashbax Vaults (`vault`), export
(`export`, `access`), configuration files (`config`).

Rule (tests/test_layout.py): io imports the wings below it, never `loop`.
"""
