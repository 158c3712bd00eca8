"""The learner: asynchronous GRPO with INTELLECT-2's recipe.

- ``batch``: the policy's log-probabilities of rollout tokens, in one padded pass.
- ``optim``: AdamW with weight decay on matrices only; warmup, then a constant rate.
- ``loss``: the clipped policy-gradient loss with the dual clip, the group
  advantages and the online filter, as pure functions over tensors.
- ``samples``: rollout records grouped, with advantages; staleness.
- ``step``: one optimizer step over micro-batches, skipped when not finite.
- ``distributed``: the same step data-parallel with FSDP2 (NCCL or gloo).
- ``feed``: rollout files from a spool, checked, with the data position.
- ``checkpoint``: atomic per-step checkpoints with the resumable state.
- ``recipe``: every knob of the recipe, once (the daemon's settings and ``train local``'s
  options are made from it).
- ``loop``: the trainer loop that puts them together, by a recipe.
"""
