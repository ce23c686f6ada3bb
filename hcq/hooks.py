"""Where the tools watch the runtime (CAPTURE=run.bgq, PROFILE=out.json).

The runtime's hot paths -- Device.synchronize and copyin, run_schedule, a JIT graph's build and replay -- test one
flag, `active`, and call the installed hooks only when it is true; nothing else runs when none are installed.
hcq/trace.py installs its hooks when CAPTURE or PROFILE is set. It sits above the modules that call them (it uses
devices, signals and queues), so they reach it only through this module and never import it.

The installed object has these methods:
    on_run_schedule(items, sync) -> bool        True when the hook ran the items itself (the caller returns)
    on_graph_build(graph, queue, role)          before the graph's queues are bound
    on_graph_replay(graph, inputs, outputs, var_vals, timeline_value)
    on_copyin(dev, buf, data)                   before host bytes are written into a buffer
    on_synchronize(dev, timeout)                instead of the device's timeline wait
"""
from __future__ import annotations

active = False
installed = None


def install(hooks) -> None:
  """Call `hooks`' methods from the runtime from now on (None: stop)."""
  global active, installed
  installed, active = hooks, hooks is not None
