"""The entry points: the command line (cli.py: the ``grpoplus`` command, ``python -m grpoplus``), the Python API
(api.py: ``grpoplus.Trainer``, ``grpoplus.train``) and the Python objects handed to it made into config values
(inputs.py), ``grpoplus export`` (export.py). A config is built here, at the edge, and nowhere below."""
