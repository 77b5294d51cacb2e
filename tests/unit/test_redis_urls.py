"""The Sentinel store URL, `redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]/SERVICE[/DB]`
(`middleware.resume.redis_connect.sentinel_url`), and the Cluster one, `redis+cluster://…`
(`cluster_url`): what each names, what redis-py's `Sentinel` or `RedisCluster` is given for
it, and the clear error, without the password, for one that cannot be read."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from middleware.resume.redis_connect import cluster_url, connect, sentinel_url, shown
from middleware.resume.redis_keys import Keys
from sidecar.config import load

SECRET = "hunter2"


def settings_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line `load` exits with (status 2)."""
    with pytest.raises(SystemExit) as exited:
        load(["--upstream", "http://127.0.0.1:1", *argv], environ={})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_sentinel_url_names_its_sentinels_service_database_and_credentials() -> None:
    """Rule: the URL lists the sentinels (HOST:PORT, [IPv6]:PORT, or HOST for port 26379),
    then the primary's service name and database (0 unless given); user and password are
    percent-decoded."""
    url = "redis+sentinel://app:p%40ss%2Fw@10.0.0.1:26380,sentinel-b,[::1]:26381/cache%2Dprimary/3"
    parsed = sentinel_url(url)
    assert parsed.sentinels == (("10.0.0.1", 26380), ("sentinel-b", 26379), ("::1", 26381))
    assert (parsed.service, parsed.db) == ("cache-primary", 3)
    assert (parsed.username, parsed.password) == ("app", "p@ss/w")
    bare = sentinel_url("redis+sentinel://h:1/s")
    assert (bare.db, bare.username, bare.password) == (0, None, None)


@pytest.mark.parametrize(
    "url",
    [
        f"redis+sentinel://:{SECRET}@h:1",  # no service
        f"redis+sentinel://:{SECRET}@h:1/",  # an empty one
        f"redis+sentinel://:{SECRET}@h:port/s",
        f"redis+sentinel://:{SECRET}@h:70000/s",
        f"redis+sentinel://:{SECRET}@h:1,,h:2/s",  # an empty address
        f"redis+sentinel://:{SECRET}@[::1/s",
        f"redis+sentinel://:{SECRET}@h:1/s/db",
        f"redis+sentinel://:{SECRET}@h:1/s/0/extra",
        f"redis+sentinel://:{SECRET}@h:1/s?socket_timeout=1",  # options are not read
        f"redis+sentinel://u:{SECRET}/x@h:1/s",  # a password with `/` not percent-encoded
    ],
)
def test_a_malformed_sentinel_url_is_a_value_error_without_its_password(url: str) -> None:
    """Rule: a Sentinel URL that cannot be read is a ValueError that shows the URL (through
    `shown`, `***` for the password), says what is wrong, and never holds the password."""
    with pytest.raises(ValueError) as caught:
        connect(url)
    message = str(caught.value)
    assert SECRET not in message and "***" in message and "SERVICE" in message


def test_the_client_follows_the_service_through_redis_py_sentinel() -> None:
    """Rule: the client is redis-py's `Sentinel(...).master_for(SERVICE)` (no connection made
    yet): the primary gets the URL's credentials and database; the sentinels are asked
    without credentials and with the socket timeouts only (redis-py's `sentinel_kwargs`)."""
    client = connect(
        "redis+sentinel://app:pw@127.0.0.1:1,127.0.0.1:2/primary/2", socket_connect_timeout=1.5
    )
    pool = client.connection_pool
    assert pool.service_name == "primary" and pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (2, "app", "pw")
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
    for sentinel in sentinels:
        options = sentinel.connection_pool.connection_kwargs
        assert options.get("password") is None and options["socket_connect_timeout"] == 1.5


def test_a_password_from_a_file_and_one_in_the_url_are_one_too_many() -> None:
    """Rule: the password file works for a Sentinel store as for `redis://`; given in the URL
    as well it is an error (which one wins would be a guess); CA certificates need TLS."""
    client = connect("redis+sentinel://h:1/s", password="from-file")
    assert client.connection_pool.connection_kwargs["password"] == "from-file"
    with pytest.raises(ValueError, match="given twice"):
        connect(f"redis+sentinel://:{SECRET}@h:1/s", password="from-file")
    with pytest.raises(ValueError, match="rediss://"):
        connect("redis+sentinel://h:1/s", ca="/etc/ssl/ca.pem")


def test_the_flag_takes_a_sentinel_url_and_names_a_bad_one_without_its_password(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Rule: `--resume-store redis+sentinel://…` is accepted (with the shared secret, as any
    Redis store); a malformed one, or one with `--resume-store-ca`, is a one-line flag error
    without the password."""
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    url = f"redis+sentinel://app:{SECRET}@127.0.0.1:26379/primary/1"
    flags = ["--resume", "--resume-secret-file", str(secret)]
    settings = load(["--upstream", "http://127.0.0.1:1", *flags, "--resume-store", url], {})
    assert settings.resume_store == url
    err = settings_error(capsys, *flags, "--resume-store", url.replace(":26379", ":x"))
    assert "--resume-store" in err and SECRET not in err and "***" in err
    err = settings_error(capsys, *flags, "--resume-store", url, "--resume-store-ca", str(secret))
    assert "--resume-store-ca" in err and SECRET not in err


def test_the_shown_url_hides_a_password_whatever_it_holds() -> None:
    """Rule: `shown` hides everything up to the last `@` of the user part, so a password with
    an unescaped `/`, `?` or `@` is hidden too; the sentinels and service stay readable."""
    assert shown(f"redis+sentinel://u:{SECRET}@a:1,b:2/s/0") == "redis+sentinel://u:***@a:1,b:2/s/0"
    for password in (f"{SECRET}/x", f"{SECRET}?x", f"x@{SECRET}"):
        assert SECRET not in shown(f"redis+sentinel://u:{password}@a:1/s")
        assert SECRET not in shown(f"redis://u:{password}@a:1/0")


def test_a_cluster_url_names_its_nodes_and_credentials() -> None:
    """Rule: `redis+cluster://` lists some nodes of the cluster (HOST:PORT, [IPv6]:PORT, or
    HOST for port 6379), user and password percent-decoded; no database (a cluster has one)."""
    parsed = cluster_url("redis+cluster://app:p%40ss@10.0.0.1:7000,node-b,[::1]:7002")
    assert parsed.nodes == (("10.0.0.1", 7000), ("node-b", 6379), ("::1", 7002))
    assert (parsed.username, parsed.password) == ("app", "p@ss")
    assert cluster_url("redis+cluster://h:1").password is None


@pytest.mark.parametrize(
    "url",
    [
        f"redis+cluster://:{SECRET}@h:port",
        f"redis+cluster://:{SECRET}@h:1,,h:2",
        f"redis+cluster://:{SECRET}@h:1/0",  # a database: a cluster has only one
        f"redis+cluster://:{SECRET}@h:1?socket_timeout=1",
        f"redis+cluster://u:{SECRET}/x@h:1",  # a password with `/` not percent-encoded
    ],
)
def test_a_malformed_cluster_url_is_a_value_error_without_its_password(url: str) -> None:
    """Rule: a cluster URL that cannot be read is a ValueError that shows the URL with `***`
    for the password, names the form expected, and never holds the password."""
    with pytest.raises(ValueError) as caught:
        connect(url)
    message = str(caught.value)
    assert SECRET not in message and "***" in message and "HOST:PORT[,HOST:PORT…]" in message


def test_the_cluster_client_is_redis_py_redis_cluster_on_the_url_nodes() -> None:
    """Rule: the client is redis-py's `RedisCluster` (no connection made yet), started from the
    URL's nodes with its credentials, or the password file's; both, or CA certificates, are
    errors."""
    client = connect("redis+cluster://app:pw@127.0.0.1:7000,127.0.0.1:7001", socket_timeout=2.0)
    assert isinstance(client, RedisCluster)
    nodes = client.nodes_manager.startup_nodes
    assert sorted(node.port for node in nodes.values()) == [7000, 7001]
    assert (client.connection_kwargs["username"], client.connection_kwargs["password"]) == (
        "app",
        "pw",
    )
    assert connect("redis+cluster://h:1", password="f").connection_kwargs["password"] == "f"
    with pytest.raises(ValueError, match="given twice"):
        connect(f"redis+cluster://:{SECRET}@h:1", password="from-file")
    with pytest.raises(ValueError, match="rediss://"):
        connect("redis+cluster://h:1", ca="/etc/ssl/ca.pem")


def test_the_flag_takes_a_cluster_url_and_names_a_bad_one_without_its_password(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Rule: `--resume-store redis+cluster://…` is accepted (with the shared secret); a
    malformed one is a one-line flag error without the password."""
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    url = f"redis+cluster://app:{SECRET}@127.0.0.1:7000,127.0.0.1:7001"
    flags = ["--resume", "--resume-secret-file", str(secret)]
    settings = load(["--upstream", "http://127.0.0.1:1", *flags, "--resume-store", url], {})
    assert settings.resume_store == url
    err = settings_error(capsys, *flags, "--resume-store", url + "/0")
    assert "--resume-store" in err and SECRET not in err and "***" in err


def test_a_stream_keys_share_a_hash_tag_on_a_cluster_only() -> None:
    """Rule: on a cluster a stream's keys are `{<id>}`-tagged, so its stream, meta and
    reader keys hash to one slot; one server keeps the plain names stores already hold."""
    tagged, plain = Keys(cluster=True).stream("abc"), Keys(cluster=False).stream("abc")
    assert tagged == "sidestream:resume:{abc}" and plain == "sidestream:resume:abc"
    assert len({key_slot(k.encode()) for k in (tagged, tagged + ":m", tagged + ":r")}) == 1
    slots = {key_slot(Keys(cluster=True).stream(f"s{n}").encode()) for n in range(20)}
    assert len(slots) > 1
