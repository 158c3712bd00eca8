"""The node as a daemon: the one process that holds the node's work (`runner`), its
control socket (`control`), its start in the background from a terminal
(`background`), node.toml read again while it runs (`reload`) and its Prometheus
metrics (`metrics`)."""
