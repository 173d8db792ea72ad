"""The documentation keeps its promises: its topology examples load, the JSON schema takes
exactly the loader's keys, every `testbed ...` line in its shell examples names commands and
options the CLI has, and the MkDocs site builds with --strict.

Every fenced ```yaml block in README.md and docs/**/*.md that has `nodes:` and `links:` is a
topology example: it must validate against testbed/topologies/schema.json and load with
the loader. An example preceded by the line `<!-- invalid -->` is a deliberate mistake and
must fail both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed import TestbedError, load_topology_dict

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "testbed" / "topologies" / "schema.json"
INVALID_MARK = "<!-- invalid -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```ya?ml[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


def _examples() -> list[tuple[str, str, bool]]:
    """(where, yaml text, expected valid) for every topology example in the docs."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out = []
    for page in pages:
        if not page.exists():
            continue
        text = page.read_text()
        for m in FENCE.finditer(text):
            indent = m.group("indent")
            body = "\n".join(l[len(indent):] if l.startswith(indent) else l
                             for l in m.group("body").splitlines())
            if not (re.search(r"^\s*nodes:", body, re.M) and re.search(r"^\s*links:", body, re.M)):
                continue
            before = [l.strip() for l in text[:m.start()].splitlines() if l.strip()]
            valid = not (before and before[-1] == INVALID_MARK)
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{page.relative_to(ROOT)}:{line}", body, valid))
    return out


EXAMPLES = _examples()


@pytest.fixture(scope="module")
def schema() -> dict:
    jsonschema = pytest.importorskip("jsonschema")
    s = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(s)
    return s


def _validate(data, schema) -> None:
    import jsonschema

    jsonschema.Draft202012Validator(schema).validate(data)


def test_the_docs_have_topology_examples():
    assert len(EXAMPLES) >= 8, [w for w, _, _ in EXAMPLES]
    assert any(not valid for _, _, valid in EXAMPLES), f"no example marked {INVALID_MARK}"


@pytest.mark.parametrize("where,text,valid", EXAMPLES, ids=[w for w, _, _ in EXAMPLES])
def test_topology_example(where, text, valid, schema):
    import jsonschema

    data = yaml.safe_load(text)
    if valid:
        _validate(data, schema)
        load_topology_dict(data, source=where)
    else:
        with pytest.raises(jsonschema.ValidationError):
            _validate(data, schema)
        with pytest.raises(TestbedError):
            load_topology_dict(data, source=where)


SHIPPED = sorted((ROOT / "testbed" / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_topology_validates_and_loads(path, schema):
    data = yaml.safe_load(path.read_text())
    _validate(data, schema)
    load_topology_dict(data, source=str(path))


# ---------------------------------------------------------------- schema keys == loader keys
BASE = {
    "name": "probe",
    "nodes": {"s0": {"kind": "switch"}, "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
    "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s0"]}],
}


def _probe(place) -> set[str]:
    """The keys the loader allows where ``place`` puts an unknown one: read from its error's
    hint ("allowed keys here: a, b" or "keys: a, b")."""
    data = json.loads(json.dumps(BASE))
    place(data)
    with pytest.raises(TestbedError) as e:
        load_topology_dict(data)
    hint = e.value.hint or ""
    m = re.search(r"(?:allowed keys here|keys): (.+)$", hint)
    if not m or "zz_unknown" not in e.value.message:
        pytest.fail(f"the loader's error no longer lists the allowed keys as this test expects: "
                    f"{e.value.message!r} / hint {hint!r}; update _probe in tests/unit/test_docs.py")
    return {k.strip() for k in m.group(1).split(",")}


def _props_ref(schema: dict, ref: str) -> dict:
    node = schema
    for p in ref.removeprefix("#/").split("/"):
        node = node[p]
    return node


def _host(d):
    d["hosts"] = [{"name": "h1", "address": "192.0.2.1", "zz_unknown": 1}]


PROBES = {
    "top level": (lambda d: d.update(zz_unknown=1), ()),
    "defaults": (lambda d: d.update(defaults={"zz_unknown": 1}), ("properties", "defaults")),
    "defaults.link": (lambda d: d.update(defaults={"link": {"zz_unknown": 1}}), ("$defs", "shape")),
    "worker": (lambda d: d["nodes"]["w0"].update(zz_unknown=1),
               ("properties", "nodes", "additionalProperties", "oneOf", 0)),
    "switch": (lambda d: d["nodes"]["s0"].update(zz_unknown=1),
               ("properties", "nodes", "additionalProperties", "oneOf", 1)),
    "link": (lambda d: d["links"][0].update(zz_unknown=1), ("properties", "links", "items")),
    "link direction": (lambda d: d["links"][0].update(forward={"zz_unknown": 1}), ("$defs", "shape")),
    "schedule step": (lambda d: d["links"][0].update(schedule=[{"at": "0s", "rate": "1gbit", "zz_unknown": 1}]),
                      ("$defs", "step")),
    "traffic flow": (lambda d: d.update(traffic=[{"from": "w0", "to": "w1", "zz_unknown": 1}]), ("$defs", "flow")),
    "host": (_host, ("properties", "hosts", "items")),
    "vxlan": (lambda d: d.update(vxlan={"zz_unknown": 1}), ("properties", "vxlan")),
}


@pytest.mark.parametrize("where", list(PROBES))
def test_schema_takes_exactly_the_loaders_keys(where, schema):
    place, path = PROBES[where]
    node = schema
    for p in path:
        node = node[p]
    if "$ref" in node and "properties" not in node:
        node = _props_ref(schema, node["$ref"])
    assert set(node["properties"]) == _probe(place), where


# ---------------------------------------------------------------- the site builds
def test_mkdocs_build_strict(tmp_path):
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        print("mkdocs is not installed: pip install mkdocs mkdocs-material")
        pytest.skip("mkdocs is not installed (pip install mkdocs mkdocs-material)")
    try:
        import material  # noqa: F401  (the theme mkdocs.yml names)
    except ImportError:
        print("mkdocs-material is not installed: pip install mkdocs-material")
        pytest.skip("mkdocs-material is not installed (pip install mkdocs-material)")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site),
                        "--config-file", str(ROOT / "mkdocs.yml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
    assert not [p for p, html in pages.items() if "<!-- gen:" in html], "a generation marker was left unreplaced"
    assert "testbed link set" in pages["cli/index.html"]
    assert "testbed_link_transmit_bytes_total" in pages["monitoring/index.html"]
    shutil.rmtree(site, ignore_errors=True)


# ---------------------------------------------------------------- shell examples name real commands
SHELL_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>console|bash|sh|shell)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                         re.M | re.S)
SEPARATORS = {"&&", "||", ";", "|", "&"}


def _shell_commands(text: str, where: str) -> list[tuple[str, str]]:
    """(where, command line) for every command in the text's console/bash/sh code blocks:
    in a console block only the lines after a `$ ` prompt (the rest is output), with their
    backslash continuation lines joined."""
    out = []
    for m in SHELL_FENCE.finditer(text):
        first = text.count("\n", 0, m.start("body")) + 1
        lines = m.group("body").splitlines()
        i = 0
        while i < len(lines):
            line, at = lines[i].strip(), i
            i += 1
            if m.group("lang") == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            while line.endswith("\\") and i < len(lines):
                line = line[:-1] + " " + lines[i].strip()
                i += 1
            if line and not line.startswith("#"):
                out.append((f"{where}:{first + at}", line))
    return out


def _invocations(line: str) -> list[list[str]]:
    """The arguments of every `testbed` the shell line runs (after sudo and environment
    assignments; also as a path such as .venv/bin/testbed)."""
    import shlex

    lex = shlex.shlex(line, posix=True, punctuation_chars="&|;")
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError as e:  # an unclosed quote
        raise AssertionError(f"cannot split {line!r}: {e}") from None
    segments: list[list[str]] = [[]]
    for t in tokens:
        if t in SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(t)
    out = []
    for seg in segments:
        while seg and (seg[0] in ("sudo", "env", "time", "exec") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", seg[0])):
            seg = seg[1:]
        if seg and (seg[0] == "testbed" or seg[0].endswith("/bin/testbed")):
            out.append(seg[1:])
    return out


def check_invocation(args: list[str], root=None) -> list[str]:
    """What is wrong with ``testbed ARGS``: a subcommand the app does not have, or an option
    the command it is given to does not take. Positional values are not checked; nothing
    after `--` (it goes to the program the command runs). Typer carries its own copy of
    click, so the tree is walked by what its objects do, not by click's classes."""
    import typer

    from testbed.cli import app

    cmd = root or typer.main.get_command(app)
    ctx = cmd.context_class(cmd, info_name="testbed")
    path, problems, i = ["testbed"], [], 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            break
        if a == "..." or a.startswith("["):
            continue
        if a.startswith("-") and len(a) > 1:
            name = a.split("=", 1)[0]
            opts = {o: p for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
            if name in ctx.help_option_names:
                continue
            if name not in opts:
                problems.append(f"`{' '.join(path)}` has no option {name}")
                continue
            p = opts[name]
            if "=" not in a and not p.is_flag and not p.count and name not in p.secondary_opts:
                i += 1  # its value
            continue
        if hasattr(cmd, "list_commands"):  # a group: the word is one of its commands
            sub = cmd.get_command(ctx, a)
            if sub is None:
                problems.append(f"`{' '.join(path)}` has no command {a!r}")
                break
            cmd, path = sub, [*path, a]
            ctx = sub.context_class(sub, parent=ctx, info_name=a)
    return problems


def _doc_invocations() -> list[tuple[str, str, list[str]]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out = []
    for page in pages:
        for where, line in _shell_commands(page.read_text(), str(page.relative_to(ROOT))):
            out.extend((where, line, args) for args in _invocations(line))
    return out


DOC_INVOCATIONS = _doc_invocations()


def test_the_docs_have_shell_examples():
    assert len(DOC_INVOCATIONS) >= 40, [w for w, _, _ in DOC_INVOCATIONS]
    assert any(w.startswith("README.md") for w, _, _ in DOC_INVOCATIONS)


def test_every_testbed_command_in_the_docs_exists():
    bad = [f"{where}: {line}\n    " + "; ".join(problems)
           for where, line, args in DOC_INVOCATIONS if (problems := check_invocation(args))]
    assert not bad, "shell examples name what the CLI does not have:\n" + "\n".join(bad)


def test_the_command_checker_finds_what_does_not_exist():
    doc = """Text.

```console
$ sudo /opt/testbed/bin/testbed link sett --bw 1gbit
$ python3 -m venv .venv && .venv/bin/testbed up three_switch --no-such-flag && FOO=1 testbed monitor up
output that mentions testbed frobnicate is not a command
$ testbed exec w0 -- ping --not-ours -c1 10.0.0.1
$ testbed link set --bottleneck \\
    --bw=100mbit -t tb
```
"""
    lines = _shell_commands(doc, "fake.md")
    assert [w for w, _ in lines] == ["fake.md:4", "fake.md:5", "fake.md:7", "fake.md:8"]
    invocations = [args for _, line in lines for args in _invocations(line)]
    assert invocations[0] == ["link", "sett", "--bw", "1gbit"]
    assert [check_invocation(a) for a in invocations] == [
        ["`testbed link` has no command 'sett'"],
        ["`testbed up` has no option --no-such-flag"],
        [],  # monitor up
        [],  # what follows `--` is ping's
        [],  # the continuation line joined, --bw=VALUE and -t
    ]
    assert check_invocation(["--version"]) == []
    assert check_invocation(["frobnicate"]) == ["`testbed` has no command 'frobnicate'"]
