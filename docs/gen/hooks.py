"""MkDocs hook: the reference parts of the site are generated from the code at build time.

A page asks for generated content with a marker on a line of its own:

    <!-- gen:cli -->       every command of the Typer app ``testbed.cli:app``
    <!-- gen:metrics -->   every Prometheus metric the exporters in ``collectors`` serve
    <!-- gen:actions -->   every registered plan action (the ledger's vocabulary)
    <!-- gen:schemes -->   every gradient-communication scheme of ``workloads.schemes``

Nothing here knows the commands, metrics, actions or schemes by name: the CLI is walked
as a click command tree (so sub-apps may be added or regrouped freely), the collectors
are found by their base class and asked for their metric families, and so on. A marker
that cannot be generated fails the build (``mkdocs build --strict`` then fails loudly
rather than shipping a stale page).

Run ``python docs/gen/hooks.py cli|metrics|actions|schemes`` to print one part.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- gen:([a-z]+) -->$", re.M)


# --------------------------------------------------------------------------- helpers
def _import_path() -> None:
    """Import testbed, workloads and collectors from this checkout (installed or not)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes and angle brackets escaped outside code spans,
    RST-style ``code`` turned into Markdown code, one line."""
    text = re.sub(r"``([^`]+)``", r"`\1`", " ".join(str(text).split()))
    text = re.sub(r":(?:mod|class|func|meth|attr):`([^`]+)`", r"`\1`", text)
    parts = text.split("`")
    for i, p in enumerate(parts):
        if i % 2 == 0:  # prose (Python-Markdown keeps a pipe inside a code span literal)
            p = p.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
            p = p.replace("|", r"\|")
        parts[i] = p
    return "`".join(parts) if len(parts) % 2 == 1 else "`".join(parts).replace("`", "'")


def _code(text: str) -> str:
    """A table cell holding code: backticks chosen so the content cannot end them."""
    text = " ".join(str(text).split())  # a pipe inside a code span stays literal in a table
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _first_paragraph(doc: str | None) -> str:
    doc = inspect.cleandoc(doc or "")
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


# --------------------------------------------------------------------------- CLI
def _walk(cmd, path: list[str], parent=None):
    """(path, command, context) for the command and every visible sub-command, depth first.

    Duck-typed on click's interface (typer may vendor its own click): a group is anything
    with ``list_commands``/``get_command``."""
    ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent)
    yield path, cmd, ctx
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from _walk(sub, path + [name], ctx)


def _usage(cmd, ctx) -> str:
    """``[OPTIONS] FILE [NAME] CMD...``: options, then the arguments in order."""
    words = []
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    if any(p.param_type_name == "option" and p.name != "help" for p in params) or not params:
        words.append("[OPTIONS]")
    group = hasattr(cmd, "list_commands")
    extra = not group and bool((getattr(cmd, "context_settings", None) or {}).get("allow_extra_args"))
    for p in params:
        if p.param_type_name != "argument":
            continue
        if p.metavar:  # the command spelled its arguments out itself
            words.append(p.metavar)
            continue
        word = p.name.upper()
        if p.nargs == -1:
            if extra:  # `exec NODE -- CMD...`: the variadic argument is what follows `--`
                words.append(f"-- {word}...")
                extra = False
                continue
            word += "..."
        words.append(word if p.required else f"[{word}]")
    if group:
        words.append("COMMAND [ARGS]...")
    if extra:
        words.append("[-- EXTRA...]")
    return " ".join(words)


def _help_text(cmd) -> str:
    text = inspect.cleandoc(cmd.help or cmd.short_help or "")
    lines = [l for l in text.splitlines() if l.strip() != "\b"]  # click's no-rewrap marker
    text = "\n".join(lines)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return text.replace("<", "&lt;").replace(">", "&gt;") if "`" not in text else text


def gen_cli() -> str:
    _import_path()
    import typer

    from testbed.cli import app

    root = typer.main.get_command(app)
    out: list[str] = []
    commands = list(_walk(root, ["testbed"]))
    out.append("| command | what it does |\n| --- | --- |")
    for path, cmd, _ in commands[1:]:
        anchor = "-".join(path)
        out.append(f"| [`{' '.join(path)}`](#{anchor}) | {_cell(_first_paragraph(cmd.help or cmd.short_help))} |")
    out.append("")
    for path, cmd, ctx in commands[1:]:
        name = " ".join(path)
        depth = 2 if len(path) == 2 else 3
        out.append(f"{'#' * depth} `{name}` {{#{'-'.join(path)}}}\n")
        help_text = _help_text(cmd)
        if help_text:
            out.append(help_text + "\n")
        out.append(f"```text\n{name} {_usage(cmd, ctx)}".rstrip() + "\n```\n")
        if hasattr(cmd, "list_commands"):
            subs = [n for n in cmd.list_commands(ctx) if not getattr(cmd.get_command(ctx, n), "hidden", False)]
            out.append("Sub-commands: " + ", ".join(f"[`{n}`](#{'-'.join(path + [n])})" for n in subs) + ".\n")
        rows = []
        for p in cmd.get_params(ctx):
            if getattr(p, "hidden", False) or p.name == "help":
                continue
            record = p.get_help_record(ctx)
            if record is None:  # click returns None for arguments: name them ourselves
                record = (p.human_readable_name, getattr(p, "help", "") or "")
            decl, text = record
            kind = "argument" if p.param_type_name == "argument" else "option"
            rows.append(f"| {_code(decl)} | {kind} | {_cell(text)} |")
        if rows:
            out.append("| argument / option | | meaning |\n| --- | --- | --- |")
            out.extend(rows)
            out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- metrics
def _collector_classes():
    """Every prometheus_client Collector subclass defined in a public module of ``collectors``."""
    import collectors
    from prometheus_client.registry import Collector

    for m in pkgutil.iter_modules(collectors.__path__, "collectors."):
        if m.name.rsplit(".", 1)[-1].startswith("_"):
            continue  # __main__ would run the exporter
        mod = importlib.import_module(m.name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__ or cls is Collector:
                continue
            if Collector in cls.__mro__:  # a Protocol in newer prometheus_client: no issubclass
                yield mod, cls


def _instantiate(cls):
    """A collector with nothing to read: no testbed is up in an empty state directory, and
    no run directory is given."""
    for args in ((), ([],)):
        try:
            return cls(*args)
        except TypeError:
            continue
    raise RuntimeError(f"cannot construct {cls.__module__}.{cls.__name__} for the metrics table")


def gen_metrics() -> str:
    _import_path()
    saved = os.environ.get("TESTBED_STATE_DIR")
    rows = []
    with tempfile.TemporaryDirectory(prefix="testbed-docs-") as state:
        os.environ["TESTBED_STATE_DIR"] = state
        try:
            for mod, cls in _collector_classes():
                collector = _instantiate(cls)
                try:
                    families = list(collector.collect())
                finally:
                    close = getattr(collector, "close", None)
                    if callable(close):
                        close()
                for fam in families:
                    labels = getattr(fam, "_labelnames", None)
                    name = fam.name
                    if fam.type == "counter":
                        name += "_total"
                    elif fam.type == "histogram":
                        name += "_bucket`, `_sum`, `_count"
                    rows.append((f"`{name}`", fam.type, ", ".join(labels) if labels else "-",
                                 _cell(fam.documentation), f"`{mod.__name__}`"))
        finally:
            if saved is None:
                os.environ.pop("TESTBED_STATE_DIR", None)
            else:
                os.environ["TESTBED_STATE_DIR"] = saved
    if not rows:
        raise RuntimeError("no metric families found in collectors")
    out = ["| metric | type | labels | meaning | exporter |", "| --- | --- | --- | --- | --- |"]
    out += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- actions
def gen_actions() -> str:
    _import_path()
    actions = importlib.import_module("testbed.plan.actions")
    # action classes live with what they make and register on import
    for pkg_name in ("testbed.nodes", "testbed.hosts"):
        pkg = importlib.import_module(pkg_name)
        for m in pkgutil.iter_modules(pkg.__path__, pkg_name + "."):
            importlib.import_module(m.name)
    out = ["| action | defined in | fields (its ledger entry) | what it is |", "| --- | --- | --- | --- |"]
    for name, cls in sorted(actions.registered().items(), key=lambda kv: (kv[1].__module__, kv[0])):
        doc = _first_paragraph(cls.__doc__)
        if doc.startswith(f"{name}("):  # dataclass' generated signature, not prose
            doc = ""
        fields = ", ".join(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ""
        out.append(f"| `{name}` | `{cls.__module__}` | {fields} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- schemes
def gen_schemes() -> str:
    _import_path()
    schemes = importlib.import_module("workloads.schemes")
    out = ["| scheme | what it sends | hyper-parameters (variant spec) | module |", "| --- | --- | --- | --- |"]
    for s in schemes.SCHEMES.values():
        params = ", ".join(f"`{p}`" for p in s.params) or "-"
        if s.positional:
            params += f" (bare values set {', '.join(f'`{p}`' for p in s.positional)})"
        words = getattr(s, "words", ())
        if words:
            params += "; words: " + ", ".join(f"`{w}`" for w, _, _ in words)
        module = f"`workloads/schemes/{s.module}.py`"
        if getattr(s, "function", "attach") != "attach":
            module += f" (`{s.function}`)"
        out.append(f"| `{s.name}` | {_cell(s.summary)} | {params} | {module} |")
    return "\n".join(out) + "\n"


GENERATORS = {"cli": gen_cli, "metrics": gen_metrics, "actions": gen_actions, "schemes": gen_schemes}


# --------------------------------------------------------------------------- MkDocs
_cache: dict[str, str] = {}


def on_pre_build(config, **kwargs):
    _cache.clear()  # `mkdocs serve` rebuilds: regenerate from the code as it is now


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    def fill(m: re.Match) -> str:
        what = m.group(1)
        if what not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown marker gen:{what}; known: {', '.join(GENERATORS)}")
        if what not in _cache:
            _cache[what] = GENERATORS[what]()
        return _cache[what]

    return MARKER.sub(fill, markdown)


if __name__ == "__main__":
    for part in sys.argv[1:] or list(GENERATORS):
        print(GENERATORS[part]())
