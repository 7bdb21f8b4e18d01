"""Started first by a replicated Python app (PYTHONPATH names this folder): when the
process has a gRPC relay (LLFT_GRPC_RELAY=host:port), grpc.insecure_channel returns a
RelayChannel (determinizer/grpcrelay/channel.py) once the app imports grpc.

It leaves no trace the app could see: this folder leaves sys.path, PYTHONPATH and
LLFT_GRPC_RELAY are restored/removed from os.environ (children start as the app's
would), and a sitecustomize of the installation's own still runs.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _undo_path() -> None:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    before = os.environ.pop("LLFT_PYTHONPATH_BEFORE", None)
    if before is None:                       # there was none
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before


def _load_channel():
    """channel.py, loaded by path: the app's interpreter need not have llft installed."""
    import importlib.util
    pkg_dir = os.path.dirname(_HERE)
    spec = importlib.util.spec_from_file_location(
        "_llft_grpcrelay", os.path.join(pkg_dir, "__init__.py"),
        submodule_search_locations=[pkg_dir])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pkg
    spec.loader.exec_module(pkg)
    return importlib.import_module("_llft_grpcrelay.channel")


def _install(relay: str) -> None:
    import importlib
    import importlib.abc
    import importlib.machinery

    host, _, port = relay.rpartition(":")
    addr = (host, int(port))

    def patch(grpc_module) -> None:
        RelayChannel = _load_channel().RelayChannel

        def insecure_channel(target, options=None, compression=None):
            return RelayChannel(addr, target, options)
        insecure_channel.__doc__ = grpc_module.insecure_channel.__doc__
        grpc_module.insecure_channel = insecure_channel

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "grpc":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec

    if "grpc" in sys.modules:
        patch(sys.modules["grpc"])
    else:
        sys.meta_path.insert(0, Finder())


_undo_path()
_relay = os.environ.pop("LLFT_GRPC_RELAY", None)
if _relay:
    _install(_relay)
_self = sys.modules.pop("sitecustomize")
try:                                          # the installation's own, if any
    import sitecustomize  # noqa: F401
except ImportError:
    sys.modules["sitecustomize"] = _self      # the import system looks its result up
