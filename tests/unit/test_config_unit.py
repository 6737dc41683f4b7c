"""mqttmesh.config: TOML loading, checks with useful messages, flags over TOML, the reference."""

from __future__ import annotations

import argparse

import pytest

from mqttmesh.auth import ConfigError
from mqttmesh.config import OPTIONS, add_flags, load_config, overrides_from_args, reference_markdown


@pytest.fixture
def toml(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "node.toml"
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


def error_of(path=None, overrides=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def test_defaults():
    cfg = load_config()
    assert cfg.port == 1883
    assert cfg.host == "127.0.0.1"
    assert cfg.get("limits.max_inflight") == 100
    assert cfg.get("limits.max_queued") == 10_000
    assert cfg.get("limits.queue_qos0") is False
    assert cfg.get("limits.drop_policy") == "oldest"
    assert cfg.get("limits.max_packet_size") == 1024 * 1024
    assert cfg.get("auth.allow_anonymous") is True
    assert cfg.get("store.synchronous") == "normal"
    with pytest.raises(AttributeError):
        _ = cfg.no_such_option


def test_every_default_passes_its_own_checks():
    load_config(None, {o.name: o.default for o in OPTIONS})


def test_load_toml(toml):
    cfg = load_config(
        toml(
            'port = 1999\nnode_id = "n7"\n\n[limits]\nmax_inflight = 5\nqueue_qos0 = true\n'
            'drop_policy = "newest"\nconnect_timeout = 2\n\n[auth]\nallow_anonymous = false\n'
        )
    )
    assert cfg.port == 1999
    assert cfg.node_id == "n7"
    assert cfg.get("limits.max_inflight") == 5
    assert cfg.get("limits.queue_qos0") is True
    assert cfg.get("limits.drop_policy") == "newest"
    assert cfg.get("limits.connect_timeout") == 2.0
    assert isinstance(cfg.get("limits.connect_timeout"), float)
    assert cfg.get("auth.allow_anonymous") is False
    assert cfg.as_dict()["port"] == 1999


def test_missing_file_names_it(tmp_path):
    path = str(tmp_path / "missing.toml")
    assert path in error_of(path)


def test_toml_syntax_error_mentions_the_line(toml):
    path = toml("port = 1\n# fine\nhost = \n")
    message = error_of(path)
    assert path in message
    assert "line 3" in message


@pytest.mark.parametrize(
    "text, names, hint",
    [
        ("max_inflight = 5\n", "'max_inflight'", "limits.max_inflight"),  # right key, wrong section
        ("[limits]\nport = 5\n", "'limits.port'", "'port'"),
        ("[auth]\nmax_qos = 1\n", "'auth.max_qos'", "limits.max_qos"),
        ("[limits]\nmax_inflite = 5\n", "'limits.max_inflite'", None),
        ("prot = 5\n", "'prot'", None),
        ("[limit]\nmax_inflight = 5\n", "'limit", None),
        ("limits = 5\n", "'limits'", None),
    ],
)
def test_unknown_key_names_it_and_suggests_the_section(toml, text, names, hint):
    path = toml(text)
    message = error_of(path)
    assert path in message
    assert "unknown" in message
    assert names in message
    if hint is not None:
        assert hint in message


@pytest.mark.parametrize(
    "text, key, problem",
    [
        ('port = "abc"\n', "port", "integer"),
        ("port = 1.5\n", "port", "integer"),
        ("port = true\n", "port", "integer"),
        ("port = [1]\n", "port", "integer"),
        ("host = 5\n", "host", "string"),
        ("[limits]\nqueue_qos0 = 3\n", "limits.queue_qos0", "true or false"),
        ('[limits]\nqueue_qos0 = "maybe"\n', "limits.queue_qos0", "true or false"),
        ('[limits]\nconnect_timeout = "soon"\n', "limits.connect_timeout", "number"),
        ("[limits]\nconnect_timeout = true\n", "limits.connect_timeout", "number"),
    ],
)
def test_wrong_type_names_key_and_problem(toml, text, key, problem):
    path = toml(text)
    message = error_of(path)
    assert path in message
    assert key in message
    assert problem in message


@pytest.mark.parametrize(
    "text, key, problem",
    [
        ("port = 65536\n", "port", "maximum 65535"),
        ("port = -1\n", "port", "minimum 0"),
        ("[limits]\nmax_inflight = 0\n", "limits.max_inflight", "minimum 1"),
        ("[limits]\nmax_inflight = 65536\n", "limits.max_inflight", "maximum 65535"),
        ("[limits]\nmax_qos = 3\n", "limits.max_qos", "maximum 2"),
        ("[limits]\nconnect_timeout = 0.05\n", "limits.connect_timeout", "minimum 0.1"),
        ("[limits]\nmax_client_id_length = 22\n", "limits.max_client_id_length", "minimum 23"),  # [MQTT-3.1.3-5]
        ("[limits]\nmax_packet_size = 15\n", "limits.max_packet_size", "minimum 16"),
        pytest.param(
            "[limits]\nmax_packet_size = 300000000\n", "limits.max_packet_size", "268435460", id="max_packet_size-above"
        ),
        pytest.param("[limits]\nmax_queued = 200000000\n", "limits.max_queued", "100000000", id="max_queued-above"),
    ],
)
def test_out_of_range_names_key_and_limit(toml, text, key, problem):
    message = error_of(toml(text))
    assert key in message
    assert problem in message


@pytest.mark.parametrize(
    "text, key",
    [
        ("[limits]\nconnect_timeout = nan\n", "limits.connect_timeout"),
        ("[limits]\nconnection_rate = nan\n", "limits.connection_rate"),
    ],
)
def test_nan_is_refused(toml, text, key):
    assert key in error_of(toml(text))


@pytest.mark.parametrize(
    "text, key, value",
    [
        ('log_level = "verbose"\n', "log_level", "'verbose'"),
        ('[limits]\ndrop_policy = "random"\n', "limits.drop_policy", "'random'"),
        ('[store]\nsynchronous = "off"\n', "store.synchronous", "'off'"),
    ],
)
def test_choices(toml, text, key, value):
    message = error_of(toml(text))
    assert key in message
    assert value in message
    assert "one of" in message


def test_flags_override_toml(toml):
    path = toml("port = 1000\n[limits]\nmax_inflight = 5\nmax_queued = 7\n")
    cfg = load_config(path, {"port": "2000", "limits.max_inflight": 9, "limits.max_queued": None})
    assert cfg.port == 2000
    assert cfg.get("limits.max_inflight") == 9
    assert cfg.get("limits.max_queued") == 7  # None: the flag was not given


def test_flags_through_argparse(toml):
    path = toml("port = 1000\n[limits]\nmax_inflight = 5\nqueue_qos0 = false\n")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(
        ["--config", path, "--port", "2001", "--max-inflight", "8", "--queue-qos0", "yes", "--drop-policy", "newest"]
    )
    cfg = load_config(args.config, overrides_from_args(args))
    assert cfg.port == 2001
    assert cfg.get("limits.max_inflight") == 8
    assert cfg.get("limits.queue_qos0") is True
    assert cfg.get("limits.drop_policy") == "newest"


@pytest.mark.parametrize(
    "overrides, names",
    [
        ({"port": "many"}, "--port"),
        ({"port": "70000"}, "--port"),
        ({"limits.queue_qos0": "perhaps"}, "--queue-qos0"),
        ({"limits.max_inflight": "0"}, "--max-inflight"),
        ({"nonsense": 1}, "nonsense"),
    ],
)
def test_bad_flag_names_it(overrides, names):
    assert names in error_of(None, overrides)


@pytest.mark.parametrize(
    "word, value",
    [
        ("true", True),
        ("false", False),
        ("1", True),
        ("0", False),
        ("yes", True),
        ("no", False),
        ("on", True),
        ("off", False),
        ("TRUE", True),
    ],
)
def test_bool_flag_words(word, value):
    assert load_config(None, {"limits.queue_qos0": word}).get("limits.queue_qos0") is value


EXPECTED_OPTIONS = [
    "host",
    "port",
    "mqtt.max_keepalive",
    "mqtt.receive_maximum",
    "mqtt.topic_alias_maximum",
    "mqtt.subscribe_denied_code",
    "mqtt.response_information",
    "node_id",
    "data_dir",
    "log_level",
    "port_file",
    "limits.max_packet_size",
    "limits.max_inflight",
    "limits.max_queued",
    "limits.queue_qos0",
    "limits.drop_policy",
    "limits.max_awaiting_rel",
    "limits.max_connections",
    "limits.connection_rate",
    "limits.max_client_id_length",
    "limits.connect_timeout",
    "limits.max_write_buffer",
    "limits.max_qos",
    "auth.allow_anonymous",
    "auth.password_file",
    "auth.acl_file",
    "store.synchronous",
    "sys.interval",
]


def test_reference_markdown_lists_every_option():
    ref = reference_markdown()
    rows = [line for line in ref.splitlines() if line.startswith("| `")]
    names = [row.split("`")[1] for row in rows]
    for name in EXPECTED_OPTIONS:  # a fixed list, so removing an option is noticed too
        assert name in names, name
    assert sorted(names) == sorted(o.name for o in OPTIONS)
    assert len(names) == len(set(names))
    for o in OPTIONS:
        row = rows[names.index(o.name)]
        assert f"`{o.flag}`" in row
        assert o.help in row
        for choice in o.choices or ():
            assert str(choice) in row
    assert "| `port` | `--port` | `1883` |" in ref
    assert "| `limits.queue_qos0` | `--queue-qos0` | `false` |" in ref
