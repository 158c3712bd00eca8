"""`swarmrl train local`: the trainer and its inference workers on one machine."""
