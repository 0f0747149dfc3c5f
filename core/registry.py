"""Plugin discovery and the component registry.

Entry points of the group ``gradpipe`` are loaded one at a time. A plugin that
fails to import, to validate against the hook specs, or to register its
components is rolled back and recorded with its error; the others still load.
``GRADPIPE_STRICT_PLUGINS=1`` turns every such failure into a ``PluginError``.

Nothing here imports TensorFlow: listing and validating stay fast.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

import attrs
import pluggy

from . import hookspecs
from .errors import PluginError, did_you_mean

#: The distribution that ships the built-in plugins.
BUILTIN_DIST = "gradpipe"

#: Component kind -> the hook that registers components of that kind.
KIND_HOOKS: dict[str, str] = {
    "transform": "gradpipe_register_transforms",
    "loss_scale": "gradpipe_register_loss_scalers",
    "schedule": "gradpipe_register_schedules",
    "convergence": "gradpipe_register_convergence_criteria",
    "placement": "gradpipe_register_placements",
    "problem": "gradpipe_register_problems",
}
HOOK_KINDS = {hook: kind for kind, hook in KIND_HOOKS.items()}


def _env_list(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


@attrs.frozen(kw_only=True)
class Provider:
    """Where a component or plugin comes from."""

    dist: str
    version: str
    entry_point: str
    value: str = ""

    def __str__(self) -> str:
        return f"{self.dist} {self.version} (entry point {self.entry_point!r})"


@attrs.frozen(kw_only=True)
class Component:
    """One registered component: a name bound to a factory and its config."""

    kind: str
    name: str
    factory: Callable[..., Any]
    config_cls: type
    provider: Provider


@attrs.define(kw_only=True)
class PluginRecord:
    """The load status of one entry point."""

    provider: Provider
    status: str  # loaded | failed | blocked | conflict
    error: str | None = None
    import_seconds: float = 0.0
    hooks: list[str] = attrs.Factory(list)
    components: dict[str, list[str]] = attrs.Factory(dict)
    attempted: list[str] = attrs.Factory(list)

    @property
    def builtin(self) -> bool:
        return self.provider.dist == BUILTIN_DIST

    def as_dict(self) -> dict[str, Any]:
        return {
            "distribution": self.provider.dist,
            "version": self.provider.version,
            "entry_point": self.provider.entry_point,
            "module": self.provider.value,
            "builtin": self.builtin,
            "status": self.status,
            "error": self.error,
            "import_seconds": round(self.import_seconds, 4),
            "hooks": self.hooks,
            "components": self.components,
        }


class Registry:
    """All components known to this process, keyed by ``(kind, name)``."""

    def __init__(self, pm: pluggy.PluginManager | None = None) -> None:
        self.pm = pm or pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.components: dict[tuple[str, str], Component] = {}
        # Later providers of a name already taken: the bare name becomes ambiguous
        # (an error naming every provider) and "dist>name" picks one.
        self.shadowed: dict[tuple[str, str], list[Component]] = {}
        self.plugins: list[PluginRecord] = []
        # Lazy loading: plugins not imported yet, and which of them provide a name.
        self.deferred: dict[tuple[str, str], tuple[Any, Provider]] = {}
        self.index: dict[tuple[str, str], list[tuple[str, str]]] = {}

    # -- loading -----------------------------------------------------------

    def load_entry_points(self, group: str = hookspecs.PROJECT_NAME,
                          lazy: bool = True) -> None:
        """Load the allowed entry points of ``group``, one at a time.

        With ``lazy``, a plugin whose distribution lists its components in the
        ``gradpipe.components`` group (``"kind.name" = "module"``) is not imported
        until a pipeline names one of them (or an unknown name is looked up);
        the others load now.
        """
        index = _component_index(f"{group}.components") if lazy else {}
        indexed_modules = {(dist, module) for dist, module in index.values()}
        strict = _env_flag("GRADPIPE_STRICT_PLUGINS")
        builtins_only = _env_flag("GRADPIPE_DISABLE_PLUGIN_AUTOLOAD")
        allow = _env_list("GRADPIPE_PLUGINS")
        block = _env_list("GRADPIPE_DISABLED_PLUGINS") or set()
        for ep, dist in _iter_entry_points(group):
            provider = Provider(
                dist=dist.metadata["Name"] or "?",
                version=dist.version,
                entry_point=ep.name,
                value=ep.value,
            )
            names = {provider.entry_point, provider.dist}
            builtin = provider.dist == BUILTIN_DIST
            blocked_by = (
                "GRADPIPE_DISABLED_PLUGINS" if names & block
                else "GRADPIPE_DISABLE_PLUGIN_AUTOLOAD" if builtins_only and not builtin
                else "GRADPIPE_PLUGINS"
                if allow is not None and not builtin and not names & allow
                else None
            )
            if blocked_by:
                self.plugins.append(PluginRecord(
                    provider=provider, status="blocked", error=f"blocked by {blocked_by}"
                ))
                continue
            if (provider.dist, provider.value) in indexed_modules:
                self.deferred[(provider.dist, provider.value)] = (ep, provider)
                continue
            self._load_and_check(ep, provider, strict)
        for key, (dist, module) in index.items():
            if (dist, module) in self.deferred:
                self.index.setdefault(key, []).append((dist, module))

    def _load_and_check(self, ep: Any, provider: Provider, strict: bool) -> None:
        record = self._load_one(ep.name, ep.load, provider)
        if strict and record.status in ("failed", "conflict"):
            raise PluginError(f"plugin {provider} failed: {record.error}")

    def _load_deferred(self, keys: list[tuple[str, str]]) -> None:
        strict = _env_flag("GRADPIPE_STRICT_PLUGINS")
        for key in keys:
            if key in self.deferred:
                ep, provider = self.deferred.pop(key)
                self._load_and_check(ep, provider, strict)

    def load_all(self) -> Registry:
        """Import every deferred plugin (listing statuses, contract suites)."""
        self._load_deferred(list(self.deferred))
        return self

    def register_plugin(self, plugin: object, provider: Provider) -> PluginRecord:
        """Register an already imported plugin object (tests, embedding apps)."""
        return self._load_one(provider.entry_point, lambda: plugin, provider)

    def _load_one(
        self, name: str, load: Callable[[], object], provider: Provider
    ) -> PluginRecord:
        record = PluginRecord(provider=provider, status="loaded")
        self.plugins.append(record)
        start = time.perf_counter()
        try:
            plugin = load()
        except BaseException as exc:  # a plugin may raise anything at import
            if isinstance(exc, KeyboardInterrupt):
                raise
            record.import_seconds = time.perf_counter() - start
            return self._fail(record, f"import failed: {type(exc).__name__}: {exc}")
        record.import_seconds = time.perf_counter() - start
        wanted = getattr(plugin, "GRADPIPE_PLUGIN_API", hookspecs.PLUGIN_API_VERSION)
        if wanted != hookspecs.PLUGIN_API_VERSION:
            return self._fail(record, f"built for gradpipe plugin API {wanted!r}, but this "
                              f"gradpipe provides API {hookspecs.PLUGIN_API_VERSION}: install "
                              f"a version of {provider.dist} made for it")
        try:
            self.pm.register(plugin, name=f"{provider.dist}:{name}")
            self.pm.check_pending()
        except Exception as exc:
            self._unregister(plugin)
            return self._fail(record, f"invalid hook implementation: {_hook_hint(exc)}")
        record.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        added: list[Component] = []
        conflicts: list[str] = []
        try:
            for hook_name in record.hooks:
                kind = HOOK_KINDS[hook_name]
                for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                    if impl.plugin is plugin:
                        impl.function(register=self._register_fn(kind, provider, added,
                                                                 conflicts))
        except Exception as exc:
            self._rollback(added, record)
            self._unregister(plugin)
            return self._fail(record, f"registration failed: {type(exc).__name__}: {exc}")
        for comp in added:
            record.components.setdefault(comp.kind, []).append(comp.name)
        if conflicts:
            record.status = "conflict"
            record.error = "; ".join(conflicts)
        return record

    def _register_fn(
        self, kind: str, provider: Provider, added: list[Component], conflicts: list[str]
    ) -> Callable[[str, Callable[..., Any], type], None]:
        def register(name: str, factory: Callable[..., Any], config_cls: type) -> None:
            if not isinstance(name, str) or not name.isidentifier():
                raise TypeError(f"component name must be an identifier, got {name!r}")
            if not callable(factory):
                raise TypeError(f"factory for {kind} {name!r} is not callable")
            if not attrs.has(config_cls):
                raise TypeError(
                    f"config class for {kind} {name!r} must be an attrs class, "
                    f"got {config_cls!r}"
                )
            key = (kind, name)
            comp = Component(
                kind=kind, name=name, factory=factory, config_cls=config_cls,
                provider=provider,
            )
            added.append(comp)
            if key in self.components:
                first = self.components[key].provider
                self.shadowed.setdefault(key, []).append(comp)
                conflicts.append(
                    f"{kind} {name!r} is registered twice: by {first} and by {provider}; "
                    f"pipelines must now write '{first.dist}>{name}' or "
                    f"'{provider.dist}>{name}', or you can block one with "
                    f"GRADPIPE_DISABLED_PLUGINS={provider.entry_point}")
            else:
                self.components[key] = comp

        return register

    def _rollback(self, added: list[Component], record: PluginRecord) -> None:
        for comp in added:
            record.attempted.append(comp.name)
            key = (comp.kind, comp.name)
            if self.components.get(key) is comp:
                del self.components[key]
            if comp in self.shadowed.get(key, []):
                self.shadowed[key].remove(comp)

    def _unregister(self, plugin: object) -> None:
        # pluggy keeps a plugin whose validation failed; roll it back ourselves.
        try:
            self.pm.unregister(plugin)
        except Exception:
            for name, registered in list(self.pm.list_name_plugin()):
                if registered is plugin:
                    self.pm.unregister(name=name)

    def _fail(self, record: PluginRecord, error: str) -> PluginRecord:
        record.status = "failed"
        record.error = error
        return record

    # -- lookup ------------------------------------------------------------

    def names(self, kind: str) -> list[str]:
        """Every known name of ``kind``, including those of plugins not imported yet."""
        loaded = {name for (k, name) in self.components if k == kind}
        pending = {name for (k, name), owners in self.index.items()
                   if k == kind and any(o in self.deferred for o in owners)}
        return sorted(loaded | pending)

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``, or a ``PluginError`` saying why not.

        ``dist>name`` selects the provider explicitly when two plugins clash.
        """
        dist = None
        if ">" in name:
            dist, name = (part.strip() for part in name.split(">", 1))
        key = (kind, name)
        self._load_deferred(self.index.get(key, []))
        if key not in self.components and self.deferred:
            self.load_all()  # an incomplete index must not hide a name
        providers = ([self.components[key]] if key in self.components else []) + \
            self.shadowed.get(key, [])
        if dist is not None:
            for comp in providers:
                if comp.provider.dist == dist:
                    return comp
        elif len(providers) == 1:
            return providers[0]
        elif len(providers) > 1:
            raise PluginError(
                f"{kind} {name!r} is provided by several plugins: "
                + " and ".join(str(c.provider) for c in providers)
                + "; refusing to pick one. Write "
                + " or ".join(f"'{c.provider.dist}>{name}'" for c in providers))
        raise PluginError(self.unknown_message(kind, name, dist))

    def unknown_message(self, kind: str, name: str, dist: str | None = None) -> str:
        owners = set(self.index.get((kind, name), []))
        for record in self.plugins:
            owns = (record.provider.dist, record.provider.value) in owners
            if name in record.attempted or (owns and record.status == "failed"):
                return (f"{kind} {name!r} comes from plugin {record.provider}, which "
                        f"failed to load: {record.error}")
        if dist is not None and (kind, name) in self.components:
            have = self.components[(kind, name)].provider.dist
            return f"{kind} {name!r} is provided by {have!r}, not by {dist!r}"
        message = f"unknown {kind} {name!r}{did_you_mean(name, self.names(kind))}"
        failed = [r for r in self.plugins if r.status == "failed"]
        if failed:
            message += "; these plugins failed to load and may provide it: " + ", ".join(
                f"{r.provider} ({r.error})" for r in failed
            )
        return message + f". Known: {', '.join(self.names(kind)) or 'none'}"


def _iter_entry_points(group: str) -> Iterator[tuple[Any, Any]]:
    seen: set[tuple[str, str]] = set()
    found = []
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != group:
                continue
            # The same distribution may be visible twice on sys.path (editable
            # installs): load it once.
            key = (dist.metadata["Name"] or "", ep.name)
            if key in seen:
                continue
            seen.add(key)
            found.append((ep, dist))
    # Built-ins first, then third parties, each in name order: deterministic.
    found.sort(key=lambda p: (p[1].metadata["Name"] != BUILTIN_DIST,
                              p[1].metadata["Name"] or "", p[0].name))
    yield from found


def _component_index(group: str) -> dict[tuple[str, str], tuple[str, str]]:
    """``(kind, name) -> (distribution, module)`` from ``kind.name = module`` entries."""
    index: dict[tuple[str, str], tuple[str, str]] = {}
    for ep, dist in _iter_entry_points(group):
        kind, _, name = ep.name.partition(".")
        if kind in KIND_HOOKS and name:
            index[(kind, name)] = (dist.metadata["Name"] or "", ep.value)
    return index


def _hook_hint(exc: Exception) -> str:
    text = str(exc)
    import re

    match = re.search(r"unknown hook '?(\w+)'?", text)
    if match:
        hook = match.group(1)
        return f"unknown hook {hook!r}{did_you_mean(hook, KIND_HOOKS.values())}"
    return text


_REGISTRY: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded from entry points on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        registry = Registry()
        registry.load_entry_points()
        _REGISTRY = registry
    return _REGISTRY


def reset_registry() -> None:
    """Forget the loaded registry, so the next use reloads (tests, env changes)."""
    global _REGISTRY
    _REGISTRY = None
