"""Node configuration files: every class of mistake is reported, with its key path,
all at once; a valid file builds and provisions the node it describes."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from meshbus import (
    DEFAULT_PLUGINS,
    AclAction,
    AclProfile,
    AuthenticationError,
    ClientProfile,
    ConfigurationError,
    StateError,
    available_plugins,
)
from meshbus.app._config import NodeConfig, VpnConfig, default_config, load_config, parse_config
from meshbus.plugins.guaranteed import AccessType, QueueSettings
from meshbus.transports._settings import ListenerSettings

#: What the unknown-plugin problems list as installed (every plugin entry point).
INSTALLED = ", ".join(sorted(available_plugins()))

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "edge-node.toml"

Problems = Callable[..., list[str]]


@pytest.fixture
def problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Problems:
    """Write ``edge.toml`` in a fresh current folder, load it, return its problems."""
    monkeypatch.chdir(tmp_path)

    def check(text: str, environ: Mapping[str, str] | None = None) -> list[str]:
        Path("edge.toml").write_text(text, encoding="utf-8")
        with pytest.raises(ConfigurationError) as info:
            load_config("edge.toml", environ=environ or {})
        count = len(info.value.problems)
        assert str(info.value) == (
            f"invalid configuration edge.toml: {count} problem{'' if count == 1 else 's'}"
        )
        return info.value.problems

    return check


def example_environ(certs: Path) -> dict[str, str]:
    return {
        "EDGE_CERTS": str(certs),
        "EDGE_OPERATOR_PASSWORD": "operator-secret",
        "EDGE_SENSOR_PASSWORD": "sensor-secret",
    }


# --- one test per class of mistake ------------------------------------------------------


def test_toml_syntax_error_names_line_and_column(problems: Problems) -> None:
    assert problems('[node]\nname = "edge-1"\n[vpns.default\n') == [
        "edge.toml: line 3, column 14: invalid TOML: Expected ']' at the end of a table declaration"
    ]
    assert problems('[node]\nname = "a"\nname = "b"\n') == [
        "edge.toml: line 3, column 11: invalid TOML: Cannot overwrite a value"
    ]


def test_unreadable_file_is_one_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as info:
        load_config("missing.toml")
    assert info.value.problems == ["missing.toml: cannot read the file: No such file or directory"]
    Path("latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ConfigurationError) as info:
        load_config("latin1.toml")
    assert info.value.problems[0].startswith("latin1.toml: not UTF-8 text: ")


def test_unknown_key_suggests_the_close_one(problems: Problems) -> None:
    text = """
        [node]
        nmae = "edge-1"
        colour = "blue"
        [[listener]]
        port = 1
        [vpns.default.client_profiles.gold]
        egress_max_mesages = 5
        [vpns.default.users.alice]
        acl_profiel = "default"
    """
    assert problems(text) == [
        "edge.toml: listener: unknown key (did you mean 'listeners'?)",
        "edge.toml: node.nmae: unknown key (did you mean 'name'?)",
        "edge.toml: node.colour: unknown key (did you mean 'cluster'?)",
        "edge.toml: vpns.default.client_profiles.gold.egress_max_mesages: "
        "unknown key (did you mean 'egress_max_messages'?)",
        "edge.toml: vpns.default.users.alice.acl_profiel: "
        "unknown key (did you mean 'acl_profile'?)",
    ]


def test_wrong_type(problems: Problems) -> None:
    text = """
        listeners = { port = 1 }
        [node]
        name = 7
        plugins = "direct"
        [vpns.default.client_profiles.gold]
        eliding_enabled = "yes"
        egress_max_messages = 1.5
        [vpns.default.acl_profiles.ro]
        publish_exceptions = ["a", 1]
        [vpns.default.queues]
        orders = "orders/>"
    """
    assert problems(text) == [
        "edge.toml: node.name: expected a string, got integer 7",
        "edge.toml: node.plugins: expected an array, got string 'direct'",
        "edge.toml: listeners: expected an array of tables ([[listeners]]), got a table",
        "edge.toml: vpns.default.client_profiles.gold.eliding_enabled: "
        "expected a boolean, got string 'yes'",
        "edge.toml: vpns.default.client_profiles.gold.egress_max_messages: "
        "expected an integer, got float 1.5",
        "edge.toml: vpns.default.acl_profiles.ro.publish_exceptions[1]: "
        "expected a string, got integer 1",
        "edge.toml: vpns.default.queues.orders: expected a table, got string 'orders/>'",
    ]


def test_bad_value(problems: Problems) -> None:
    text = """
        [node]
        name = "edge/1"
        [[listeners]]
        port = 70000
        keepalive = 0
        [vpns.default]
        authentication = "basik"
        [vpns.default.client_profiles.gold]
        egress_max_messages = 0
        [vpns.default.acl_profiles.ro]
        publish_default = "maybe"
        [vpns.default.users.alice]
        password = ""
        [vpns.default.queues.orders]
        access_type = "exclusiv"
        max_message_size = 0
        [vpns.default.queues."orders*"]
        [vpns."a/b"]
    """
    assert problems(text) == [
        "edge.toml: node.name: node name 'edge/1' may not contain '/'",
        "edge.toml: listeners[0].port: must be an integer from 0 to 65535, got 70000",
        "edge.toml: listeners[0].keepalive: must be a positive number, got 0",
        "edge.toml: vpns.default.authentication: expected one of 'none', 'basic', "
        "'client-certificate', got string 'basik' (did you mean 'basic'?)",
        "edge.toml: vpns.default.client_profiles.gold.egress_max_messages: "
        "must be a positive int, got 0",
        "edge.toml: vpns.default.acl_profiles.ro.publish_default: "
        "expected one of 'allow', 'deny', got string 'maybe'",
        "edge.toml: vpns.default.users.alice.password: must be a non-empty string",
        "edge.toml: vpns.default.queues.orders.access_type: expected one of 'exclusive', "
        "'non-exclusive', got string 'exclusiv' (did you mean 'exclusive'?)",
        "edge.toml: vpns.default.queues.orders.max_message_size: must be 1..31457280, got 0",
        'edge.toml: vpns.default.queues."orders*": queue name must be a non-empty str of '
        "at most 200 characters without '*', '>' or NUL, not starting with '#'; "
        "got 'orders*'",
        "edge.toml: vpns.\"a/b\": a VPN name must be non-empty and without '/'",
    ]


def test_listener_limits_before_login(problems: Problems, tmp_path: Path) -> None:
    text = """
        [[listeners]]
        login_frame_size = 100
        max_unauthenticated = 0
    """
    assert problems(text) == [
        "edge.toml: listeners[0].login_frame_size: must be an integer of at least 1024, got 100",
        "edge.toml: listeners[0].max_unauthenticated: must be an integer of at least 1, got 0",
    ]
    data = {"listeners": [{"login_frame_size": 4096, "max_unauthenticated": 8}]}
    (listener,) = parse_config(data, source="e", base_dir=tmp_path).listeners
    assert (listener.login_frame_size, listener.max_unauthenticated) == (4096, 8)
    assert (ListenerSettings().login_frame_size, ListenerSettings().max_unauthenticated) == (
        64 * 1024,
        256,
    )


def test_missing_required_key(problems: Problems, certs: Path) -> None:
    text = f"""
        [[listeners]]
        [listeners.tls]
        certificate = "{certs}/server.pem"
        [[listeners]]
        port = 1
        [listeners.tls]
        certificate = "{certs}/server.pem"
        private_key = "{certs}/server-key.pem"
        require_client_certificate = true
        [vpns.default]
        authentication = "basic"
        [vpns.default.users.alice]
        client_profile = "default"
        [vpns.default.users.retired]
        enabled = false
    """
    assert problems(text) == [
        "edge.toml: listeners[0].tls: missing required key 'private_key'",
        "edge.toml: listeners[1].tls: missing required key 'ca' "
        "(require_client_certificate = true)",
        "edge.toml: vpns.default.users.alice: missing required key 'password' "
        "(VPN 'default' uses basic authentication)",
    ]


def test_reference_to_an_undefined_profile_or_queue(problems: Problems) -> None:
    text = """
        [vpns.default.client_profiles.silver]
        [vpns.default.users.alice]
        client_profile = "gold"
        acl_profile = "readonly"
        [vpns.default.users.bob]
        client_profile = "silverr"
        [vpns.default.queues.orders]
        dead_message_queue = "orders-dmq"
        [vpns.default.topic_endpoints.history]
        dead_message_queue = "order"
        [vpns.other.client_profiles.gold]
    """
    assert problems(text) == [
        "edge.toml: vpns.default.users.alice.client_profile: "
        "no client profile named 'gold' in VPN 'default'",
        "edge.toml: vpns.default.users.alice.acl_profile: "
        "no ACL profile named 'readonly' in VPN 'default'",
        "edge.toml: vpns.default.users.bob.client_profile: "
        "no client profile named 'silverr' in VPN 'default' (did you mean 'silver'?)",
        "edge.toml: vpns.default.queues.orders.dead_message_queue: "
        "no queue named 'orders-dmq' in VPN 'default' (did you mean 'orders'?)",
        "edge.toml: vpns.default.topic_endpoints.history.dead_message_queue: "
        "no queue named 'order' in VPN 'default' (did you mean 'orders'?)",
    ]


def test_duplicate_listener_port_on_the_same_host(problems: Problems) -> None:
    text = """
        [[listeners]]
        name = "a"
        port = 6000
        [[listeners]]
        name = "a"
        port = 6000
        [[listeners]]
        host = "0.0.0.0"
        port = 6000
        [[listeners]]
        host = "10.0.0.1"
        port = 6001
        [[listeners]]
        host = "10.0.0.2"
        port = 6001
        [[listeners]]
        port = 0
        [[listeners]]
        port = 0
    """
    assert problems(text) == [
        "edge.toml: listeners[1].name: 'a' is already used by listeners[0]",
        "edge.toml: listeners[1].port: port 6000 on 127.0.0.1 is already used by listeners[0]",
        "edge.toml: listeners[2].port: port 6000 on 0.0.0.0 overlaps listeners[0] on 127.0.0.1",
    ]


def test_unknown_plugin(problems: Problems) -> None:
    text = """
        [node]
        plugins = ["direct", "guaranted", "direct"]
        block = ["elidng", "direct"]
        [vpns.default.queues.orders]
    """
    assert problems(text) == [
        "edge.toml: node.plugins[1]: unknown plugin 'guaranted' (did you mean 'guaranteed'?); "
        f"installed: {INSTALLED}",
        "edge.toml: node.plugins[2]: plugin 'direct' is listed twice",
        "edge.toml: node.block[0]: unknown plugin 'elidng' (did you mean 'eliding'?); "
        f"installed: {INSTALLED}",
        "edge.toml: node.block[1]: plugin 'direct' is also in node.plugins: keep one",
        "edge.toml: vpns.default.queues: queues need the 'guaranteed' plugin, which is not "
        "loaded (see node.plugins and node.block)",
    ]


def test_tls_files_that_do_not_exist(problems: Problems, tmp_path: Path, certs: Path) -> None:
    text = f"""
        [[listeners]]
        [listeners.tls]
        certificate = "certs/server.pem"
        private_key = "{tmp_path}"
        ca = "{certs}/ca.pem"
        [[listeners]]
        port = 1
        [listeners.tls]
        certificate = "{certs}/ca.pem"
        private_key = "{certs}/server-key.pem"
    """
    found = problems(text)
    assert found[:2] == [
        f"edge.toml: listeners[0].tls.certificate: no such file: {tmp_path}/certs/server.pem",
        f"edge.toml: listeners[0].tls.private_key: not a file: {tmp_path}",
    ]
    # The files exist but do not go together (OpenSSL words the rest).
    assert len(found) == 3
    assert found[2].startswith("edge.toml: listeners[1].tls: TLS settings are not usable: ")


def test_missing_environment_variable(problems: Problems) -> None:
    text = """
        [node]
        data_dir = "${ENV:EDGE_HOME}/data"
        plugins = ["direct", "${ENV:EXTRA_PLUGIN}"]
        [vpns.default.users.alice]
        password = "${ENV:ALICE_PASSWORD}"
        [vpns.default.users.bob]
        password = "${ENV:BOB_PASSWORD}"
    """
    assert problems(text, {"BOB_PASSWORD": "x"}) == [
        "edge.toml: node.data_dir: environment variable 'EDGE_HOME' is not set",
        "edge.toml: node.plugins[1]: environment variable 'EXTRA_PLUGIN' is not set",
        "edge.toml: vpns.default.users.alice.password: "
        "environment variable 'ALICE_PASSWORD' is not set",
    ]


def test_invalid_topic_subscription_on_a_queue(problems: Problems) -> None:
    text = """
        [vpns.default.queues.orders]
        subscriptions = ["orders/>", "#share/workers/orders/>", "orders/\\u0000", "#system"]
        [vpns.default.acl_profiles.ro]
        subscribe_exceptions = ["ok/>", "#noexport/a"]
        [vpns.default.topic_endpoints.history]
        subscriptions = ["history/>"]
    """
    assert problems(text) == [
        "edge.toml: vpns.default.acl_profiles.ro.subscribe_exceptions[1]: "
        "ACL exception '#noexport/a' must be a plain topic filter",
        "edge.toml: vpns.default.queues.orders.subscriptions[1]: invalid queue subscription: "
        "invalid topic '#share/workers/orders/>': "
        "shared subscriptions are not allowed on queues or topic endpoints",
        "edge.toml: vpns.default.queues.orders.subscriptions[2]: invalid queue subscription: "
        "invalid topic 'orders/\\x00' (level 2): NUL character is not allowed",
        "edge.toml: vpns.default.queues.orders.subscriptions[3]: invalid queue subscription: "
        "invalid topic '#system' (level 1): subscriptions starting with '#' are reserved "
        "for the system",
        "edge.toml: vpns.default.topic_endpoints.history.subscriptions: "
        "a topic endpoint takes no subscriptions: its consumer gives one at bind",
    ]


def test_every_mistake_is_reported_at_once(problems: Problems) -> None:
    text = """
        [node]
        plugins = ["direkt"]
        [[listeners]]
        port = -1
        [vpns.default.users.alice]
        client_profile = "gold"
        password = "${ENV:NOPE}"
    """
    assert len(problems(text)) == 4


# --- environment placeholders -----------------------------------------------------------


def test_environment_placeholders_in_any_string(tmp_path: Path) -> None:
    data = tomllib.loads(
        """
        [node]
        name = "${ENV:SITE}-gw"
        data_dir = "${ENV:HOME}/data"
        [vpns.default.users.alice]
        password = "pa$${ENV:SS}${ENV:SECRET}"
        [vpns.default.queues.q]
        subscriptions = ["sites/${ENV:SITE}/>"]
        """
    )
    environ = {"SITE": "berlin", "HOME": "/srv/edge", "SECRET": "s3cret"}
    config = parse_config(data, source="edge.toml", environ=environ, base_dir=tmp_path)
    assert config.name == "berlin-gw"
    assert config.data_dir == Path("/srv/edge/data")
    (vpn,) = config.vpns
    # $${ is a literal ${; what a variable holds is not expanded again
    assert vpn.users[0].password == "pa${ENV:SS}s3cret"
    assert vpn.section("queues")[0].subscriptions == ("sites/berlin/>",)


def test_malformed_placeholders_are_reported() -> None:
    data = {"node": {"name": "${HOME}", "data_dir": "${ENV:HOME"}}
    with pytest.raises(ConfigurationError) as info:
        parse_config(data, source="edge.toml", environ={"HOME": "/h"})
    assert info.value.problems == [
        "edge.toml: node.name: unknown placeholder '${HOME}': write ${ENV:NAME} for an "
        "environment variable, or $${ for a literal '${'",
        "edge.toml: node.data_dir: '${' without a closing '}' (write $${ for a literal '${')",
    ]


def test_placeholders_read_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHBUS_TEST_NODE", "from-env")
    assert parse_config({"node": {"name": "${ENV:MESHBUS_TEST_NODE}"}}).name == "from-env"


# --- defaults ---------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    config = default_config(tmp_path)
    assert config == NodeConfig(
        source="<defaults>",
        data_dir=tmp_path / "meshbus-data",
        name="meshbus",
        plugins=None,
        block=(),
        listeners=(ListenerSettings(host="127.0.0.1", port=55555),),
        vpns=(VpnConfig("default", authentication="none"),),
    )
    node = config.build_node()
    assert list(node.vpns) == ["default"]
    assert node.vpn().authentication == "none"
    assert node.plugins.names() == list(DEFAULT_PLUGINS)
    assert node.data_dir == tmp_path / "meshbus-data"


def test_an_empty_file_is_the_defaults_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "edge.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    config = load_config("conf/edge.toml")
    assert config == attrs.evolve(default_config(tmp_path / "conf"), source="conf/edge.toml")


def test_relative_paths_are_relative_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, certs: Path
) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "edge.toml").write_text(
        f"""
        [node]
        data_dir = "spool"
        [[listeners]]
        [listeners.tls]
        certificate = "{certs}/server.pem"
        private_key = "{certs}/server-key.pem"
        """
    )
    monkeypatch.chdir(tmp_path)
    config = load_config("etc/edge.toml")
    assert config.data_dir == folder / "spool"
    (listener,) = config.listeners
    assert listener.port == 55443  # the TLS port when a TLS listener gives none
    assert listener.tls is not None
    assert listener.tls.certificate == certs / "server.pem"


def test_listed_vpns_replace_the_open_default_one(tmp_path: Path) -> None:
    config = parse_config(
        {"vpns": {"plant": {"authentication": "basic"}}}, source="e", base_dir=tmp_path
    )
    node = config.build_node()
    assert list(node.vpns) == ["plant"]
    config = parse_config(
        {"vpns": {"default": {"authentication": "basic"}}}, source="e", base_dir=tmp_path
    )
    assert config.build_node().vpn("default").authentication == "basic"
    with pytest.raises(ConfigurationError) as info:
        parse_config({"vpns": {}}, source="e")
    assert info.value.problems == ["e: vpns: no VPN is configured: add a [vpns.NAME] table"]


def test_client_certificates_need_a_listener_that_verifies_them(
    problems: Problems, tmp_path: Path, certs: Path
) -> None:
    text = """
        [vpns.fleet]
        authentication = "client-certificate"
        [vpns.fleet.users.truck-7]
    """
    assert problems(text) == [
        "edge.toml: vpns.fleet.authentication: 'client-certificate' needs a TLS listener "
        "with a 'ca' to verify client certificates"
    ]
    tls = {
        "certificate": str(certs / "server.pem"),
        "private_key": str(certs / "server-key.pem"),
        "ca": str(certs / "ca.pem"),
    }
    data = {
        "listeners": [{"port": 0, "tls": tls}],
        "vpns": {"fleet": {"authentication": "client-certificate", "users": {"truck-7": {}}}},
    }
    node = parse_config(data, base_dir=tmp_path).build_node()
    assert node.vpn("fleet").authentication == "client-certificate"
    assert "truck-7" in node.vpn("fleet").users


def test_a_user_can_have_the_management_role(problems: Problems, tmp_path: Path) -> None:
    data = {"vpns": {"default": {"users": {"ops": {"management": True}, "app": {}}}}}
    users = parse_config(data, base_dir=tmp_path).build_node().vpn().users
    assert users["ops"].management
    assert not users["app"].management
    text = """
        [vpns.default.users.ops]
        management = "yes"
    """
    (problem,) = problems(text)
    assert problem.startswith("edge.toml: vpns.default.users.ops.management: "), problem


# --- the example --------------------------------------------------------------------------


def test_the_example_describes_its_node(certs: Path) -> None:
    config = load_config(EXAMPLE, environ=example_environ(certs))
    assert config.name == "edge-1"
    assert config.data_dir == EXAMPLE.parent / "edge-data"
    assert [(s.name, s.host, s.port, s.tls is not None) for s in config.listeners] == [
        ("local", "127.0.0.1", 55555, False),
        ("field", "0.0.0.0", 55443, True),
    ]
    assert [vpn.name for vpn in config.vpns] == ["plant", "lab"]

    node = config.build_node()
    assert list(node.vpns) == ["plant", "lab"]
    plant = node.vpn("plant")
    assert plant.authentication == "basic"
    assert node.vpn("lab").authentication == "none"
    assert plant.client_profiles["sensor"] == ClientProfile(
        "sensor",
        egress_max_messages=1000,
        egress_max_bytes=1048576,
        allow_shared_subscriptions=False,
        allow_guaranteed_receive=False,
    )
    assert plant.client_profiles["dashboard"].eliding_delay_ms == 500
    assert plant.acl_profiles["sensor"] == AclProfile(
        "sensor",
        publish_default=AclAction.DENY,
        publish_exceptions=("plant/telemetry/$client-username/>", "plant/alarms/>"),
        subscribe_default=AclAction.DENY,
        subscribe_exceptions=("plant/commands/$client-username/>",),
    )
    assert sorted(plant.users) == ["default", "operator", "retired", "sensor-17"]
    operator = plant.users["operator"]
    assert (operator.client_profile, operator.acl_profile) == ("dashboard", "read-only")
    assert operator.management
    assert not plant.users["sensor-17"].management
    assert operator.password_hash is not None
    assert "operator-secret" not in repr(config)
    assert not plant.users["retired"].enabled
    (alarms, dead) = config.vpn("plant").section("queues")
    assert alarms == QueueSettings(
        "alarms",
        subscriptions=("plant/alarms/>",),
        access_type=AccessType.NON_EXCLUSIVE,
        max_messages=100000,
        max_redelivery=5,
        dead_message_queue="alarms-dead",
        respect_ttl=True,
    )
    assert dead.max_bytes == 104857600


async def test_the_example_provisions_and_serves_logins(tmp_path: Path, certs: Path) -> None:
    config = load_config(EXAMPLE, environ=example_environ(certs))
    config = attrs.evolve(config, data_dir=tmp_path / "data")
    node = config.build_node()
    async with node:
        await config.provision(node)
        await config.provision(node)  # the same queues again: nothing changes
        service: Any = node.guaranteed  # the built-in GuaranteedService
        assert (
            service.queue("alarms", vpn="plant").settings
            == config.vpn("plant").section("queues")[0]
        )
        historian = service.topic_endpoint("historian", vpn="plant")
        assert historian.settings.max_messages == 1000000
        assert not historian.settings.reject_msg_to_sender_on_discard

        async with await node.login("plant", username="sensor-17", password="sensor-secret") as s:
            await s.send("plant/alarms/boiler", b"too hot")
        async with await node.login("plant", username="operator", password="operator-secret") as s:
            flow = await s.bind("alarms")
            message = await flow.receive()
            assert message.payload == b"too hot"
            flow.ack(message)
            await flow.unbind()
        for refused in (
            {"username": "operator", "password": "guess"},
            {"username": "retired", "password": "x"},
            {"username": "mallory", "password": "x"},
        ):
            with pytest.raises(AuthenticationError, match="login refused"):
                await node.login("plant", **refused)
        assert node.vpn("plant").statistics().login_failures == 3
        async with node.connect("lab", username="anyone"):
            pass
    assert (tmp_path / "data").is_dir()


async def test_provision_reports_what_the_running_node_refuses(tmp_path: Path, certs: Path) -> None:
    config = load_config(EXAMPLE, environ=example_environ(certs))
    config = attrs.evolve(config, data_dir=tmp_path / "data")
    node = config.build_node()
    with pytest.raises(StateError, match="running node"):
        await config.provision(node)
    async with node:
        node.guaranteed.create_queue("alarms", vpn="plant", max_messages=1)
        with pytest.raises(ConfigurationError) as info:
            await config.provision(node)
    assert info.value.problems == [
        f"{EXAMPLE}: vpns.plant.queues.alarms: "
        "queue 'alarms' exists in VPN 'plant' with other settings"
    ]


def test_a_placeholder_that_fails_in_a_plugin_table_is_its_only_problem(
    problems: Problems,
) -> None:
    text = """
        [vpns.default.queues.orders]
        max_messages = "${ENV:NOT_SET}"
    """
    assert problems(text) == [
        "edge.toml: vpns.default.queues.orders.max_messages: "
        "environment variable 'NOT_SET' is not set"
    ]
