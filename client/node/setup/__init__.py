"""A node's place: its keys and pool membership (`keys`: `node init`, `wallet
add-node`), its move to another machine (`transfer`) and the preflight (`doctor`)."""
