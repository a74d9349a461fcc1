"""What every package shares, on the standard library alone (no torch, no other grpoplus package): the registry of
pluggable pieces (registry.py), the one reader of field docstrings (fielddocs.py), optional packages and the one-line
error when one is missing (packages.py), what a run needs of the machine, noted by the dry run (needs.py), JSON
requests to OpenAI-compatible servers (endpoints.py) and the run directory's layout (rundir.py)."""
