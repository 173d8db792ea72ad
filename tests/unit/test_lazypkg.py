"""testbed.common.lazypkg: a package's __init__ deferred until the package itself is asked."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str, path: str = "") -> str:
    env_path = [path] if path else []
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": ":".join([*env_path, *sys.path[1:]])}).stdout


def test_a_submodule_loads_without_the_init_and_the_init_runs_once_when_asked(tmp_path):
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("print('init ran')\nfrom toy.sub.leaf import VALUE as EXPORTED\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "leaf.py").write_text("from toy import config\nVALUE = config.X + 1\n")
    (pkg / "config.py").write_text("X = 41\n")
    out = _python("""
        from testbed.common.lazypkg import lazy_package
        lazy_package("toy")
        from toy.sub.leaf import VALUE
        print("leaf", VALUE)
        import toy
        print("exported", toy.EXPORTED)
        print("again", toy.EXPORTED)
        try:
            toy.nothing_here
        except AttributeError:
            print("missing is an AttributeError")
        """, str(tmp_path))
    assert out.splitlines() == ["leaf 42", "init ran", "exported 42", "again 42", "missing is an AttributeError"]


def test_the_network_code_leaves_pyroute2s_init_until_asked():
    out = _python("""
        import sys
        from testbed.net import probe, routes, rtnl, tc, tcbatch, underlay
        print("ndb" if "pyroute2.ndb.main" in sys.modules else "no ndb")
        from pyroute2 import IPRoute, NetlinkError
        from pyroute2.iproute.linux import IPRoute as Linux
        from pyroute2.netlink.exceptions import NetlinkError as Err
        print(IPRoute is Linux and NetlinkError is Err, "pyroute2.ndb.main" in sys.modules)
        """)
    assert out.splitlines() == ["no ndb", "True True"]


def test_an_imported_package_is_left_alone():
    out = _python("""
        import json, sys
        from testbed.common.lazypkg import lazy_package
        lazy_package("json"); lazy_package("no_such_package_here"); lazy_package("os.path")
        print(sys.modules["json"] is json, "no_such_package_here" in sys.modules)
        """)
    assert out.split() == ["True", "False"]
