"""The CLI contract harness: every `swarmrl` command, a matrix of bad inputs, and the
checks that each one ends cleanly (tests/integration/test_cli_contract.py)."""
