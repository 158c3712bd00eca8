"""The orchestrator daemon: intake, validation, scheduling, the ledger and the chain recorder."""
