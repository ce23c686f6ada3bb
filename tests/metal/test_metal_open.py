"""How the Metal driver decides that Metal.framework is there on a Mac (no Mac needed: the platform and dlopen are
stood in for). Since macOS 11 system frameworks exist only in the dyld shared cache: the file at their path is
missing, as it is on this machine, while dlopen finds them (Apple, macOS Big Sur 11.0.1 release notes)."""
import os, sys
from baregrad.drivers import settings
from baregrad.drivers.metal import framework


def test_dlopen_decides_not_the_file(monkeypatch):
  monkeypatch.setattr(sys, "platform", "darwin")
  opened = []
  monkeypatch.setattr(framework, "_dlopen", opened.append)
  with settings.override(EMU=0): assert framework.available() == (True, "")
  assert opened == [framework.METAL] and not os.path.exists(framework.METAL)


def test_a_failed_dlopen_is_the_reason(monkeypatch):
  monkeypatch.setattr(sys, "platform", "darwin")
  def fail(path): raise OSError(f"dlopen({path}, 0x0001): tried: '{path}' (no such file), '{path}' (not in dyld cache)")
  monkeypatch.setattr(framework, "_dlopen", fail)
  with settings.override(EMU=0): ok, why = framework.available()
  assert not ok and why.startswith(f"dlopen({framework.METAL}) failed") and "not in dyld cache" in why
