"""``testbed graph``: one self-contained HTML page that draws a testbed, live with ``--serve``.

The page (no CDN, no file beside it: SVG drawn by a few lines of inline script from the
model embedded as JSON) shows every node (workers, switches, the host each is on) and every
link with its shape per direction (rate, delay, loss) and the bottlenecks marked, as
containerlab's ``graph`` shows a lab. With ``--serve`` it is served on the loopback under a
random secret path (the URL printed is the only way in, as a Jupyter token) and redraws
every second from :func:`state`: each link direction's utilisation, from two scrapes of the
testbed's own link exporter (transmit bytes over its configured capacity, so a live shape
change or a trace shows), and the newest run's iteration and accuracy from that run's
exporter, both asked with the owner's token.

Layout: switches in rows by their distance from the core (the switch that reaches the
others in fewest hops), workers in a row under their switch.
"""

from __future__ import annotations

import html
import json
from collections import deque
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.model.topology import DIRECTIONS, Topology

ROW_H, COL_W, MARGIN = 150, 110, 60


def _layout(topo: Topology) -> dict[str, tuple[float, float]]:
    """(x, y) of every node: switches by hop distance from the core switch, workers under theirs."""
    nbr: dict[str, list[str]] = {n.name: [] for n in topo.nodes}
    for l in topo.links:
        a, b = l.endpoints
        nbr[a].append(b)
        nbr[b].append(a)
    kind = {n.name: n.kind for n in topo.nodes}
    switches = [n for n in nbr if kind[n] == "switch"]

    def depths(start: str) -> dict[str, int]:
        d, todo = {start: 0}, deque([start])
        while todo:
            u = todo.popleft()
            for v in nbr[u]:
                if v not in d and kind[v] == "switch":
                    d[v] = d[u] + 1
                    todo.append(v)
        return d

    depth: dict[str, int] = {}
    if switches:
        core = min(switches, key=lambda s: (max(depths(s).values()), -len(depths(s)), s))
        depth = depths(core)
        for s in switches:  # a switch the core does not reach: below the rest
            depth.setdefault(s, max(depth.values()) + 1)
    rows: dict[int, list[str]] = {}
    for s in switches:
        rows.setdefault(depth[s], []).append(s)
    under: dict[str, list[str]] = {s: [] for s in switches}
    loose: list[str] = []
    for n in nbr:
        if kind[n] != "switch":
            up = [v for v in nbr[n] if kind[v] == "switch"]
            (under[min(up, key=lambda v: (depth[v], v))] if up else loose).append(n)
    bottom = max(rows, default=-1) + 1
    pos: dict[str, tuple[float, float]] = {}
    x: float = MARGIN
    for s in sorted(switches, key=lambda s: (depth[s], s)):  # each leaf switch gets its workers' width
        width = max(1, len(under[s]))
        if depth[s] == bottom - 1 or not any(depth[v] > depth[s] for v in nbr[s] if v in depth):
            for i, w in enumerate(sorted(under[s])):
                pos[w] = (x + i * COL_W, MARGIN + (bottom + 0.3) * ROW_H)
            pos[s] = (x + (width - 1) * COL_W / 2, MARGIN + depth[s] * ROW_H)
            x += width * COL_W + COL_W / 2
    for d in sorted(rows, reverse=True):  # inner switches above the middle of what they reach below
        for s in rows[d]:
            if s in pos:
                continue
            below = [pos[v][0] for v in nbr[s] if v in pos and (v not in depth or depth[v] > d)]
            pos[s] = (sum(below) / len(below) if below else x, MARGIN + d * ROW_H)
            for i, w in enumerate(sorted(under[s])):
                pos[w] = (pos[s][0] + (i - (len(under[s]) - 1) / 2) * COL_W, MARGIN + (d + 0.6) * ROW_H)
    for i, n in enumerate(sorted(loose)):
        pos[n] = (MARGIN + i * COL_W, MARGIN + (bottom + 1.2) * ROW_H)
    return pos


def _shape(shape) -> dict:
    return {"rate": str(shape.rate), "rate_bps": shape.rate.bps, "delay": str(shape.delay) if shape.delay else "",
            "loss": str(shape.loss) if shape.loss else ""}


def model(topo: Topology) -> dict:
    """What the page draws: nodes with positions, links with their shapes per direction."""
    pos = _layout(topo)
    hosts = {n.name: n.host or "local" for n in topo.nodes}
    return {"name": topo.name,
            "nodes": [{"name": n.name, "kind": n.kind, "host": hosts[n.name], "x": pos[n.name][0],
                       "y": pos[n.name][1]} for n in topo.nodes],
            "links": [{"index": l.index, "name": l.name, "a": l.endpoints[0], "b": l.endpoints[1],
                       "type": l.type, "bottleneck": l.bottleneck, **{d: _shape(l.shape(d)) for d in DIRECTIONS}}
                      for l in topo.links]}


_SCRIPT = """
const M = JSON.parse(document.getElementById('model').textContent);
const NS = 'http://www.w3.org/2000/svg', svg = document.getElementById('graph');
const at = Object.fromEntries(M.nodes.map(n => [n.name, n]));
function el(tag, attrs, parent, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  (parent || svg).appendChild(e);
  return e;
}
let w = 0, h = 0;
for (const n of M.nodes) { w = Math.max(w, n.x + 120); h = Math.max(h, n.y + 80); }
svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
for (const l of M.links) {
  const a = at[l.a], b = at[l.b], g = el('g', {class: 'link' + (l.bottleneck ? ' bottleneck' : ''),
    id: 'link-' + l.index, 'data-name': l.name});
  el('line', {x1: a.x, y1: a.y, x2: b.x, y2: b.y}, g);
  const mx = (a.x + b.x) / 2, my = (a.y + b.y) / 2;
  const shape = s => [s.rate, s.delay, s.loss && ('loss ' + s.loss)].filter(Boolean).join(' ');
  el('text', {x: mx + 6, y: my - 4, class: 'shape'}, g, shape(l.forward) +
     (shape(l.reverse) !== shape(l.forward) ? ' / ' + shape(l.reverse) : ''));
  for (const [i, d] of ['forward', 'reverse'].entries())
    el('text', {x: mx + 6, y: my + 10 + 12 * i, class: 'util', id: `util-${l.index}-${d}`,
                'data-utilisation': ''}, g, '');
}
for (const n of M.nodes) {
  const g = el('g', {class: 'node ' + n.kind, id: 'node-' + n.name});
  if (n.kind === 'switch') el('rect', {x: n.x - 28, y: n.y - 16, width: 56, height: 32, rx: 6}, g);
  else el('circle', {cx: n.x, cy: n.y, r: 18}, g);
  el('text', {x: n.x, y: n.y + 4, 'text-anchor': 'middle'}, g, n.name);
  if (n.host !== 'local') el('text', {x: n.x, y: n.y + 32, 'text-anchor': 'middle', class: 'host'}, g, n.host);
}
async function tick() {
  try {
    const r = await fetch('state.json', {cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    const s = await r.json();
    for (const l of M.links) {
      let most = 0;
      for (const d of ['forward', 'reverse']) {
        const u = s.utilisation[l.index + ' ' + d], t = document.getElementById(`util-${l.index}-${d}`);
        t.setAttribute('data-utilisation', u === undefined || u === null ? '' : u.toFixed(4));
        t.textContent = u === undefined || u === null ? '' : `${d === 'forward' ? '→' : '←'} ${(100 * u).toFixed(0)} %`;
        most = Math.max(most, u || 0);
      }
      document.getElementById('link-' + l.index).classList.toggle('busy', most > 0.5);
    }
    const run = s.run;
    document.getElementById('run').textContent = run ? `run ${run.run_id}: ${run.scheme}, iteration ` +
      `${run.iteration ?? '-'}, accuracy ${run.accuracy == null ? '-' : run.accuracy.toFixed(4)}` : 'no run';
    document.getElementById('status').textContent = 'live, ' + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById('status').textContent = 'not live: ' + e.message;
  }
}
if (document.body.dataset.live === 'true') { tick(); setInterval(tick, 1000); }
"""

_STYLE = """
body { font: 13px sans-serif; margin: 1em; color: #222; }
svg { width: 100%; height: auto; border: 1px solid #ddd; }
.link line { stroke: #999; stroke-width: 2; }
.link.bottleneck line { stroke: #c60; stroke-width: 4; }
.link.busy line { stroke: #d00; }
.shape { fill: #555; font-size: 11px; }
.util { fill: #06c; font-size: 11px; }
.node circle { fill: #cde; stroke: #346; }
.node.switch rect { fill: #eed; stroke: #663; }
.host { fill: #888; font-size: 10px; }
"""


def page(m: dict, live: bool = False) -> str:
    """The page: everything inline (the model as JSON, escaped so no string in it can close
    the script element)."""
    data = json.dumps(m).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    title = html.escape(f"testbed {m['name']}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{_STYLE}</style></head>\n<body data-live=\"{'true' if live else 'false'}\">"
            f"<h1>{title}</h1><p><span id=\"run\"></span> · <span id=\"status\"></span></p>"
            f"<svg id=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"{title}\"></svg>\n"
            f"<script id=\"model\" type=\"application/json\">{data}</script>\n<script>{_SCRIPT}</script>"
            "</body></html>\n")


def write(m: dict, out: Path) -> None:
    """The static page into ``out`` (written whole, never through a link: OutDir's rules)."""
    from testbed.common.outdir import OutDir

    if out.name in ("", ".", "..") or out.is_dir():
        raise TestbedError(f"--out {out}: a file name, not a folder", "e.g. --out graphs/three_switch.html")
    with OutDir(out.parent, "--out") as d:
        d.write_text(out.name, page(m))
