"""Plugin discovery and the component registry.

Entry points of the group ``gradpipe`` are loaded one at a time. A plugin that
fails to import, to validate against the hook specs, or to register its
components is rolled back and recorded with its error; the others still load.
``GRADPIPE_STRICT_PLUGINS=1`` turns every such failure into a ``PluginError``.

Nothing here imports TensorFlow: listing and validating stay fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pluggy

from . import hookspecs
from .capabilities import check_registration
from .entry_points import (
    BUILTIN_DIST,
    HOOK_KINDS,
    component_index,
    env_flag,
    env_list,
    iter_entry_points,
)
from .errors import PluginError
from .hints import did_you_mean
from .plugin_records import Component, PluginRecord, Provider, failure, hook_hint


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
        index = component_index(f"{group}.components") if lazy else {}
        indexed_modules = {(dist, module) for dist, module in index.values()}
        strict = env_flag("GRADPIPE_STRICT_PLUGINS")
        builtins_only = env_flag("GRADPIPE_DISABLE_PLUGIN_AUTOLOAD")
        allow = env_list("GRADPIPE_PLUGINS")
        block = env_list("GRADPIPE_DISABLED_PLUGINS") or set()
        for ep, dist, version in iter_entry_points(group):
            provider = Provider(
                dist=dist or "?",
                version=version,
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
        strict = env_flag("GRADPIPE_STRICT_PLUGINS")
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
            return failure(record, f"import failed: {type(exc).__name__}: {exc}", exc)
        record.import_seconds = time.perf_counter() - start
        wanted = getattr(plugin, "GRADPIPE_PLUGIN_API", hookspecs.PLUGIN_API_VERSION)
        if wanted != hookspecs.PLUGIN_API_VERSION:
            upgrade = (" (API 2 declares capabilities at registration, register(..., "
                       "capabilities=Capabilities(...)), instead of class attributes of the "
                       "config; see the plugin guide)" if wanted == 1 else "")
            return failure(record, f"built for gradpipe plugin API {wanted!r}, but this "
                              f"gradpipe provides API {hookspecs.PLUGIN_API_VERSION}: install "
                              f"a version of {provider.dist} made for it{upgrade}")
        try:
            self.pm.register(plugin, name=f"{provider.dist}:{name}")
            self.pm.check_pending()
        except Exception as exc:
            self._unregister(plugin)
            return failure(record, f"invalid hook implementation: {hook_hint(exc)}")
        record.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        added: list[Component] = []
        conflicts: list[str] = []
        try:
            for hook_name in record.hooks:
                kind = HOOK_KINDS[hook_name]
                for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                    if impl.plugin is plugin:
                        impl.function(register=self._register_fn(
                            kind, provider, added, conflicts, record.attempted))
        except Exception as exc:
            self._rollback(added)
            self._unregister(plugin)
            return failure(record, f"registration failed: {type(exc).__name__}: {exc}",
                           exc)
        for comp in added:
            record.components.setdefault(comp.kind, []).append(comp.name)
        if conflicts:
            record.status = "conflict"
            record.error = "; ".join(conflicts)
        return record

    def _register_fn(
        self, kind: str, provider: Provider, added: list[Component], conflicts: list[str],
        attempted: list[str],
    ) -> Callable[..., None]:
        def register(name: str, factory: Callable[..., Any], config_cls: type, *,
                     capabilities: Any = None, kernel: Any = None) -> None:
            if isinstance(name, str):  # a pipeline naming it is told why it is missing
                attempted.append(name)
            declared = check_registration(kind, name, factory, config_cls, capabilities,
                                          kernel)
            key = (kind, name)
            comp = Component(
                kind=kind, name=name, factory=factory, config_cls=config_cls,
                provider=provider, capabilities=declared, kernel=kernel,
            )
            added.append(comp)
            if key in self.components:
                self.shadowed.setdefault(key, []).append(comp)
                self._clash(kind, name, self.components[key].provider, provider, conflicts)
            else:
                self.components[key] = comp

        return register

    def _clash(self, kind: str, name: str, first: Provider, second: Provider,
               conflicts: list[str]) -> None:
        """Record a name two plugins register on the newcomer's line: the third party
        where the other is a built-in (which may load later, on demand), else the
        later one. The fix offered renames or blocks the newcomer, never the other."""
        newcomer, holder = (first, second) if second.dist == BUILTIN_DIST else (second, first)
        held_by = "a built-in" if holder.dist == BUILTIN_DIST else f"registered by {holder}"
        message = (f"{kind} {name!r} is {held_by}; {newcomer} registers it again, so "
                   f"pipelines must write '{holder.dist}>{name}' or '{newcomer.dist}>{name}'."
                   f" To fix: rename it in {newcomer.dist}, or block that plugin with "
                   f"GRADPIPE_DISABLED_PLUGINS={newcomer.entry_point}")
        if newcomer == second:
            conflicts.append(message)
            return
        for record in self.plugins:
            if record.provider == newcomer:
                record.status = "conflict"
                record.error = "; ".join(filter(None, [record.error, message]))

    def _rollback(self, added: list[Component]) -> None:
        for comp in added:
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
            if record.status == "failed" and (name in record.attempted or owns):
                return (f"{kind} {name!r} comes from plugin {record.provider}, which "
                        f"failed to load: {record.error}")
        if dist is not None and (kind, name) in self.components:
            have = self.components[(kind, name)].provider.dist
            return f"{kind} {name!r} is provided by {have!r}, not by {dist!r}"
        message = f"unknown {kind} {name!r}{did_you_mean(name, self.names(kind))}"
        elsewhere = [other for other in HOOK_KINDS.values()
                     if other != kind and name in self.names(other)]
        if elsewhere:  # a schedule where a transform goes, say
            message += f"; {name!r} is a {elsewhere[0]}, not a {kind}"
        failed = [r for r in self.plugins if r.status == "failed"]
        if failed:
            message += "; these plugins failed to load and may provide it: " + ", ".join(
                f"{r.provider} ({r.error})" for r in failed
            )
        return message + f". Known: {', '.join(self.names(kind)) or 'none'}"


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
