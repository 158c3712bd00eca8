"""The coordinator daemon: scheduler, validator, tasks and verifiers, GRPO trainer, ledger."""
