"""How another host of a testbed is reached, by its kind (``Host.kind``): the registry.

``ssh`` (:mod:`testbed.hosts.ssh.client`, :class:`testbed.hosts.site.SshSite`) and ``slurm`` (a node
of the Slurm job, :mod:`testbed.hosts.slurm.host`). Each kind gives a *remote* (``testbed _host``
commands on that host: ``call``, ``failure``, ``require_root``, ``open_sftp()``,
``close``) and a *Site* (:class:`testbed.hosts.site.Site`). The engine asks this registry,
never which kind a host is: registering a kind is one line here, its module imported on
first use.
"""

from __future__ import annotations

import importlib

_REGISTERED: dict[str, tuple[str, str]] = {
    "ssh": ("testbed.hosts.ssh.client:Remote", "testbed.hosts.site:SshSite"),
    "slurm": ("testbed.hosts.slurm.host:SlurmRemote", "testbed.hosts.slurm.host:SlurmSite"),
}
"""Kind -> (``module:class`` of its remote, ``module:class`` of its Site)."""


def _load(where: str):
    module, cls = where.split(":")
    return getattr(importlib.import_module(module), cls)


def remote(host):
    """The way to ``host``'s ``testbed _host`` commands (a ``hosts:`` entry of any kind)."""
    return _load(_REGISTERED[host.kind][0])(host)


def site_class(host):
    """The Site class for ``host``'s share of a running testbed."""
    return _load(_REGISTERED[host.kind][1])
