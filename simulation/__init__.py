"""What drives both apps on one machine: a whole swarm (`local_swarm`), the faults it
survives (`faults`), a node that cheats (`cheater`) and the demo (`demo`).

Neither app imports anything here, nor does the core: the layering rules
(tests/unit/test_layers.py) say so. The demo's command reaches `swarmrl` through the
entry-point group the apps use (`simulation.commands`).
"""
