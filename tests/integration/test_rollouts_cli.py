"""`swarmrl model`, `tasks` and `rollouts` as a user runs them, on the real default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file, save_file

from orchestrator.pretrain import RECIPE_FILE, SHIPPED, Recipe, build_default_model
from orchestrator.tasks.generators import demo_tasks
from orchestrator.verify_file import judge_file, read_file
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.models.backend import SamplingParams
from swarmrl.models.directory import read_state_dict
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.records import file_digest, read_rollout_file, write_rollouts
from swarmrl.rollouts.signing import FileSignature, run_domain
from swarmrl.tasks import read_tasks
from swarmrl.tasks.rewards import task_reward
from tests.conftest import held_out_reward
from tests.model_fixtures import random_tiny_model

from .conftest import NODE_A, NODE_B

SWARMRL = Path(sys.executable).with_name("swarmrl")


def swarmrl(*args, check=True, env=None):
    out = subprocess.run(
        [SWARMRL, *map(str, args)], capture_output=True, text=True, timeout=600, env=env
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_model_init_is_seeded_and_cached(tmp_path):
    short = Recipe(steps=3, batch=4)
    a = build_default_model(tmp_path / "a", short)
    b = build_default_model(tmp_path / "b", short)
    c = build_default_model(tmp_path / "c", Recipe(steps=3, batch=4, seed=1))
    weights = [read_state_dict(d) for d in (a, b, c)]
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])
    assert not all(weights[0][k].equal(weights[2][k]) for k in weights[0])
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert build_default_model(a, short) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp
    # A default model of another recipe is rebuilt in place; a folder of anything else is
    # refused and left as it was.
    assert build_default_model(a, Recipe(steps=4, batch=4)) == a
    assert not read_state_dict(a)["model.norm.weight"].equal(weights[0]["model.norm.weight"])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds something other"):
        build_default_model(foreign, short)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_model_init_copies_the_shipped_build_which_is_the_recipe_s(tmp_path):
    out = swarmrl("model", "init", "--out", tmp_path / "m")
    assert out.stdout == f"{tmp_path / 'm'}\n"
    assert "pre-training" not in out.stderr
    copied = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert copied == sorted(p.name for p in SHIPPED.iterdir())
    assert all((tmp_path / "m" / n).read_bytes() == (SHIPPED / n).read_bytes() for n in copied)
    # The shipped build is the default recipe's: change the recipe, the model's shape or
    # its tokenizer, and it must be made again (orchestrator/pretrain.py says how).
    assert json.loads((SHIPPED / RECIPE_FILE).read_text()) == asdict(Recipe())
    one_step = build_default_model(tmp_path / "one", Recipe(steps=1), from_scratch=True)
    for name in copied:
        if name not in ("model.safetensors", RECIPE_FILE):
            assert (one_step / name).read_bytes() == (SHIPPED / name).read_bytes(), name
    shapes = {k: v.shape for k, v in read_state_dict(one_step).items()}
    assert shapes == {k: v.shape for k, v in read_state_dict(SHIPPED).items()}


@pytest.mark.skipif(
    os.environ.get("SWARMRL_MODEL") != "long", reason="long form: SWARMRL_MODEL=long"
)
def test_the_default_recipe_trained_here_does_as_the_shipped_build(tmp_path, held_out):
    # Minutes of one core. The same machine and thread count give the same bytes; another
    # machine's kernels add up in another order, so what must hold is the behaviour the
    # learning tests start from: the held-out reward, the two estimates' difference within
    # about three of its standard errors (96 tasks x 8 samples each, reward ~0.05).
    out = swarmrl("model", "init", "--from-scratch", "--out", tmp_path / "here")
    assert "pre-training" in out.stderr
    here = out.stdout.strip()
    assert abs(held_out_reward(here, held_out) - held_out_reward(SHIPPED, held_out)) <= 0.025


@pytest.mark.slow
def test_the_default_model_solves_some_demo_tasks_but_not_most(default_model):
    backend = TorchBackend(default_model, device="cpu")
    from swarmrl.models.directory import encode_prompt
    from swarmrl.tasks import budget_prompt

    tasks = demo_tasks(32, seed=4242)
    prompts = [encode_prompt(backend.tokenizer, budget_prompt(t.prompt, 128)) for t in tasks]
    completions = backend.generate(
        [p for p in prompts for _ in range(4)],
        SamplingParams(max_tokens=256, temperature=1.0, seed=0),
        prove=False,
    )
    rate = sum(task_reward(tasks[i // 4], c.text) for i, c in enumerate(completions)) / 128
    assert 0.02 <= rate <= 0.5, rate
    # It boxes its answer about as often as its pre-training solutions did (30%): what RL
    # teaches first. The rest say "Answer: ...", which scores nothing.
    boxed = sum("\\boxed{" in c.text for c in completions) / 128
    assert 0.15 <= boxed <= 0.5, boxed
    assert sum("Answer: " in c.text for c in completions) / 128 >= 0.4
    assert sum(c.finish_reason == "eos" for c in completions) > 100  # it learnt to stop


@pytest.fixture
def node_env(tmp_path, deployment, accounts):
    """A node's key in an encrypted keystore and the session chain's deployment file."""
    keys = tmp_path / "keys"
    keystore.save_public(keys, "node", accounts[NODE_A].key, "pw")
    write_deployment(tmp_path / "deployment.json", deployment)
    return {
        **os.environ,
        "SWARMRL_KEYSTORE_DIR": str(keys),
        "SWARMRL_PASSWORD": "pw",
        "SWARMRL_DEPLOYMENT": str(tmp_path / "deployment.json"),
    }


@pytest.mark.slow
def test_generate_signed_then_verify_against_the_validators_tasks(
    default_model, tmp_path, node_env, deployment, accounts
):
    tasks = tmp_path / "tasks.jsonl"
    swarmrl("tasks", "generate", "--n", 4, "--seed", 5, "--out", tasks)
    assert len(read_tasks(tasks)) == 4
    out = tmp_path / "r.parquet"
    made = swarmrl(
        "rollouts", "generate", "--model", default_model, "--tasks", tasks, "--n", 3,
        "--out", out, "--step", 7, "--key", "node", "--seed", 1, env=node_env,
    )  # fmt: skip
    node = accounts[NODE_A].address
    assert made.stdout.strip() == str(out)
    assert "12 rollouts" in made.stderr
    assert f"signed by {node}" in made.stderr
    read = read_rollout_file(out)
    records = read.rollouts
    assert len(records) == 12
    assert {(r.policy_step, r.node, r.run) for r in records} == {(7, node, deployment.run_id)}

    verify = ("rollouts", "verify", out, "--model", default_model, "--tasks", tasks)
    checked = swarmrl(*verify, env=node_env)
    lines = checked.stdout.strip().splitlines()
    assert len(lines) == 14
    assert lines[0].endswith(
        f"signed by {node} for run {deployment.run_id}, step 7: 3 samples per task, "
        "temperature 1, top-p 1, up to 256 tokens"
    )
    assert all(": ok " in line for line in lines[1:-1])
    assert lines[-1].startswith("12 of 12 rollouts accepted, 0 rejected")
    # The assignment, when the validator states it, overrides what the node signed.
    checked = swarmrl(*verify, "--step", 8, env=node_env, check=False)
    assert checked.returncode == 1
    assert "12 rejected" in checked.stdout
    assert "its policy step is 7, not the 8 asked for" in checked.stdout

    def tampered(forged, signer=None, named=None):
        """The file rewritten with ``forged`` records, re-sealed and re-signed by ``signer``
        (whose signature names ``named`` as the node, if given)."""
        signature = read.signature
        if signer is not None:
            domain, _ = run_domain(tmp_path / "deployment.json")
            fields = read.signature.model_dump(exclude={"node", "signature"})
            signature = FileSignature.sign(signer, domain, file_digest(forged), **fields)
            if named is not None:
                signature = signature.model_copy(update={"node": named})
        write_rollouts(forged, out, signature)
        # What `rollouts verify` prints, judged here by the functions it calls (its own
        # output and exit status are checked above): a process per case paid torch's
        # import each time, most of this test's minute.
        read_back = read_file(out, tasks, deployment=tmp_path / "deployment.json")
        judged = judge_file(read_back, default_model)
        assert judged.rejected  # the command would exit 1
        return "\n".join([read_back.header(), *judged.lines(), judged.summary()])

    # The node rewrites a wrong answer's ground truth to its own output and claims the
    # reward, re-seals and re-signs: the validator's own task set says otherwise.
    wrong = next(i for i, r in enumerate(records) if r.task_reward == 0)
    info = json.dumps({"ground_truth": "anything"}, separators=(",", ":"))
    forged = list(records)
    forged[wrong] = (
        records[wrong]
        .model_copy(update={"verification_info": info, "task_reward": 1.0, "reward": 1.0})
        .sealed()
    )
    stdout = tampered(forged, accounts[NODE_A])
    assert "REJECTED  its verification info differs from the task set's" in stdout
    assert "11 of 12 rollouts accepted, 1 rejected" in stdout

    # A record relabelled with another step: re-sealed but not re-signable by anyone
    # else, and the node's own signature still says step 7.
    forged = list(records)
    forged[0] = records[0].model_copy(update={"policy_step": 8}).sealed()
    assert "12 rejected" in tampered(forged)  # the signature no longer covers the file
    stdout = tampered(forged, accounts[NODE_A])
    assert "REJECTED  its policy step is 8, not the 7 asked for" in stdout
    # Another key signs the node's work: as itself, the records are not its; in the
    # node's name, the signature is not the node's.
    stdout = tampered(records, accounts[NODE_B])
    assert f"its node is {node}, not the {accounts[NODE_B].address} asked for" in stdout
    stdout = tampered(records, accounts[NODE_B], named=node)
    assert "BAD SIGNATURE" in stdout
    assert "12 rejected" in stdout

    # One completion copied over its group's siblings.
    forged = list(records)
    for i in (1, 2):
        forged[i] = (
            records[i]
            .model_copy(update={f: getattr(records[0], f) for f in COMPLETION_FIELDS})
            .sealed()
        )
    stdout = tampered(forged, accounts[NODE_A])
    assert "are one completion, which the claimed sampling repeats with probability" in stdout
    assert "9 of 12 rollouts accepted, 3 rejected" in stdout


COMPLETION_FIELDS = (
    "output_ids", "logprobs", "proofs", "finish_reason", "task_reward", "length_penalty", "reward"
)  # fmt: skip


def test_verify_checks_its_own_model_before_blaming_anyone(tmp_path):
    model = random_tiny_model(tmp_path / "m", seed=0)
    tasks = tmp_path / "t.jsonl"
    swarmrl("tasks", "generate", "--n", 2, "--out", tasks)
    out = tmp_path / "r.parquet"
    swarmrl("rollouts", "generate", "--model", model, "--tasks", tasks, "--n", 2,
            "--max-tokens", 8, "--out", out)  # fmt: skip
    verify = ("rollouts", "verify", out, "--model", model, "--tasks", tasks)
    unsigned = swarmrl(*verify, check=False)
    assert unsigned.returncode == 1
    assert unsigned.stderr.startswith("error: the file is unsigned, so it does not say how many")
    assert "4 of 4 rollouts accepted" in swarmrl(*verify, "--n", 2).stdout
    # A damaged tensor in the validator's model: one sentence, and nobody is blamed.
    weights = model / "model.safetensors"
    state = load_file(weights)
    state["model.norm.weight"][3] = float("nan")
    save_file(state, weights, metadata={"format": "pt"})
    broken = swarmrl(*verify, "--n", 2, check=False)
    assert broken.returncode == 1
    assert broken.stderr.count("\n") == 1
    assert broken.stderr.startswith("error: the validator's own model is unusable, so no rollout")
    assert "not finite" in broken.stderr
    assert "REJECTED" not in broken.stdout
    missing = swarmrl("rollouts", "verify", out, "--model", model, check=False)
    assert missing.returncode == 2
    assert "--tasks" in missing.stderr


def test_bad_input_is_one_sentence_and_exit_1(tmp_path):
    model = random_tiny_model(tmp_path / "m", seed=0)
    bad = tmp_path / "r.parquet"
    bad.write_bytes(b"not parquet")
    tasks = tmp_path / "t.jsonl"
    swarmrl("tasks", "generate", "--n", 2, "--out", tasks)
    out = swarmrl("rollouts", "verify", bad, "--model", model, "--tasks", tasks, check=False)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ")
    assert "not a readable rollout file" in out.stderr
    poetry = tmp_path / "poetry.jsonl"
    poetry.write_text(json.dumps({"problem_id": "x", "task_type": "poetry"}) + "\n")
    generate = ("rollouts", "generate", "--out", tmp_path / "o.parquet")
    out = swarmrl(*generate, "--tasks", poetry, "--model", model, check=False)
    assert out.returncode == 1
    assert "row 1" in out.stderr
    generate = (*generate, "--tasks", tasks)
    out = swarmrl(*generate, "--model", model, "--node", "0x12", check=False)
    assert out.returncode == 1
    assert out.stderr.strip() == "error: --node must be a 0x-prefixed 20-byte address, got '0x12'"
    out = swarmrl(*generate, "--model", tmp_path, check=False)
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == f"error: {tmp_path} holds no model.safetensors (is it a model directory?)"
    )
    out = swarmrl(*generate, "--model", tmp_path / "nowhere", check=False)
    assert out.stderr.strip() == f"error: model directory {tmp_path / 'nowhere'} does not exist"
    for targets in ("1_000", "64, 128", "\uff10"):
        out = swarmrl(*generate, "--model", model, "--targets", targets, check=False)
        assert out.stderr.startswith("error: --targets must be comma-separated token counts")
    out = swarmrl(*generate, "--model", model, "--top-p", "0", check=False)
    assert out.stderr.strip() == "error: --top-p must be in (0, 1], got 0.0"
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.slow
def test_filter_keeps_tasks_in_the_solve_rate_band(default_model, tmp_path):
    tasks = tmp_path / "tasks.parquet"
    swarmrl("tasks", "generate", "--n", 8, "--seed", 11, "--out", tasks)
    kept = tmp_path / "kept.parquet"
    out = swarmrl(
        "tasks", "filter", "--model", default_model, "--tasks", tasks, "--out", kept,
        "--k", 4, "--min", 0.25, "--max", 0.75,
    )  # fmt: skip
    rates = pq.read_table(kept).column("solve_rate").to_pylist()
    assert all(0.25 <= r <= 0.75 for r in rates)
    assert f"kept {len(rates)} of 8 tasks" in out.stderr
