"""The ledger's tables, its schema version, and the upgrade from older versions.

The version is SQLite's `user_version`. A new file gets the tables and its genesis
time; a file of an older schema is upgraded, through each version in turn, in one
transaction; a newer one is refused.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time

from orchestrator.service.ledger import orders
from orchestrator.service.ledger.connection import Connection
from swarmrl.work.assign import Slot, WorkOrder

log = logging.getLogger(__name__)

SCHEMA_VERSION = 7

# A work order is kept signed, as its node got it (JSON); node, counter and deadline,
# taken from it, are what it is looked up by.
_ORDERS = """
CREATE TABLE orders (
    order_id TEXT PRIMARY KEY, node TEXT NOT NULL, counter INTEGER NOT NULL,
    deadline INTEGER NOT NULL, issued_at REAL NOT NULL, state TEXT NOT NULL,
    signed TEXT NOT NULL
);
CREATE INDEX orders_by_state ON orders (state, deadline);
CREATE INDEX orders_by_node ON orders (node, state, counter);
CREATE INDEX orders_by_counter ON orders (node, counter);
"""
# A validator worker's hold on a submission it judges (`submissions.Lease`): its worker
# id and its process's token, until `expires` unless renewed. Only a submission still
# received has one: its verdict deletes it.
_LEASES = """
CREATE TABLE leases (
    digest TEXT PRIMARY KEY REFERENCES submissions (digest), worker TEXT NOT NULL,
    token TEXT NOT NULL, expires REAL NOT NULL
);
CREATE INDEX leases_by_worker ON leases (worker, token);
"""
# Submissions and units by node and status, kept by triggers in the transaction that
# writes the submission, so status and metrics read a row per node, never the whole
# table, and the counts cannot drift from the rows whichever process writes them.
# A submission's node never changes; its status and units do (the verdict).
_TALLIES = """
CREATE TABLE tallies (
    node TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL, units INTEGER NOT NULL,
    PRIMARY KEY (node, status)
);
CREATE TRIGGER tally_new AFTER INSERT ON submissions BEGIN
    INSERT INTO tallies (node, status, n, units) VALUES (NEW.node, NEW.status, 1, NEW.units)
    ON CONFLICT (node, status) DO UPDATE SET n = n + 1, units = units + NEW.units;
END;
CREATE TRIGGER tally_verdict AFTER UPDATE OF status, units ON submissions BEGIN
    UPDATE tallies SET n = n - 1, units = units - OLD.units
    WHERE node = OLD.node AND status = OLD.status;
    INSERT INTO tallies (node, status, n, units) VALUES (NEW.node, NEW.status, 1, NEW.units)
    ON CONFLICT (node, status) DO UPDATE SET n = n + 1, units = units + NEW.units;
END;
CREATE INDEX submissions_by_node ON submissions (node, received_at);
"""
_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE nodes (
    address TEXT PRIMARY KEY, provider TEXT NOT NULL, peer_id TEXT NOT NULL,
    backend TEXT NOT NULL, hardware TEXT NOT NULL, state TEXT NOT NULL,
    joined_at REAL NOT NULL, last_seen REAL NOT NULL, speed REAL,
    trusted INTEGER NOT NULL DEFAULT 0, abandoned INTEGER NOT NULL DEFAULT 0,
    temperature_excess REAL NOT NULL DEFAULT 0, temperature_variance REAL NOT NULL DEFAULT 0,
    temperature_submissions INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX nodes_by_peer ON nodes (peer_id);
CREATE TABLE transitions (
    id INTEGER PRIMARY KEY, address TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL,
    reason TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX transitions_by_node ON transitions (address, id);
CREATE TABLE counters (node TEXT PRIMARY KEY, next INTEGER NOT NULL);
{_ORDERS}CREATE TABLE submissions (
    digest TEXT PRIMARY KEY, node TEXT NOT NULL, order_id TEXT NOT NULL,
    epoch INTEGER NOT NULL, step INTEGER NOT NULL, file TEXT NOT NULL,
    file_sha256 TEXT NOT NULL, rollout_digest TEXT NOT NULL, signature TEXT NOT NULL,
    received_at REAL NOT NULL, units INTEGER NOT NULL, status TEXT NOT NULL,
    reason TEXT NOT NULL, slashable INTEGER NOT NULL, prefilled INTEGER NOT NULL,
    receipt TEXT NOT NULL, validated_at REAL, late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX submissions_by_epoch ON submissions (epoch, node);
CREATE INDEX submissions_by_status ON submissions (status, received_at);
{_LEASES}CREATE TABLE epochs (
    epoch INTEGER NOT NULL, node TEXT NOT NULL, units INTEGER NOT NULL,
    commitment TEXT NOT NULL, tx_hash TEXT, recorded_at REAL NOT NULL,
    part INTEGER, membership INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (epoch, node)
);
CREATE INDEX epochs_by_part ON epochs (epoch, part);
CREATE TABLE slashes (
    digest TEXT PRIMARY KEY, epoch INTEGER NOT NULL, node TEXT NOT NULL,
    tx_hash TEXT, outcome TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX slashes_by_epoch ON slashes (epoch, node);
{_TALLIES}"""

# Schema 3: each node's colder-sampling sums (swarmrl.rollouts.tolerances.TemperatureSums),
# empty for the nodes a schema 2 ledger knew.
_UPGRADE_FROM_2 = """
ALTER TABLE nodes ADD COLUMN temperature_excess REAL NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN temperature_variance REAL NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN temperature_submissions INTEGER NOT NULL DEFAULT 0;
"""
# Schema 4: leases, so several validator workers share the submissions; a schema 3
# ledger's validator held none.
_UPGRADE_FROM_3 = _LEASES
# Schema 5: the tallies, counted once from the submissions a schema 4 ledger holds; a
# node's newest order in a state found in the index, not among all of its orders.
_UPGRADE_FROM_4 = (
    _TALLIES
    + """
DROP INDEX orders_by_node;
CREATE INDEX orders_by_node ON orders (node, state, counter);
INSERT INTO tallies (node, status, n, units)
    SELECT node, status, COUNT(*), COALESCE(SUM(units), 0) FROM submissions GROUP BY node, status;
"""
)

# Schema 6: an epoch goes on chain in parts (one root over many nodes' leaves): each
# node's row names its part and the membership its leaf was recorded under. A schema 5
# ledger's rows were recorded one per node by the contract before, and name none. And
# each node's newest order is found by an index seek.
_UPGRADE_FROM_5 = """
ALTER TABLE epochs ADD COLUMN part INTEGER;
ALTER TABLE epochs ADD COLUMN membership INTEGER NOT NULL DEFAULT 0;
CREATE INDEX epochs_by_part ON epochs (epoch, part);
CREATE INDEX IF NOT EXISTS orders_by_counter ON orders (node, counter);
"""
# Schema 7: a submission still waiting for its verdict when the recorder closed its
# epoch is late: its verdict stands, and the epoch, on chain already, does not pay it. A
# schema 6 ledger's epochs paid what was accepted when they were recorded, and no
# submission of them is marked.
_UPGRADE_FROM_6 = """
ALTER TABLE submissions ADD COLUMN late INTEGER NOT NULL DEFAULT 0;
"""


def prepare(connection: Connection, run: str | None) -> None:
    """Creates the schema of a new file, or upgrades an older one. `run`: the run this
    orchestrator issues orders in; a ledger of schema 1 kept its orders without their
    run, so only given it is such a ledger upgraded, else refused with a sentence."""
    path = connection.path
    # In one write transaction, so processes opening a new file at once create it once,
    # and an upgrade is all done or not at all.
    with connection.write() as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"{path} was written by a newer swarmrl (ledger schema {version}, "
                f"this version reads {SCHEMA_VERSION}); upgrade swarmrl"
            )
        if version == 0:
            _execute(db, _SCHEMA)
            db.execute("INSERT INTO meta (key, value) VALUES ('genesis', ?)", (repr(time.time()),))
        if version == 1:
            if run is None:
                raise ValueError(
                    f"{path} was written by an older swarmrl (ledger schema {version}); "
                    "`swarmrl orchestrator run` upgrades it"
                )
            count = _upgrade_from_1(db, connection, run)
            log.info("ledger %s upgraded from schema 1 (%d work orders)", path, count)
        if 1 <= version <= 2:
            _execute(db, _UPGRADE_FROM_2)
            log.info("ledger %s upgraded from schema 2 (colder-sampling sums per node)", path)
        if 1 <= version <= 3:
            _execute(db, _UPGRADE_FROM_3)
            log.info("ledger %s upgraded from schema 3 (validator leases)", path)
        if 1 <= version <= 4:
            _execute(db, _UPGRADE_FROM_4)
            log.info("ledger %s upgraded from schema 4 (submission tallies)", path)
        if 1 <= version <= 5:
            _execute(db, _UPGRADE_FROM_5)
            log.info("ledger %s upgraded from schema 5 (epochs recorded in parts)", path)
        if 1 <= version <= 6:
            _execute(db, _UPGRADE_FROM_6)
            log.info("ledger %s upgraded from schema 6 (late verdicts)", path)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _upgrade_from_1(db: sqlite3.Connection, connection: Connection, run: str) -> int:
    """Schema 1 kept each work order's fields in columns of their own, and not its
    run: each becomes the signed order it was issued as. Returns how many."""
    rows = db.execute("SELECT * FROM assignments").fetchall()
    _execute(db, _ORDERS)
    for r in rows:
        try:
            order = WorkOrder(
                run=run,
                node=r["node"],
                counter=r["counter"],
                min_step=r["min_step"],
                seed=int(r["seed"]),
                group_size=r["group_size"],
                max_tokens=r["max_tokens"],
                temperature=float(r["temperature"]),
                top_p=float(r["top_p"]),
                tasks=[Slot(problem_id=p, budget=b) for p, b in json.loads(r["tasks"])],
                deadline=int(r["deadline"]),
                signature=r["signature"],
            )
        except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
            raise ValueError(
                f"cannot upgrade {connection.path}: its work order {r['order_id'][:12]} is damaged"
            ) from None
        orders.insert(db, r["order_id"], order, r["issued_at"], r["state"])
    db.execute("DROP TABLE assignments")
    return len(rows)


def _execute(db: sqlite3.Connection, script: str) -> None:
    """Each statement of `script`, inside the caller's transaction (executescript would
    commit it); a trigger's body, semicolons and all, is one statement."""
    statement = ""
    for part in script.split(";"):
        statement += part + ";"
        if sqlite3.complete_statement(statement):
            if statement.strip(" \n;"):
                db.execute(statement)
            statement = ""
