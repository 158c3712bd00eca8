"""Rollouts: sampled completions with their proofs, rewards and digest.

- ``records``   the versioned record schema and its parquet files
- ``generate``  tasks in, proven and scored rollout records out
- ``verify``    a validator's check of records from the file alone
"""
