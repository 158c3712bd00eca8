"""The states of the work protocol, named once.

A node's state in the run and a submission's status travel on the wire (join
and heartbeat replies); a work order's state is what the orchestrator answers a
submission for a closed order with. Values are the strings the wire, the ledger
and the status commands carry, so a member compares equal to its string. Which
state may follow which is the ledger's transition table
(``orchestrator.service.ledger.TRANSITIONS``).
"""

from __future__ import annotations

from enum import StrEnum


class NodeState(StrEnum):
    """A node's standing in the run."""

    JOINED = "joined"  # its join was accepted; no heartbeat yet
    ACTIVE = "active"  # it sends heartbeats and may take work
    SILENT = "silent"  # it missed heartbeats; it becomes active again with the next
    GONE = "gone"  # silent for long, or it said it left; it must join again
    BANNED = "banned"  # it was caught with evidence; for good


class OrderState(StrEnum):
    """What became of a work order."""

    OPEN = "open"  # issued, not yet answered, not past its deadline
    ANSWERED = "answered"  # a submission answered it
    EXPIRED = "expired"  # its deadline passed unanswered
    REASSIGNED = "reassigned"  # expired, and another node's order took its tasks over
    DROPPED = "dropped"  # expired, and its tasks left the task set: no one can take them


class SubmissionStatus(StrEnum):
    """How far validation of a submission got."""

    RECEIVED = "received"  # acknowledged at intake; the validator has yet to judge it
    ACCEPTED = "accepted"
    REJECTED = "rejected"
