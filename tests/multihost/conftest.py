"""Fixtures of the several-hosts tests: the hosts, made and removed around a test."""

from __future__ import annotations

import pytest
from hosts import Hosts, hosts_or_skip


@pytest.fixture
def two_hosts() -> Hosts:
    hosts = hosts_or_skip(2)
    try:
        yield hosts
    finally:
        hosts.close()
