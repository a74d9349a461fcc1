"""The driver: the training loop over the assembled components (driver.py: ``train``, ``grpoplus eval``'s
``evaluate_only``, ``grpoplus train --check``'s ``check_only``), and the passes it runs besides the steps: held-out
evaluation (evaluation.py) and the rewards on real completions before step 1 (preflight.py)."""
