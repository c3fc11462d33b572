"""A user's own code by import path: ``python:FILE.py:FUNCTION`` or ``python:package.module:FUNCTION``.

``model.name``, ``data.name``, ``task.loss`` and ``task.metric`` accept such
a spec. A relative file path is resolved against the config file's folder
(``config.files.anchor_plugin_files``; in a ``--set`` override, the working
directory) when the config is read and stored absolute, so every process of a run (ray workers
included) loads the same file; a module path is imported with the working
directory on ``sys.path``, as ``python -m`` would. Anything that goes wrong
is one ``ConfigError`` naming the plug-in.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.errors import ConfigError
from shoal.registry import PLUGIN_PREFIX as PREFIX
_FILE_MODULE = "shoal_plugin_"  # the prefix of a plug-in file's module name
_loaded: dict[str, Callable[..., Any]] = {}


def is_plugin(name: str) -> bool:
    return name.startswith(PREFIX)


def split_spec(spec: str) -> tuple[str, str]:
    """``python:TARGET:FUNCTION`` -> (TARGET, FUNCTION); ValueError when malformed."""
    body = spec[len(PREFIX):]
    target, sep, function = body.rpartition(":")
    if not sep or not target or not function.isidentifier():
        raise ValueError(f"{spec!r}: expected python:FILE.py:FUNCTION or python:package.module:FUNCTION")
    return target, function


def resolve_spec(spec: str) -> str:
    """The spec with a file path made absolute (checked to exist); module paths are kept as written."""
    target, function = split_spec(spec)
    if not target.endswith(".py"):
        return spec
    path = Path(target).expanduser()
    if not path.is_file():
        raise ValueError(f"{spec!r}: file {target} not found")
    return f"{PREFIX}{path.resolve()}:{function}"


def load_function(spec: str, what: str) -> Callable[..., Any]:
    """Import the plug-in's function (once per process); ``what`` names the key in errors."""
    if spec in _loaded:
        return _loaded[spec]
    try:
        target, function = split_spec(spec)
    except ValueError as err:
        raise ConfigError(f"{what}: {err}") from None
    module = _import_file(target, what) if target.endswith(".py") else _import_module(target, what)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError(f"{what} {spec!r}: {target} has no function {function!r}")
    _loaded[spec] = fn
    return fn


def _import_file(target: str, what: str) -> Any:
    path = Path(target)
    if not path.is_file():  # on another node of a Ray cluster the file's folder was shipped onto sys.path
        try:
            return importlib.import_module(path.stem)
        except ImportError:
            raise ConfigError(f"{what}: plug-in file {target} not found") from None
    name = f"{_FILE_MODULE}{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's code: any failure is bad input, reported in one line
        del sys.modules[name]
        raise ConfigError(f"{what}: importing {target} failed: {type(err).__name__}: {_first_line(err)}") from None
    return module


def file_modules() -> list[Any]:
    """The modules of the plug-in files loaded so far: their names exist only in this process, so objects of their
    classes (a scheme's policy, a compressor) must be pickled by value to reach another process."""
    return [module for name, module in sorted(sys.modules.items()) if name.startswith(_FILE_MODULE)]


def _import_module(target: str, what: str) -> Any:
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(target)
    except Exception as err:  # noqa: BLE001 - as above
        raise ConfigError(f"{what}: importing {target} failed: {type(err).__name__}: {_first_line(err)}") from None


def load_class(spec: str, base: type, needs: str) -> type:
    """A user's class from ``spec``, checked to be a concrete subclass of ``base`` (``needs``: what it must define)."""
    cls = load_function(spec, "plug-in")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        where = base.__module__.rpartition(".")[0] or base.__module__
        raise ConfigError(f"{spec}: {getattr(cls, '__name__', cls)!s} is not a {where}.{base.__name__} subclass "
                          f"(it needs {needs})")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ConfigError(f"{spec}: {cls.__name__} does not define {', '.join(missing)}")
    return cls


def check_options(fn: Any, options: dict[str, Any], where: str, fixed: tuple[str, ...] = ()) -> None:
    """Refuse an option the built-in ``fn`` does not take (its keyword-only parameters but ``fixed``), in one line."""
    taken = [p.name for p in inspect.signature(fn).parameters.values()
             if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in fixed]
    unknown = sorted(set(options) - set(taken))
    if unknown:
        choices = f"it takes {', '.join(taken)}" if taken else "it takes none"
        raise ConfigError(f"{where}: unknown option {', '.join(unknown)}; {choices}")


def call(fn: Callable[..., Any], what: str, spec: str, **kwargs: Any) -> Any:
    """Call a plug-in; an exception inside it becomes one line naming the plug-in and where in it (file:line).
    The original exception stays the ConfigError's ``__context__`` (``shoal --debug`` prints it)."""
    try:
        return fn(**kwargs)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's code
        where = user_frame(err)
        raise ConfigError(f"{what} {spec!r} raised {type(err).__name__}: {_first_line(err)}"
                          f"{f' ({where})' if where else ''}") from None


def user_frame(err: BaseException) -> str | None:
    """``FILE:LINE in FUNCTION`` of the innermost frame of ``err``'s traceback that is the user's own code: neither
    shoal's nor the Python installation's (standard library, site-packages); None when there is none."""
    import traceback

    ours = Path(__file__).resolve().parent
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    chain: list[BaseException] = []  # err and what caused it (simpy re-raises a process's exception as a copy)
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    for cause in reversed(chain):  # the original exception first
        found = None
        for frame in traceback.extract_tb(cause.__traceback__):
            path = Path(frame.filename).resolve()
            if frame.filename.startswith("<") or path.is_relative_to(ours) or any(path.is_relative_to(p)
                                                                                for p in installed):
                continue
            found = f"{frame.filename}:{frame.lineno} in {frame.name}"
        if found:
            return found
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else "(no message)"
