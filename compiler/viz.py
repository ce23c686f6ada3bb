"""VIZ=out.html: one self-contained HTML report of what the compiler did (no network, no scripts, no external CSS).

For each schedule, the tensor-level UOp graph (the kernel boundaries it chose are outlined). For each kernel,
its UOp graph at every stage: the kernel AST as rangeify produced it, after the kernel optimizations, after
symbolic simplification + decompositions (with each pass's rewrite count), the linearized program; then the
rendered source. Graphs are drawn by a small layered DAG layout (longest-path layers, dummy nodes on long
edges, barycenter ordering sweeps) into inline SVG; CONST leaves are folded into the nodes that use them.
"""
from __future__ import annotations
import html, os, sys, time
from enum import Enum
from baregrad.drivers import settings
from .pattern import graph_rewrite

NODE_H, LINE_H, LAYER_GAP, NODE_GAP, CHAR_W, DUMMY_W, MARGIN = 42, 11, 30, 14, 6.6, 6, 12
FOLDED = {"CONST", "DEVICE"}          # leaves drawn as text inside their users
COLORS = [({"BUFFER", "PARAM", "DEFINE_VAR", "BIND", "IOTA", "DEVICE", "DEFINE_ACC"}, "#d6e9ff"),
          ({"RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP"}, "#fff3c4"),
          ({"REDUCE_AXIS", "REDUCE", "ACC_UPDATE", "ATTEND"}, "#ffd8b0"),
          ({"INDEX", "LOAD", "STORE", "ASSIGN", "COPY", "CONTIGUOUS"}, "#d4f2d4"),
          ({"RANGE", "ENDRANGE", "SPECIAL"}, "#e8dcff"),
          ({"SINK"}, "#e0e0e0")]


def _color(op: str) -> str:
  for ops, color in COLORS:
    if op in ops: return color
  return "#ffffff"


def _fmt(a) -> str:
  if isinstance(a, Enum): return a.name
  if isinstance(a, float): return f"{a:g}"
  if isinstance(a, tuple): return "(" + ", ".join(_fmt(x) for x in a) + ("," if len(a) == 1 else "") + ")"
  return str(a)


def _arg_text(op: str, arg) -> str:
  if arg is None: return ""
  if op == "BUFFER":
    if hasattr(arg, "index") and hasattr(arg, "size"): return f"slot {arg.index} [{arg.size}]"
    if hasattr(arg, "size"): return f"[{arg.size}]"
  text = _fmt(arg)
  return text if len(text) <= 40 else text[:37] + "..."


def _order(roots) -> list:
  order, seen, placed = [], set(), set()
  for root in roots:
    stack = [(root, False)]
    while stack:
      u, expanded = stack.pop()
      if expanded:
        if u not in placed: placed.add(u); order.append(u)
        continue
      if u in seen: continue
      seen.add(u)
      stack.append((u, True))
      stack.extend((s, False) for s in reversed(u.src))
  return order


def graph_table(roots) -> list[dict]:
  """UOps reachable from `roots` (visited in that order) -> [{"op", "dtype", "arg", "src": [indices]}], sources first."""
  order = _order(roots)
  index = {u: i for i, u in enumerate(order)}
  return [{"op": u.op.name, "dtype": getattr(u.dtype, "name", "") if u.dtype is not None else "",
           "arg": _arg_text(u.op.name, u.arg), "src": [index[s] for s in u.src]} for u in order]


# ---- layered layout ----

def layout(nodes: list[dict], marked: set | None = None) -> dict:
  """Positions for the drawn nodes: {"boxes": [(i, x, y, w, lines)], "edges": [[(x, y), ...]], "width", "height"}."""
  drawn = [i for i, n in enumerate(nodes) if not (n["op"] in FOLDED and all(nodes[s]["op"] in FOLDED for s in n["src"]))]
  dset = set(drawn)
  labels = {}
  for i in drawn:
    n = nodes[i]
    lines = [n["op"] + (f" {n['dtype']}" if n["dtype"] else "")]
    if n["arg"]: lines.append(n["arg"])
    consts = [nodes[s] for s in n["src"] if s not in dset]
    if consts:
      text = ", ".join(c["arg"] or c["op"] for c in consts[:3]) + (f" +{len(consts) - 3}" if len(consts) > 3 else "")
      lines.append("\u2190 " + text)
    labels[i] = lines
  # layers: longest path from the sources
  layer = {}
  for i in drawn:    # nodes are in topological order
    layer[i] = 1 + max((layer[s] for s in nodes[i]["src"] if s in dset), default=-1)
  # dummy nodes on edges that skip layers
  nid = len(nodes)
  width_of = {i: max(len(t) for t in labels[i]) * CHAR_W + 14 for i in drawn}
  ups: dict[int, list] = {i: [] for i in drawn}
  downs: dict[int, list] = {i: [] for i in drawn}
  chains = []
  for d in drawn:
    for s in dict.fromkeys(x for x in nodes[d]["src"] if x in dset):
      path = [s]
      for lvl in range(layer[s] + 1, layer[d]):
        layer[nid] = lvl; width_of[nid] = DUMMY_W; ups[nid] = []; downs[nid] = []
        path.append(nid); nid += 1
      path.append(d)
      for a, b in zip(path, path[1:]): downs[a].append(b); ups[b].append(a)
      chains.append(path)
  nlayers = max(layer.values(), default=-1) + 1
  rows: list[list] = [[] for _ in range(nlayers)]
  for v in sorted(layer, key=lambda v: (layer[v], v)): rows[layer[v]].append(v)
  pos = {v: k for row in rows for k, v in enumerate(row)}
  # barycenter ordering sweeps
  for sweep in range(8):
    order = range(1, nlayers) if sweep % 2 == 0 else range(nlayers - 2, -1, -1)
    for l in order:
      nbrs = ups if sweep % 2 == 0 else downs
      def key(v):
        ns = nbrs[v]
        return sum(pos[u] for u in ns) / len(ns) if ns else pos[v]
      rows[l].sort(key=key)
      for k, v in enumerate(rows[l]): pos[v] = k
  # x coordinates: pack, then pull each node toward its neighbours without breaking the order
  def sep(a, b) -> float:    # centre distance of neighbours in a row; bundles of long edges pack tightly
    return (width_of[a] + width_of[b]) / 2 + (3 if a >= len(nodes) and b >= len(nodes) else NODE_GAP)
  x = {}
  for row in rows:
    for k, v in enumerate(row): x[v] = x[row[k - 1]] + sep(row[k - 1], v) if k else width_of[v] / 2
  for it in range(6):
    seq = range(nlayers) if it % 2 == 0 else range(nlayers - 1, -1, -1)
    for l in seq:
      row = rows[l]
      want = []
      for v in row:
        ns = ups[v] + downs[v]
        want.append(sum(x[u] for u in ns) / len(ns) if ns else x[v])
      placed = []
      for k, v in enumerate(row):
        lo = placed[-1] + sep(row[k - 1], v) if k else -1e18
        placed.append(max(want[k], lo))
      for v, px in zip(row, placed): x[v] = px
  left = min((x[v] - width_of[v] / 2 for v in x), default=0)
  for v in x: x[v] += MARGIN - left
  y = {v: MARGIN + layer[v] * (NODE_H + LAYER_GAP) for v in layer}
  boxes = [(i, x[i], y[i], width_of[i], labels[i], i in (marked or ())) for i in drawn]
  edges = []
  for path in chains:
    pts = [(x[path[0]], y[path[0]] + NODE_H)]
    for v in path[1:-1]: pts.append((x[v], y[v] + NODE_H / 2))
    pts.append((x[path[-1]], y[path[-1]]))
    edges.append(pts)
  width = max((x[v] + width_of[v] / 2 for v in x), default=0) + MARGIN
  height = nlayers * (NODE_H + LAYER_GAP) + MARGIN
  return {"boxes": boxes, "edges": edges, "width": width, "height": height}


def svg(nodes: list[dict], marked: set | None = None) -> str:
  g = layout(nodes, marked)
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{g["width"]:.0f}" height="{g["height"]:.0f}" '
         f'viewBox="0 0 {g["width"]:.0f} {g["height"]:.0f}" font-family="monospace" font-size="11">',
         '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto">'
         '<path d="M0,0 L8,4 L0,8 z" fill="#777"/></marker></defs>']
  for pts in g["edges"]:
    d = "M" + " L".join(f"{px:.1f},{py:.1f}" for px, py in pts)
    out.append(f'<path d="{d}" fill="none" stroke="#999" stroke-width="1" marker-end="url(#arrow)"/>')
  for i, cx, cy, w, lines, mark in g["boxes"]:
    n = nodes[i]
    tip = html.escape(f"#{i} {n['op']} {n['dtype']} {n['arg']}")
    stroke = ' stroke="#c0392b" stroke-width="2.5"' if mark else ' stroke="#555"'
    out.append(f'<g><title>{tip}</title><rect x="{cx - w / 2:.1f}" y="{cy:.1f}" width="{w:.1f}" height="{NODE_H}" rx="4" '
               f'fill="{_color(n["op"])}"{stroke}/>')
    top = cy + (NODE_H - LINE_H * len(lines)) / 2 + LINE_H - 2
    for k, line in enumerate(lines):
      weight = ' font-weight="bold"' if k == 0 else ""
      out.append(f'<text x="{cx:.1f}" y="{top + LINE_H * k:.1f}" text-anchor="middle"{weight}>{html.escape(line)}</text>')
    out.append("</g>")
  out.append("</svg>")
  return "\n".join(out)


# ---- collection (called from the compiler through hcq.trace.viz_event) ----

class VizLog:
  def __init__(self, path: str):
    self.path = path
    self.schedules: list[dict] = []
    self.kernels: list[dict] = []

  def add(self, kind: str, **data):
    if kind == "schedule": self.schedules.append(self._schedule(**data))
    elif kind == "kernel": self.kernels.append(self._kernel(**data))

  def _schedule(self, sink, schedule) -> dict:
    nodes = graph_table([sink])
    order = _order([sink])
    mat = set(schedule.materialized)
    marked = {k for k, u in enumerate(order) if u in mat}
    names = [getattr(it, "name", "copy") for it in schedule.items]
    return {"nodes": nodes, "marked": marked, "kernels": names}

  def _kernel(self, spec, launch, opt_ast, passes, ast, program, source, name) -> dict:
    """One kernel's stages as codegen ran them: `opt_ast` is its AST after the optimizations, `passes` the
    (label, patterns, ctx) rewrites it ran next (compiler/codegen.py's rewrite_passes), rerun here for their counts."""
    stages = [{"title": "rangeify: the kernel AST", "nodes": graph_table([spec.ast]), "rewrites": None}]
    if "global_size" in launch: what = "global loops -> thread ids"
    elif "opts" in launch:
      what = ", ".join(f"{o.op}({o.axis}, {o.amount})" if hasattr(o, "op") else str(o) for o in launch["opts"]) or "none"
    else: what = "OPT=0"
    stages.append({"title": f"optimizations: {what}", "nodes": graph_table([opt_ast]), "rewrites": None})
    counts = {}
    a = opt_ast
    for label, pm, ctx in passes:
      st: dict = {}
      a = graph_rewrite(a, pm, ctx=ctx, stats=st)
      counts[label] = st.get("rewrites", 0)
    stages.append({"title": "symbolic + decompositions", "nodes": graph_table([ast]), "rewrites": counts})
    stages.append({"title": "linearized program", "nodes": graph_table(list(program)), "rewrites": None,
                   "listing": [f"{k:4d} {u.op.name:12s} {getattr(u.dtype, 'name', '') if u.dtype is not None else '':10s} "
                               f"{_arg_text(u.op.name, u.arg)}" for k, u in enumerate(program)]})
    return {"name": name, "device": spec.device, "stages": stages, "source": str(source), "meta": dict(launch)}

  # ---- the page ----

  def write(self):
    try:
      page = self.render()
      tmp = f"{self.path}.tmp{os.getpid()}"
      with open(tmp, "w") as f: f.write(page)
      os.replace(tmp, self.path)
      print(f"VIZ: wrote {self.path} ({len(self.schedules)} schedules, {len(self.kernels)} kernels)", file=sys.stderr)
    except Exception as e:
      print(f"VIZ: could not write {self.path}: {type(e).__name__}: {e}", file=sys.stderr)

  def render(self) -> str:
    e = html.escape
    parts = [PAGE_HEAD.format(title=e(f"baregrad VIZ: {' '.join(sys.argv)}"), when=time.strftime("%Y-%m-%d %H:%M:%S"),
                              argv=e(" ".join(sys.argv)))]
    parts.append("<nav><h2>Contents</h2><ul>")
    for k, s in enumerate(self.schedules):
      parts.append(f'<li><a href="#s{k}">schedule {k}</a>: {len(s["kernels"])} items</li>')
    for k, kern in enumerate(self.kernels):
      parts.append(f'<li><a href="#k{k}">kernel {k}: {e(kern["name"])}</a> ({e(kern["device"])})</li>')
    parts.append("</ul></nav>")
    for k, s in enumerate(self.schedules):
      parts.append(f'<section id="s{k}"><h2>schedule {k}: tensor graph</h2>'
                   f'<p>{len(s["nodes"])} nodes; outlined in red: the {len(s["marked"])} nodes materialized into buffers '
                   f'(kernel boundaries). Items: {e(", ".join(s["kernels"]))}</p>'
                   f'<div class="graph">{svg(s["nodes"], s["marked"])}</div></section>')
    for k, kern in enumerate(self.kernels):
      parts.append(f'<section id="k{k}"><details{" open" if k < 3 else ""}><summary><h2>kernel {k}: {e(kern["name"])} '
                   f'<small>{e(kern["device"])} {e(str(kern["meta"]))}</small></h2></summary>')
      for n, st in enumerate(kern["stages"]):
        rw = "" if st["rewrites"] is None else "; rewrites: " + ", ".join(f"{a} {b}" for a, b in st["rewrites"].items())
        parts.append(f'<h3>{n + 1}. {e(st["title"])} <small>({len(st["nodes"])} nodes{e(rw)})</small></h3>'
                     f'<div class="graph">{svg(st["nodes"])}</div>')
        if "listing" in st: parts.append(f'<details><summary>listing</summary><pre>{e(chr(10).join(st["listing"]))}</pre></details>')
      parts.append(f'<h3>{len(kern["stages"]) + 1}. rendered source</h3><pre class="src">{e(kern["source"])}</pre></details></section>')
    parts.append("</body></html>")
    return "\n".join(parts)


PAGE_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
h2 {{ display: inline; font-size: 1.15em; }} h3 {{ font-size: 1em; margin: 14px 0 4px; }}
small {{ color: #666; font-weight: normal; }}
section {{ border-top: 1px solid #ccc; padding: 8px 0; }}
.graph {{ overflow: auto; max-height: 80vh; border: 1px solid #eee; background: #fcfcfc; }}
pre {{ background: #f6f6f6; padding: 8px; overflow: auto; font-size: 12px; }}
nav ul {{ columns: 2; font-size: 0.9em; }}
</style></head><body>
<h1>baregrad VIZ</h1><p>{argv} &mdash; {when}</p>
"""


# ---- the hook the compiler calls (VIZ=out.html); collected here and written at exit ----
VIZ = settings.VIZ
_log = None


def viz_event(kind: str, **data):
  global _log
  if _log is None:
    import atexit
    _log = VizLog(VIZ)
    atexit.register(_log.write)
  _log.add(kind, **data)
