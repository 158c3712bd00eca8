"""Tasks and their verifiers.

- ``generators``: the demo's own seeded math tasks and their worked solutions.
- ``math_verifier``: boxed-answer extraction and equivalence checks (numeric, then sympy in a
  killable worker process).
- ``code_verifier``: runs candidate programs against stdin/stdout tests in a sandbox
  (bubblewrap when it works, rlimits otherwise).
- ``rewards``: task rewards, INTELLECT-2's length penalty and thinking-budget choice.
"""
