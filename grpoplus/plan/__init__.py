"""What a config decides, derived once: the values and predicates every layer acts on (the assembly, the roles, the
dry run). Loads no weight and starts no process. :mod:`~grpoplus.plan.placement`: where each role runs and which copy
of the policy it holds."""
