"""Which URLs a `url` dataset may name: http(s) to public addresses, unless an admin allows a
mirror (TRAINDECK_URL_ALLOW). Registration judges the URL as written and asks no DNS server;
the worker's checks after resolving the name are in test_fetch.py."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from sqlalchemy import Engine

from common.settings import SettingsError, settings
from datasets.labelling import DatasetError
from datasets.register import register_url
from datasets.urls import AllowList, address_rule, check_url
from db.datasets import get_dataset


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://127.0.0.1:8000/x.tgz", "127.0.0.1 is a loopback address"),
        ("http://[::1]:22/x.tgz", "::1 is a loopback address"),
        ("http://localhost:8501/x.tgz", "localhost is this machine (a loopback name)"),
        ("http://db.localhost/x.tgz", "db.localhost is this machine (a loopback name)"),
        ("http://169.254.169.254/latest/x.tgz", "169.254.169.254 is the cloud metadata address"),
        ("http://metadata.google.internal/x.tgz", "is the cloud metadata server"),
        ("http://[fd00:ec2::254]/x.tgz", "is the cloud metadata address"),
        ("http://169.254.1.1/x.tgz", "169.254.1.1 is a link-local address"),
        ("http://[fe80::1]/x.tgz", "fe80::1 is a link-local address"),
        ("http://10.1.2.3/x.tgz", "10.1.2.3 is a private address"),
        ("http://192.168.0.10/x.tgz", "192.168.0.10 is a private address"),
        ("https://172.16.5.4/x.tgz", "172.16.5.4 is a private address"),
        ("http://[fd12:3456::1]/x.tgz", "fd12:3456::1 is a unique-local address"),
        ("http://0.0.0.0/x.tgz", "0.0.0.0 is an unspecified address"),
        ("http://[::]/x.tgz", ":: is an unspecified address"),
        ("http://224.0.0.1/x.tgz", "224.0.0.1 is a multicast address"),
        ("http://240.0.0.1/x.tgz", "240.0.0.1 is a reserved address"),
        ("http://100.64.0.1/x.tgz", "100.64.0.1 is not a public address"),
        ("http://[::ffff:127.0.0.1]/x.tgz", "a loopback address (127.0.0.1) inside an IPv6"),
        ("http://[64:ff9b::a00:1]/x.tgz", "a private address (10.0.0.1) inside an IPv6"),
        ("http://2130706433/x.tgz", "2130706433 resolves to 127.0.0.1, a loopback address"),
        ("http://0x7f.1/x.tgz", "0x7f.1 resolves to 127.0.0.1, a loopback address"),
        ("http://ada:hunter2@10.0.0.1/x.tgz", "http://ada:***@10.0.0.1/x.tgz is refused"),
    ],
)
def test_registration_refuses_an_address_that_is_not_public(
    sqlite_engine: Engine, url: str, rule: str
) -> None:
    with pytest.raises(DatasetError) as refused:
        register_url(sqlite_engine, "inside", url)
    message = str(refused.value)
    assert rule in message
    assert "an admin can allow an internal mirror with TRAINDECK_URL_ALLOW" in message
    assert "hunter2" not in message
    assert get_dataset(sqlite_engine, "inside") is None


@pytest.mark.parametrize(
    "url",
    [
        "https://s3.amazonaws.com/fast-ai-imageclas/oxford-iiit-pet.tgz",
        "http://93.184.216.34/x.tgz",
        "https://[2606:4700::1111]/x.tgz",
        "URLs.PETS",
    ],
)
def test_public_addresses_and_names_are_registered_without_asking_dns(
    sqlite_engine: Engine, url: str, monkeypatch
) -> None:
    real = socket.getaddrinfo

    def numbers_only(*args, **kwargs):
        if not kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            raise AssertionError("registration asked DNS")
        return real(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", numbers_only)
    monkeypatch.setattr(socket, "gethostbyname", numbers_only)
    register_url(sqlite_engine, "public", url)
    assert get_dataset(sqlite_engine, "public").location == url


def test_an_admin_allows_hosts_addresses_and_networks(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINDECK_URL_ALLOW", "Mirror.Corp., 10.20.0.0/16 [::1] 127.0.0.1")
    for name, url in [
        ("named", "http://mirror.corp/x.tgz"),
        ("ranged", "http://10.20.3.4:8080/x.tgz"),
        ("six", "http://[::1]:8000/x.tgz"),
        ("four", "http://127.0.0.1/x.tgz"),
    ]:
        register_url(sqlite_engine, name, url)
    with pytest.raises(DatasetError, match=r"10\.21\.0\.1 is a private address"):
        register_url(sqlite_engine, "outside", "http://10.21.0.1/x.tgz")
    with pytest.raises(DatasetError, match="localhost is this machine"):
        register_url(sqlite_engine, "local", "http://localhost/x.tgz")


def test_the_allow_list_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINDECK_URL_ALLOW", "mirror.corp, http://x/")
    with pytest.raises(SettingsError, match=r"^TRAINDECK_URL_ALLOW='mirror.corp, http://x/'"):
        settings()
    monkeypatch.setenv("TRAINDECK_URL_ALLOW", "a.b 10.0.0.0/8,fd00::/8")
    assert AllowList.from_settings() == AllowList(
        frozenset({"a.b"}),
        (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")),
    )


def test_every_rule_has_its_words() -> None:
    assert address_rule(ipaddress.ip_address("8.8.8.8")) is None
    assert address_rule(ipaddress.ip_address("2001:4860:4860::8888")) is None
    assert address_rule(ipaddress.ip_address("2002:7f00:1::1")) == (
        "a loopback address (127.0.0.1) inside an IPv6 address"
    )
    with pytest.raises(DatasetError, match="not an http"):
        check_url("ftp://example.com/x.tgz", AllowList())
    with pytest.raises(DatasetError, match="not a usable URL"):
        check_url("http://example.com:99999/x.tgz", AllowList())
