"""The daemons' settings: TOML file and SWARMRL_* environment over defaults, every bad
value one sentence naming the key and where it came from, and templates that load back
to the defaults."""

import os
import re
import tomllib
from pathlib import Path

import pytest

from client.node.settings import NodeSettings
from orchestrator.service.settings import OrchestratorSettings
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.settings_toml import load_settings, reference_markdown, template, write_settings

PEER = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No SWARMRL_* of the machine running the tests, and data under a fresh home."""
    for name in list(os.environ):
        if name.upper().startswith("SWARMRL_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def write(tmp_path, text, name="orchestrator.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def refusal(model_cls, path):
    with pytest.raises(ValueError, match=r".") as caught:
        load_settings(model_cls, path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_defaults_load_without_a_file(tmp_path):
    settings = load_settings(OrchestratorSettings, None)
    share = tmp_path / "home" / ".local" / "share" / "swarmrl"
    assert settings.data_dir == share / "orchestrator"
    assert settings.model == share / "models" / "default"
    assert settings.keystore_dir == share / "keystore"
    assert settings.deployment == share / "chain" / "deployment.json"
    assert settings.group_size == 8
    assert settings.listen == "/ip4/127.0.0.1/tcp/4001"
    assert settings.recorder_key == "recorder"

    node = load_settings(NodeSettings, None)
    assert node.data_dir == share / "node"
    assert node.orchestrator is None
    assert node.bootstrap == []
    assert node.metrics_port == 9465


def test_the_file_overrides_defaults(tmp_path, monkeypatch):
    path = write(
        tmp_path,
        'group_size = 4\nrecorder_key = "coordinator"\ndata_dir = "state"\n'
        'model = "~/models/mine"\nvalidation_rate = 1\n',
    )
    monkeypatch.chdir(tmp_path / "..")  # relative paths are the file's, not the cwd's
    settings = load_settings(OrchestratorSettings, path)
    assert settings.group_size == 4
    assert settings.validation_rate == 1.0
    assert settings.recorder_key == "coordinator"
    assert settings.data_dir == tmp_path / "state"
    assert settings.model == tmp_path / "home" / "models" / "mine"
    assert settings.prompts_per_step == 16  # untouched keys keep their defaults


def test_the_environment_overrides_the_file(tmp_path, monkeypatch):
    path = write(tmp_path, "group_size = 4\nsteps = 7\n")
    monkeypatch.setenv("swarmrl_group_size", "6")  # any case
    monkeypatch.setenv("SWARMRL_RECORDER_KEY", "origin")
    settings = load_settings(OrchestratorSettings, path)
    assert (settings.group_size, settings.steps, settings.recorder_key) == (6, 7, "origin")

    monkeypatch.setenv("SWARMRL_BOOTSTRAP", f"{PEER}, {PEER.replace('4001', '4002')}")
    node = load_settings(NodeSettings, write(tmp_path, 'bootstrap = ["/dns4/x/tcp/1"]\n'))
    assert node.bootstrap == [PEER, PEER.replace("4001", "4002")]


def test_an_unknown_key_is_named(tmp_path):
    path = write(tmp_path, "gruop_size = 3\n")
    assert refusal(OrchestratorSettings, path) == (
        f"{path}: unknown key 'gruop_size' (did you mean group_size?)"
    )
    path = write(tmp_path, "[trainer]\nlr = 0.1\n")
    assert refusal(OrchestratorSettings, path) == f"{path}: unknown key 'trainer'"
    path = write(tmp_path, "model = 'x'\n", name="node.toml")
    assert refusal(NodeSettings, path) == f"{path}: unknown key 'model'"


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ('group_size = "eight"', 'group_size must be a whole number, got "eight"'),
        ("group_size = 2.5", "group_size must be a whole number, got 2.5"),
        ("group_size = true", "group_size must be a number, got true"),
        ("group_size = [8]", "group_size must be a whole number, got [8]"),
        ("lr = {a = 1}", "lr must be a finite number, got a table"),
        ("model = 3", "model must be a path, got 3"),
        ('model = ""', 'model must not be empty, got ""'),
        ('advantage_scale = "z"', 'advantage_scale must be one of none or std, got "z"'),
        ('listen = "localhost:4001"', "listen must be a multiaddr like /ip4/127.0.0.1/tcp/4001"),
    ],
)
def test_a_wrong_type_is_one_sentence_naming_the_key(tmp_path, text, sentence):
    path = write(tmp_path, text + "\n")
    assert refusal(OrchestratorSettings, path).startswith(f"{path}: {sentence}")


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("group_size = 1", "group_size must be at least 2, got 1"),
        ("validation_rate = 1.5", "validation_rate must be at most 1, got 1.5"),
        ("code_check_rate = -0.1", "code_check_rate must be at least 0, got -0.1"),
        ("metrics_port = 70000", "metrics_port must be at most 65535, got 70000"),
        ("heartbeat_seconds = 0", "heartbeat_seconds must be more than 0, got 0"),
        ("temperature = inf", "temperature must be a finite number, got inf"),
        ("seed = 4294967296", "seed must be at most 4294967295, got 4294967296"),
        ("eps_high = 4", "delta must be at least 1 + eps_high = 5, got 4"),
        (
            "gone_after = 30",
            "gone_after must be more than silent_after x heartbeat_seconds = 30 seconds, got 30",
        ),
    ],
)
def test_an_out_of_range_value_is_one_sentence_naming_the_key(tmp_path, text, sentence):
    path = write(tmp_path, text + "\n")
    assert refusal(OrchestratorSettings, path) == f"{path}: {sentence}"


def test_a_bad_value_from_the_environment_names_the_variable(tmp_path, monkeypatch):
    path = write(tmp_path, "group_size = 4\n")
    monkeypatch.setenv("SWARMRL_GROUP_SIZE", "1")
    assert refusal(OrchestratorSettings, path) == (
        "SWARMRL_GROUP_SIZE: group_size must be at least 2, got 1"
    )
    monkeypatch.setenv("SWARMRL_GROUP_SIZE", "")
    assert refusal(OrchestratorSettings, None) == (
        "SWARMRL_GROUP_SIZE: group_size must be a whole number, got an empty value"
    )
    monkeypatch.delenv("SWARMRL_GROUP_SIZE")
    # A rule between keys names the one the user set.
    monkeypatch.setenv("SWARMRL_HEARTBEAT_SECONDS", "100")
    assert refusal(OrchestratorSettings, path).startswith(
        "SWARMRL_HEARTBEAT_SECONDS: gone_after must be more than"
    )


def test_node_addresses_are_checked(tmp_path, monkeypatch):
    path = write(tmp_path, 'orchestrator = "/ip4/127.0.0.1/tcp/4001"\n', name="node.toml")
    assert refusal(NodeSettings, path) == (
        f"{path}: orchestrator must be a multiaddr that ends in /p2p/<peer id>, "
        'got "/ip4/127.0.0.1/tcp/4001"'
    )
    monkeypatch.setenv("SWARMRL_BOOTSTRAP", f"{PEER},/ip4/127.0.0.1/tcp/9")
    assert refusal(NodeSettings, None) == (
        "SWARMRL_BOOTSTRAP: bootstrap '/ip4/127.0.0.1/tcp/9' must be a multiaddr "
        "that ends in /p2p/<peer id>"
    )
    monkeypatch.delenv("SWARMRL_BOOTSTRAP")
    path = write(tmp_path, f'orchestrator = "{PEER}"\nlisten = "none"\n', name="node.toml")
    node = load_settings(NodeSettings, path)
    assert (node.orchestrator, node.listen) == (PEER, "none")
    path = write(tmp_path, 'device = "gpu"\n', name="node.toml")
    assert refusal(NodeSettings, path) == (
        f'{path}: device must be auto, cpu, mps, cuda or cuda:N, got "gpu"'
    )


def test_a_toml_syntax_error_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "group_size = 8\nsteps = = 3\n")
    assert refusal(OrchestratorSettings, path).startswith(f"{path}, line 2: ")
    path = write(tmp_path, "steps = 3\nsteps = 4")
    assert refusal(OrchestratorSettings, path).startswith(f"{path}, line 2: ")


def test_a_missing_or_unreadable_file_says_so(tmp_path):
    assert refusal(OrchestratorSettings, tmp_path / "nope.toml") == (
        f"{tmp_path / 'nope.toml'} does not exist"
    )
    assert refusal(OrchestratorSettings, tmp_path) == f"{tmp_path} is a directory; give a file"
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert refusal(OrchestratorSettings, binary) == f"{binary} is not UTF-8 text"


@pytest.mark.parametrize("model_cls", [OrchestratorSettings, NodeSettings])
def test_the_template_loads_back_to_the_defaults(tmp_path, model_cls):
    text = template(model_cls)
    assert 'data_dir = "~/.local/share/swarmrl/' in text  # portable, and the user's home
    path = write(tmp_path, text, name="settings.toml")
    assert load_settings(model_cls, path) == load_settings(model_cls, None)
    # Every key is in it, with its help; unset keys commented out.
    active = tomllib.loads(text)
    commented = set(re.findall(r"^# (\w+) = ", text, re.MULTILINE))
    assert set(model_cls.model_fields) <= set(active) | commented
    for key, field in model_cls.model_fields.items():
        assert field.description, key
        assert field.description.split()[0] in text


def test_a_template_with_an_unusual_home_loads_back(tmp_path, monkeypatch):
    home = tmp_path / 'we"ird \\ home\t'
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data\x7f"))  # outside home: absolute
    text = template(OrchestratorSettings)
    path = write(tmp_path, text)
    assert load_settings(OrchestratorSettings, path) == load_settings(OrchestratorSettings, None)


def test_the_reference_has_a_row_per_key():
    table = reference_markdown(NodeSettings).splitlines()
    assert table[0] == "| key | default | description |"
    assert len(table) == 2 + len(NodeSettings.model_fields)
    assert any(row.startswith('| `listen` | `"/ip4/127.0.0.1/tcp/0"` |') for row in table)
    assert any(row.startswith("| `orchestrator` | unset |") for row in table)


def test_trainer_settings_are_the_trainer_s_knobs(tmp_path):
    # Every knob of the trainer is a key, with the trainer's own default.
    defaults = OrchestratorSettings.model_fields
    for name, field in GRPORecipe.model_fields.items():
        assert defaults[name].default == field.default, name

    path = write(tmp_path, "lr = 0.0003\ngroup_size = 4\nkl_coef = 0.01\nsteps = 9\n")
    trainer = load_settings(OrchestratorSettings, path).recipe()
    assert type(trainer) is GRPORecipe
    assert (trainer.lr, trainer.group_size, trainer.kl_coef, trainer.steps) == (
        0.0003,
        4,
        0.01,
        9,
    )
    assert trainer.loss_config().normalizer == 16 * 4 * 128


# -- writing: a path means the same folder once the file is read back -----------------


def test_a_written_path_is_the_writers_folder_wherever_the_file_is_read(tmp_path, monkeypatch):
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    given = {"key": "node2", "tasks": Path("tasks.jsonl"), "keystore_dir": "keys"}
    write_settings(Path("conf/node.toml"), given, template_of=NodeSettings)
    write_settings(Path("bare.toml"), {"tasks": Path("../tasks.jsonl"), "threads": 1})
    monkeypatch.chdir(tmp_path)  # read from elsewhere: the file's folder is "conf"
    node = load_settings(NodeSettings, caller / "conf" / "node.toml")
    assert (node.key, node.tasks, node.keystore_dir) == (
        "node2",
        caller / "tasks.jsonl",
        caller / "keys",
    )
    bare = load_settings(NodeSettings, caller / "bare.toml")
    assert (bare.tasks.resolve(), bare.threads) == (tmp_path / "tasks.jsonl", 1)


def test_a_template_with_values_keeps_every_key_and_refuses_an_unknown_one(tmp_path):
    text = template(NodeSettings, {"key": "node2", "password_file": None})
    assert 'key = "node2"' in text
    assert "# password_file = " in text  # None: left at its default (unset)
    loaded = load_settings(NodeSettings, write(tmp_path, text, name="node.toml"))
    assert loaded == load_settings(NodeSettings, None).model_copy(update={"key": "node2"})
    with pytest.raises(ValueError, match="NodeSettings has no key 'model'"):
        template(NodeSettings, {"model": "x"})


def test_the_swarms_config_writers_keep_relative_paths_the_callers(tmp_path, monkeypatch):
    """The demo's default `--out demo` reached orchestrator.toml as demo/run/...: read
    back against the file's folder it named demo/run/demo/run/train.jsonl."""
    from simulation.local_swarm import Swarm, node_toml, orchestrator_toml

    monkeypatch.chdir(tmp_path)
    work = Path("demo/run")
    work.mkdir(parents=True)
    swarm = Swarm(
        root=work,
        anvil=None,
        deployment=None,
        deployment_file=work / "deployment.json",
        keystore_dir=work / "keys",
        password_file=work / "password",
    )
    orch = orchestrator_toml(
        swarm,
        work / "orchestrator.toml",
        model=Path("models/default"),
        tasks=work / "train.jsonl",
        data_dir=work / "orchestrator",
        lr=3e-4,
    )
    node = node_toml(swarm, work / "node4.toml", key="node4", tasks=work / "train.jsonl",
                     orchestrator=PEER)  # fmt: skip
    monkeypatch.chdir("/")
    settings = load_settings(OrchestratorSettings, tmp_path / orch)
    run = tmp_path / "demo" / "run"
    assert (settings.tasks, settings.data_dir, settings.model) == (
        run / "train.jsonl",
        run / "orchestrator",
        tmp_path / "models" / "default",
    )
    assert (settings.deployment, settings.keystore_dir, settings.password_file) == (
        run / "deployment.json",
        run / "keys",
        run / "password",
    )
    assert settings.lr == 3e-4
    node_settings = load_settings(NodeSettings, tmp_path / node)
    assert (node_settings.data_dir, node_settings.tasks) == (run / "node4", run / "train.jsonl")


# -- $SWARMRL_DATA_DIR: one base, a folder per daemon ---------------------------------


def test_the_data_dir_variable_gives_each_daemon_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWARMRL_DATA_DIR", "shared")  # relative: the working directory's
    orchestrator = load_settings(OrchestratorSettings, None)
    node = load_settings(NodeSettings, None)
    assert orchestrator.data_dir == tmp_path / "shared" / "orchestrator"
    assert node.data_dir == tmp_path / "shared" / "node"
    assert orchestrator.tasks == tmp_path / "shared" / "orchestrator" / "tasks.jsonl"
    # The file's data_dir is the daemon's own: the variable only moves the default.
    path = write(tmp_path, 'data_dir = "/srv/node"\n', name="node.toml")
    assert load_settings(NodeSettings, path).data_dir == Path("/srv/node")
    assert f'data_dir = "{tmp_path}/shared/node"' in template(NodeSettings)


# -- location variables: where things live, moving defaults only ---------------------


@pytest.mark.parametrize(
    ("model_cls", "name"),
    [(NodeSettings, "node.toml"), (OrchestratorSettings, "orchestrator.toml")],
)
@pytest.mark.parametrize(
    ("key", "variable"),
    [("keystore_dir", "SWARMRL_KEYSTORE_DIR"), ("deployment", "SWARMRL_DEPLOYMENT")],
)
def test_a_files_location_key_wins_over_its_variable(
    tmp_path, monkeypatch, model_cls, name, key, variable
):
    # Exported in the shell for the wallet and chain commands, the variable moves the
    # default only: the file's own key is the daemon's.
    monkeypatch.setenv(variable, "/from/the/shell")
    path = write(tmp_path, f'{key} = "mine"\n', name=name)
    settings = load_settings(model_cls, path)
    assert getattr(settings, key) == tmp_path / "mine"
    assert str(settings.setting_error(key, "it is wrong")) == (
        f"{key}: it is wrong (set {key} in {path})"
    )
    # Where the file does not set the key, the variable is its default.
    assert getattr(load_settings(model_cls, write(tmp_path, "", name=name)), key) == Path(
        "/from/the/shell"
    )
    assert getattr(load_settings(model_cls, None), key) == Path("/from/the/shell")
    assert f'{key} = "/from/the/shell"' in template(model_cls)


def test_the_template_says_which_variables_override_it_and_which_move_defaults():
    location = [
        "#   $SWARMRL_DATA_DIR moves data_dir: a folder holding one per daemon "
        "(node/, orchestrator/)",
        "#   $SWARMRL_DEPLOYMENT moves deployment: the deployment file every command reads",
        "#   $SWARMRL_KEYSTORE_DIR moves keystore_dir: the keystore folder of every command",
    ]
    for model_cls in (NodeSettings, OrchestratorSettings):
        header = template(model_cls).split("\n\n")[0].split("#\n")[-1].splitlines()
        assert header == [
            "# Every key is optional; SWARMRL_<KEY> in the environment overrides this file, except",
            "# these variables, which say where things live for every swarmrl command: each only",
            "# moves the default of its key, and the key set in this file wins over it.",
            *location,
            "# Relative paths are relative to the folder of this file.",
        ]


# -- a value refused after loading: the key, and where to change it --------------------


def test_a_refused_value_names_its_key_and_where_it_was_set(tmp_path, monkeypatch):
    path = write(tmp_path, 'tasks = "t.jsonl"\n')
    settings = load_settings(OrchestratorSettings, path)
    about_tasks = settings.about("tasks", "make it")
    with pytest.raises(ValueError, match=r"^tasks: ") as refused, about_tasks:
        raise ValueError(f"{settings.tasks} does not exist")
    assert str(refused.value) == (
        f"tasks: {tmp_path}/t.jsonl does not exist (set tasks in {path}, or make it)"
    )
    monkeypatch.setenv("swarmrl_tasks", "/x.jsonl")
    settings = load_settings(OrchestratorSettings, path)
    assert str(settings.setting_error("tasks", "/x.jsonl does not exist")) == (
        "tasks: /x.jsonl does not exist (change $swarmrl_tasks)"
    )
    settings = load_settings(NodeSettings, None)
    assert str(settings.setting_error("data_dir", "/x exists and is not a folder")) == (
        "data_dir: /x exists and is not a folder (set data_dir in the config file (--config))"
    )
