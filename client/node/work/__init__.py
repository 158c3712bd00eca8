"""The node at work: the loop that joins, pulls weights, takes orders and submits
(`loop`), its side of the work protocols (`session`), the journal of what it handed in
(`journal`), the worker processes that generate (`workers`, and `worker`, one of them)
and the backoff of every retry (`backoff`)."""
