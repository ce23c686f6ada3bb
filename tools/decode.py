"""`baregrad decode run.bgq [--command I]`: every command of a capture with the words its submission handed the
engines, decoded by the drivers' own packet tables (drivers/decode.py): PM4 and SDMA packets (with the indirect
buffers they point at), GPFIFO entries with their pushbuffer methods and QMD fields, the CPU command processor's
packets, Metal command words. A capture keeps those words and the memory they reference as the driver wrote them
(tools/BGQ_FORMAT.md, `hw`), so decoding needs no device."""
from __future__ import annotations
import sys
from baregrad.drivers.decode import decode, words_of, read_from


def describe(i: int, c: dict, cap) -> str:
  op = c["op"]
  if op == "exec":
    return (f"#{i} exec {c['name']} on {c['device']} (program {c['program']}), grid {tuple(c['global_size'])} x "
            f"{tuple(c['local_size'])}, {len(c['bufs'])} buffers, submission {c['sub']}")
  if op == "copy": return f"#{i} copy {c['nbytes']} bytes on {c['device']} ({c['name']}), submission {c['sub']}"
  if op == "write": return f"#{i} host write of {c['dst'][2]} bytes into allocation {c['dst'][0]} on {c['device']}"
  if op == "submit": return f"#{i} submit {c['sub']} to {c['device']} ({c['origin']})"
  return f"#{i} {op} {c['device']}"


def hw_lines(c: dict, cap, indent: str = "  ") -> list[str]:
  """The recorded words of command record `c`, decoded."""
  out = []
  for seg in c.get("hw", []):
    fmt = seg["format"]
    words = words_of(fmt, cap.blob(seg["words"]))
    memory = {addr: cap.blob(b) for addr, b in seg["memory"]}
    out.append(f"{indent}{seg['queue']} queue: {len(words)} {fmt.upper()} words")
    out += decode(fmt, words, None, read_from(memory), indent + "  ")
  return out


def run(path: str, command: int | None = None, out=None) -> int:
  from baregrad.hcq.capture import CaptureError, load_capture
  out = out or sys.stdout
  try: cap = load_capture(path)
  except CaptureError as e:
    print(f"baregrad decode: {e}", file=sys.stderr)
    return 2
  cmds = cap.commands
  if not any("hw" in c for c in cmds):
    print(f"{path}: this capture holds no engine words (it was written before captures recorded them); capture the "
          f"program again to decode it", file=out)
  if command is not None:
    if not 0 <= command < len(cmds):
      print(f"baregrad decode: --command {command} is not a command of {path} (it has {len(cmds)}: 0..{len(cmds) - 1}; "
            f"`baregrad replay {path} --list` lists them)", file=sys.stderr)
      return 2
    c = cmds[command]
    print(describe(command, c, cap), file=out)
    if c["op"] in ("exec", "copy"):   # its words are its submission's
      k, sub = next(((k, s) for k, s in enumerate(cmds) if s["op"] == "submit" and s["sub"] == c["sub"]
                     and s["device"] == c["device"]), (None, None))
      if sub is not None:
        print(f"  in {describe(k, sub, cap)[len(str(k)) + 2:]}:", file=out)
        for line in hw_lines(sub, cap, "    "): print(line, file=out)
    else:
      for line in hw_lines(c, cap): print(line, file=out)
    return 0
  for i, c in enumerate(cmds):
    print(describe(i, c, cap), file=out)
    for line in hw_lines(c, cap): print(line, file=out)
  return 0
