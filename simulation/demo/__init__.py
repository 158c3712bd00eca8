"""`swarmrl demo`: the whole loop on one machine (loop, report), and the one-part scenes
(scenes; rollouts is the validator's own)."""
