"""`python -m swarmrl`: the `swarmrl` command, for a process that starts another of it
(the node starting its daemon) with the interpreter it runs on."""

from swarmrl.cli import main

main()
