"""Cluster configuration: the minimal file works, every fault is one clear line."""
import subprocess
import sys

import pytest

from llft.runtime import config
from llft.runtime.keys import write_key

MINIMAL = """[cluster]
key_file = "cluster.key"
interface = "127.0.0.1"
[group.counter]
address = "239.255.0.1:47000"
service_port = 9000
"""


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_minimal_file_has_sound_defaults(tmp_path):
    cfg = config.load(write(tmp_path, MINIMAL))
    g = cfg.group("counter")
    assert (g.address.mcast_addr, g.address.port, g.service_port) == ("239.255.0.1", 47000, 9000)
    assert (g.gateway_address.mcast_addr, g.gateway_address.port) == ("239.255.0.1", 47001)
    assert cfg.key_file == str(tmp_path / "cluster.key")     # relative to the file
    gm = cfg.group_map()
    # every gateway of the group, whatever its instance, at the gateway address
    assert gm.address(g.gateway_group("0123456789abcdef")).port == 47001
    assert gm.address(g.gateway_group("fedcba9876543210")).port == 47001
    assert gm.address("counter").port == 47000
    assert cfg.heartbeat_ms == 20 and cfg.fault_timeout_ms == 100
    # the heartbeat follows the timeout unless it is set
    short = config.load(write(tmp_path, MINIMAL.replace(
        "[cluster]", "[cluster]\nfault_timeout_ms = 25"), "s.toml"))
    assert short.heartbeat_ms == 5
    both = config.load(write(tmp_path, MINIMAL.replace(
        "[cluster]", "[cluster]\nfault_timeout_ms = 25\nheartbeat_ms = 2"), "h.toml"))
    assert both.heartbeat_ms == 2
    # a silent remote group is gone after 3 s, messaging's default, unless set
    assert cfg.remote_timeout_ms == 3000
    assert cfg.messaging_config(1400).remote_timeout_us == 3_000_000
    # ... for gateways only: a replicated group's backup takes over, however long
    assert cfg.messaging_config(1400).lone_groups == ("counter.gateway.",)
    # a message's order info fills its datagram beside a full payload, 16 KB at least
    loop, eth = cfg.messaging_config(65507), cfg.messaging_config(1500)
    assert loop.max_payload_bytes == 8192 and loop.max_piggyback_bytes == 65507 - 8192 - 1024
    assert eth.max_piggyback_bytes == 16 << 10
    slow = config.load(write(tmp_path, MINIMAL.replace(
        "[cluster]", "[cluster]\nremote_timeout_ms = 10000"), "r.toml"))
    assert slow.messaging_config(1400).remote_timeout_us == 10_000_000
    # the gRPC relay's port: the same at every replica, outside the ephemeral range
    assert g.grpc_relay_port == config.GroupConfig.default_relay_port("counter")
    assert 20000 <= g.grpc_relay_port < 30000
    named = config.load(write(tmp_path, MINIMAL + "grpc_relay_port = 12345\n", "b.toml"))
    assert named.group("counter").grpc_relay_port == 12345
    # a primary stopped while its successor replays serves on at most this long
    assert cfg.handoff_wait_s == 60
    quick = config.load(write(tmp_path, MINIMAL.replace(
        "[cluster]", "[cluster]\nhandoff_wait_s = 0"), "q.toml"))
    assert quick.handoff_wait_s == 0


@pytest.mark.parametrize("text, words", [
    ("", "missing [cluster]"),
    ("[cluster]\ninterface='127.0.0.1'\n[group.a]\naddress='239.1.1.1:5'\nservice_port=1\n",
     "key_file is required"),
    ("[cluster]\nkey_file='k'\n", "no group"),
    ("[cluster]\nkey_file='k'\n[group.a]\nservice_port=1\n", "address is required"),
    ("[cluster]\nkey_file='k'\n[group.a]\naddress='239.1.1.1:5'\n", "service_port is required"),
    ("[cluster]\nkey_file='k'\n[group.a]\naddress='10.0.0.1:5'\nservice_port=1\n",
     "not an IPv4 multicast"),
    ("[cluster]\nkey_file='k'\n[group.a]\naddress='239.1.1.1'\nservice_port=1\n",
     "expected \"MCAST_IP:PORT\""),
    ("[cluster]\nkey_file='k'\n[group.a]\naddress='239.1.1.1:5'\nservice_port=70000\n",
     "outside"),
    ("[cluster]\nkey_file='k'\nbogus=1\n[group.a]\naddress='239.1.1.1:5'\nservice_port=1\n",
     "unknown setting"),
    ("[cluster]\nkey_file='k'\ninterface='nope'\n[group.a]\naddress='239.1.1.1:5'\nservice_port=1\n",
     "interface"),
    ("[cluster]\nkey_file='k'\n[group.a]\naddress='239.1.1.1:5'\nservice_port=1\n"
     "[group.b]\naddress='239.1.1.1:6'\nservice_port=2\n", "also"),
    ("[cluster\n", "not valid TOML"),
    ("[cluster]\nkey_file='k'\nremote_timeout_ms=400\n[group.a]\naddress='239.1.1.1:5'\n"
     "service_port=1\n", "remote_timeout_ms = 400 is outside"),
    ("[cluster]\nkey_file='k'\n[group.a]\naddress='239.1.1.1:5'\nservice_port=1\n"
     "grpc_relay_port=0\n", "grpc_relay_port"),
    ("[cluster]\nkey_file='k'\nhandoff_wait_s=-1\n[group.a]\naddress='239.1.1.1:5'\n"
     "service_port=1\n", "handoff_wait_s = -1 is outside"),
])
def test_faults_are_one_line(tmp_path, text, words):
    with pytest.raises(config.ConfigError) as e:
        config.load(write(tmp_path, text))
    msg = str(e.value)
    assert words in msg and "\n" not in msg


def test_missing_file_and_unknown_group(tmp_path):
    with pytest.raises(config.ConfigError, match="no such configuration file"):
        config.load(str(tmp_path / "nope.toml"))
    cfg = config.load(write(tmp_path, MINIMAL))
    with pytest.raises(config.ConfigError, match=r"no \[group.other\] section"):
        cfg.group("other")
    with pytest.raises(config.ConfigError, match="key_file"):
        cfg.load_key()                 # the key file does not exist yet
    write_key(str(tmp_path / "cluster.key"))
    assert len(cfg.load_key()) == 32


@pytest.mark.parametrize("cmd", ["run", "status", "gateway"])
def test_commands_exit_2_with_one_line(tmp_path, cmd):
    path = write(tmp_path, MINIMAL.replace("9000", "'x'"))
    argv = [sys.executable, "-m", "llft", cmd, "--config", path, "--group", "counter"]
    argv += {"run": ["--", "true"], "gateway": ["--listen", "127.0.0.1:0"], "status": []}[cmd]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "service_port must be an integer" in lines[0], r.stderr
