"""The machine the node shares: when it may work (`conditions`), why it holds
(`holds`), the limits it keeps (`limits`) and its transfer quota (`traffic`)."""
