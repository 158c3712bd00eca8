"""The node's terminal app (`app`), what it shows as plain data (`view`) and the chain
as it sees it (`onchain`)."""
