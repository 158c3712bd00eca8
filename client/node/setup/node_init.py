"""What `swarmrl node init` does, in two steps: `set_up_node` creates the node's key and
identity and either registers it with the provider's key on this machine or signs its
consent for a provider elsewhere; `write_node_config` then writes the node.toml that
`node run` reads.

Each refusal is a ValueError (or OSError) in one sentence; the files are checked
before any key is unlocked or anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from client.node.setup.keys import NodeSetup


@dataclass(frozen=True)
class NodeInit:
    """What `set_up_node` did; with a consent, where it was written and until when (unix
    seconds, by the chain's clock) the provider may use it."""

    setup: NodeSetup
    consent_out: Path | None = None
    consent_deadline: int | None = None

    def lines(self) -> list[str]:
        """What the command prints."""
        from swarmrl.times import date_time

        if self.consent_out is None or self.consent_deadline is None:
            return [self.setup.summary()]
        return [
            self.setup.summary(),
            f"wrote {self.consent_out} (usable until {date_time(self.consent_deadline)}, by "
            f"the chain's clock); on the provider's machine: swarmrl wallet add-node KEY "
            f"{self.consent_out}",
        ]


def set_up_node(
    *,
    key: str = "node",
    provider: str | None = None,
    provider_address: str | None = None,
    consent_out: Path | None = None,
    valid_for: int = 86400,
    keystore_dir: Path | None = None,
    password_file: Path | None = None,
    deployment: Path | None = None,
    config_out: Path | None = None,
    data_dir: Path | None = None,
) -> NodeInit:
    """Creates node key `key` and its peer identity where missing; with `provider_address`
    and `consent_out`, signs the node's consent for that provider (usable `valid_for`
    seconds) into `consent_out`; else, with the provider's keystore key `provider`,
    registers the provider, adds the node and joins the pool where the chain lacks that.
    `config_out` and `data_dir`, written later by `write_node_config`, are checked first."""
    from client.node.settings import ROLE
    from client.node.setup.keys import init_node, passwords_from, sign_consent
    from swarmrl import keystore
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.files import check_data_dir, check_output_path, write_atomically

    if config_out is not None:
        check_output_path(config_out)
    if consent_out is not None:
        check_output_path(consent_out)
    if data_dir is not None:
        check_data_dir(data_dir, ROLE)
    if provider_address is not None and consent_out is not None:
        done, consent = sign_consent(
            keystore_dir or keystore.default_dir(),
            key,
            provider_address,
            passwords_from(password_file),
            load_deployment(deployment),
            valid_for=valid_for,
        )
        write_atomically(consent_out, consent.to_json())
        return NodeInit(done, consent_out, consent.deadline)
    if provider is None:
        raise ValueError(
            "give one: a provider's key on this machine, or a provider's address with a "
            "file for its consent"
        )
    done = init_node(
        keystore_dir or keystore.default_dir(),
        key,
        provider,
        passwords_from(password_file),
        load_deployment(deployment),
    )
    return NodeInit(done)


def write_node_config(
    out: Path,
    *,
    key: str = "node",
    keystore_dir: Path | None = None,
    password_file: Path | None = None,
    deployment: Path | None = None,
    data_dir: Path | None = None,
    metrics_port: int | None = None,
) -> str:
    """Writes a commented node.toml at `out` with the settings given (unset ones stay at
    their defaults), so `node run` uses the same key and files; the line to print."""
    from client.node.settings import NodeSettings
    from swarmrl.settings_toml import write_settings

    given = {
        "key": key,
        "keystore_dir": keystore_dir,
        "password_file": password_file,
        "deployment": deployment,
        "data_dir": data_dir,
        "metrics_port": metrics_port,
    }
    write_settings(out, given, template_of=NodeSettings)
    return f"wrote {out}; set orchestrator in it, then: swarmrl node run --config {out}"
