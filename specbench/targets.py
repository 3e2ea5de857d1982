"""How everything named in config is built: a ``_target_`` (the dotted path of a class or factory) and its
keyword arguments, through Hydra's ``instantiate`` — tasks, drafters, verification rules and schedules alike
(docs/architecture.md, "How things are built from config").

:func:`check_target` imports the target and checks the argument names against its signature before any
model loads; :func:`build_target` calls it. Objects only the run has (the loaded verifier, the shared
vocabulary size, the whole config) are *injected*: passed to the targets whose signature takes them, never
written in config. A ``_target_`` nested in the arguments is built too (Hydra's recursive instantiate).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def import_target(path: str, key: str = "model.drafter._target_") -> Callable[..., Any]:
    """The object ``path`` (``package.module.Name``) names; ValueError naming ``key`` when it does not
    import."""
    module_name, _, attribute = str(path or "").rpartition(".")
    if not module_name:
        raise ValueError(
            f"{key} must be a dotted path such as specbench.drafters.ngram.NgramDrafter, got {path!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{key}={path!r}: cannot import {module_name!r} ({err})") from err
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{key}={path!r}: {module_name!r} has no {attribute!r}") from None


def signature_of(factory: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(factory.__init__ if inspect.isclass(factory) else factory)


def accepted_names(factory: Callable[..., Any]) -> tuple[list[str], bool]:
    """The keyword names ``factory`` takes (``self`` left out), and whether it takes any (``**kwargs``)."""
    parameters = signature_of(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return [name for name in parameters if name != "self"], takes_any


def check_target(
    target: str,
    kwargs: Mapping[str, Any],
    key: str,
    injected: Iterable[str] = (),
    params_key: str | None = None,
) -> Callable[..., Any]:
    """The object ``target`` names, with the names in ``kwargs`` checked against its signature.

    ``key`` names the config node (errors say ``<key>._target_``); ``params_key`` the node holding the
    arguments (default ``key``). A name in ``injected`` may not be set in config: the run passes it.
    """
    factory = import_target(target, f"{key}._target_")
    accepted, takes_any = accepted_names(factory)
    allowed = [name for name in accepted if name not in injected]
    unknown = [name for name in kwargs if name in injected or (name not in accepted and not takes_any)]
    if unknown:
        raise ValueError(
            f"{params_key or key}: {target} takes no parameter {unknown[0]!r}; allowed: {allowed}"
        )
    return factory


def build_target(
    target: str,
    kwargs: Mapping[str, Any],
    key: str,
    params_key: str | None = None,
    recursive: bool = True,
    convert: str = "all",
    **injected: Any,
) -> Any:
    """``target(**kwargs, **injected)`` through Hydra's ``instantiate`` (nested ``_target_``s built too unless
    ``recursive`` is false; containers passed as plain dicts and lists unless ``convert`` is "none"). Only the
    injected objects the target's signature takes are passed. What the target raises is raised as it is
    (Hydra's wrapper taken off), except a TypeError (arguments it refuses), which becomes a ValueError naming
    ``params_key`` (default ``key``)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    factory = check_target(target, kwargs, key, injected, params_key)
    accepted, takes_any = accepted_names(factory)
    passed = {name: value for name, value in injected.items() if takes_any or name in accepted}
    node = {"_target_": target, **dict(kwargs)}
    try:
        # Run objects go to the partial Hydra returns, never through instantiate: OmegaConf would copy a
        # dataclass (the loaded verifier) into a config node, resolving its annotations on the way.
        partial = instantiate(node, _convert_=convert, _recursive_=recursive, _partial_=True)
    except InstantiationException as err:
        raise _config_error(err, target, params_key or key) from None
    try:
        return partial(**passed)
    except TypeError as err:  # arguments the target refuses: a config error
        message = f"{params_key or key}: {target}: {' '.join(str(err).split())}"
        raise ValueError(message) from err


def _config_error(err: Exception, target: str, key: str) -> Exception:
    """Hydra's InstantiationException as the error the user can act on."""
    cause = err.__cause__
    if isinstance(cause, TypeError):
        return ValueError(f"{key}: {target}: {' '.join(str(cause).split())}")
    if cause is not None:
        return cause
    return ValueError(f"{key}: {' '.join(str(err).split())}")
