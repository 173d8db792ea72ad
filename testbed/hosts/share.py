"""Other hosts' shares of a plan, as actions: each host builds its share with its own
ledger (``testbed _host apply`` over SSH, or as a step of the Slurm job: :mod:`testbed.hosts.kinds`,
:mod:`testbed.engine.hostagent`); the controller records :class:`RemoteShare` before asking, so ``down`` asks the host to remove it again."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from testbed.common.errors import StateError, TestbedError
from testbed.hosts import kinds
from testbed.model.topology import host_from_json
from testbed.monitor.sd import parse_listen, testbed_target, write_target
from testbed.plan.actions import Action, ApplyContext, Teardown, register


@register
@dataclass(frozen=True)
class RemoteShare(Action):
    """Another host's share of the plan, applied there by ``testbed _host apply`` with that
    host's own ledger (:mod:`testbed.engine.hostagent`). Recorded here before it starts, so that
    ``down`` (also ``down --all`` after this process was killed) asks the host to remove
    its share. Applying starts the host's work in the background; :class:`AwaitShares`
    waits for it, so the hosts build at the same time as this one."""

    host: str
    spec: str
    """The host's ``hosts:`` entry as JSON, read back through the topology's own checks."""

    @classmethod
    def of(cls, host) -> "RemoteShare":
        return cls(host.name, json.dumps(host.to_dict(), sort_keys=True))

    def host_spec(self):
        try:
            h = host_from_json(self.spec)
        except TestbedError as e:
            raise StateError(f"ledger entry RemoteShare: bad host spec: {e}") from None
        if h.name != self.host:
            raise StateError(f"ledger entry RemoteShare names host {self.host!r} but describes {h.name!r}")
        return h

    def describe(self) -> str:
        return f"host {self.host} builds its share"

    def apply(self, ctx: ApplyContext) -> None:
        spec = self.host_spec()
        remote = ctx.remotes.get(spec.name) or ctx.remotes.setdefault(spec.name, kinds.remote(spec))
        payload = ctx.shares[self.host]
        box: dict = {}

        def work():
            try:
                box["answer"] = remote.call("apply", ctx.testbed, payload=payload)
            except BaseException as e:  # handed to AwaitShares
                box["error"] = e

        t = threading.Thread(target=work, name=f"share-{self.host}", daemon=True)
        t.start()
        ctx.pending.append((self.host, t, box))

    def undo(self, td: Teardown) -> None:
        remote = kinds.remote(self.host_spec())
        try:
            remote.call("down", td.testbed)
        except TestbedError as e:
            again = f"once it answers, run `testbed down {td.testbed}` again (here, or on {self.host})"
            if "stopped answering" in e.message:
                td.problems.append(f"host {self.host} still holds its share: it stopped answering; {again}")
            else:
                td.problems.append(f"host {self.host}: {e.message}"
                                   + (f" ({again})" if "unreachable" in e.message else ""))
        finally:
            remote.close()


@register
@dataclass(frozen=True)
class AwaitShares(Action):
    """Wait until every other host has built its share; the first failure is raised."""

    def describe(self) -> str:
        return "wait for the other hosts' shares"

    def apply(self, ctx: ApplyContext) -> None:
        failures = []
        for _host, t, box in ctx.pending:
            while t.is_alive():
                t.join(0.2)  # short joins: a signal is noticed between them
                ctx.check()
            if "error" in box:
                failures.append(box["error"])
        done = [(host, box.get("answer") or {}) for host, _, box in ctx.pending]
        ctx.pending.clear()
        if failures:
            e = failures[0]
            if isinstance(e, TestbedError) and len(failures) > 1:
                e.message += f" (and {len(failures) - 1} other host(s) failed)"
            raise e
        for host, answer in done:  # announce each host's link exporter to the local Prometheus
            url = answer.get("exporter")
            if isinstance(url, str) and url.startswith("http://") and url.endswith("/metrics"):
                try:
                    addr, port = parse_listen(url[len("http://"):-len("/metrics")])
                except ValueError:
                    continue
                target = testbed_target(ctx.testbed).with_name(f"testbed-{ctx.testbed}@{host}.json")
                write_target(target, addr, port, {"exporter": "links", "host": host})
                exporters = ctx.results.setdefault("host_exporters", {})
                assert isinstance(exporters, dict)  # only set here
                exporters[host] = url
