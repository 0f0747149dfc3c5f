"""Hook specifications: the whole plugin API of gradpipe in one module.

A plugin is a module (or object) with functions marked
``@gradpipe.plugin.hookimpl`` whose names match the specs below, published
through an entry point in the group ``gradpipe``::

    # pyproject.toml of your distribution
    [project.entry-points.gradpipe]
    my_clipping = "my_package.clipping"

Every component hook receives a ``register`` callback and calls it once per
component: ``register(name, factory, config_cls)``.

* ``name`` is the key used in pipeline TOML files (``kind = "name"``). It must
  be unique across all installed plugins; a duplicate is a ``PluginError``
  naming both providers.
* ``config_cls`` is a frozen, keyword-only ``attrs`` class describing the
  component's parameters. gradpipe builds it from the TOML table, reporting
  unknown keys, wrong types and out-of-range values with their line numbers.
* ``factory(config)`` builds the component. It is called at build time, never
  inside a traced step.

Hooks run once, while the registry is built. pluggy is never called inside a
training step. Implementations may accept fewer arguments than the specs, so
specs only ever grow by appending parameters.

Keep TensorFlow out of the import path of a plugin module: import it inside
factories and ``update`` functions, so that ``gradpipe plugins`` and
``gradpipe check`` stay fast. Everything a plugin imports from gradpipe is in
``gradpipe.plugin``.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT_NAME = "gradpipe"

#: The plugin API this gradpipe provides. A plugin module may declare the API it
#: was built for as ``GRADPIPE_PLUGIN_API = 2``; a different value is refused at
#: load time with a message naming both. Specs only grow compatibly within a
#: version (new hooks, appended arguments).
PLUGIN_API_VERSION = 2

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: The decorator that makes a plugin module's function an implementation of the
#: gradpipe hook of the same name: ``@hookimpl`` above ``def
#: gradpipe_register_transforms(register)``. A misspelt name fails the plugin,
#: with the nearest hook's name.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: ``register(name, factory, config_cls, *, capabilities=None, kernel=None)``
RegisterFn = Callable[..., None]


# -- component registration -------------------------------------------------


@hookspec
def gradpipe_register_transforms(register: RegisterFn) -> None:
    """Contribute gradient transforms and update rules.

    Called once while the registry is built, after the plugin is imported.

    A transform factory returns a :class:`gradpipe.plugin.Transform`, a pair
    of functions over TensorFlow tensors:

    * ``init(variables) -> state``: the initial state, a nest of tensors;
    * ``update(grads, state, variables) -> (updates, state)``.

    ``grads`` is a list aligned with ``variables``; an entry is ``None`` where
    the variable received no gradient, and must be passed through as ``None``.
    The engine owns the ``tf.Variable`` that holds each state tensor. The last
    transform of a chain produces the update that is subtracted from each
    variable (``var -= update``).

    Two optional keywords: ``capabilities=Capabilities(...)`` declares what the
    engine cannot find out (``update_rule``, ``after_update_rule``,
    ``gradient_clipping``, ``conflicts``); ``kernel(config) ->
    apply(grads, slots, variables) -> ops`` is the update and ``var -= update``
    done in place by fused kernels (``slots``: the state as ``tf.Variable``s).

    :param register: ``register(name, factory, config_cls, *, capabilities=None,
        kernel=None)``.

    Example::

        @attrs.frozen(kw_only=True)
        class ScaleConfig:
            factor: float = hyperparameter(default=1.0)

        def scale(cfg):
            factor = hyper(cfg.factor)
            def update(grads, state, variables):
                f = factor()
                return map_grads(lambda g: g * tf.cast(f, g.dtype), grads), state
            return Transform(no_state, update)

        @hookimpl
        def gradpipe_register_transforms(register):
            register("scale", scale, ScaleConfig)
    """


@hookspec
def gradpipe_register_loss_scalers(register: RegisterFn) -> None:
    """Contribute loss scalers (the TF ``LossScale`` interface).

    Called once while the registry is built.

    A loss-scaler factory returns a ``tf.Module`` with ``__call__()`` (the
    current scale, a float32 scalar), ``update(grads) -> (update_op,
    should_apply_gradients)`` on unscaled gradients (accept a keyword
    ``finite=None`` to reuse the engine's finite check of the same gradients),
    ``get_config()`` and a classmethod ``from_config(config)``.

    :param register: ``register(name, factory, config_cls)``.

    Example::

        @hookimpl
        def gradpipe_register_loss_scalers(register):
            register("fixed", FixedLossScale.from_spec, FixedConfig)
    """


@hookspec
def gradpipe_register_schedules(register: RegisterFn) -> None:
    """Contribute schedules for learning rates and other hyperparameters.

    Called once while the registry is built.

    A schedule factory returns a callable ``schedule(step) -> tensor``, elementwise
    over a tensor of steps of any integer or float dtype: a scalar step (each
    training step) gives a float32 scalar, a vector of steps (``gradpipe
    schedule``, the contract suite) a float32 vector of the same shape. Only
    TensorFlow ops, so it traces once and never retraces when the step changes.

    :param register: ``register(name, factory, config_cls)``.

    Example::

        @hookimpl
        def gradpipe_register_schedules(register):
            register("fixed_lr", fixed_lr, FixedLrConfig)
    """


@hookspec
def gradpipe_register_convergence_criteria(register: RegisterFn) -> None:
    """Contribute convergence criteria (the TFP ``ConvergenceCriterion`` API).

    Called once while the registry is built.

    A criterion provides ``bootstrap(loss, grads, parameters) -> state``,
    ``one_step(step, loss, grads, parameters, state) -> (has_converged,
    state)``, ``min_num_steps`` and ``name``. Subclass
    ``gradpipe.plugin.Criterion`` and implement ``_bootstrap`` and
    ``_one_step`` (the plugin guide shows one).

    :param register: ``register(name, factory, config_cls)``.
    """


@hookspec
def gradpipe_register_placements(register: RegisterFn) -> None:
    """Contribute device placements.

    Called once while the registry is built.

    A placement factory returns a ``gradpipe.plugin.Placement``: an object with
    a ``strategy`` (a ``tf.distribute.Strategy``), ``num_replicas``,
    ``loss_divisor`` (how much ``scale_loss`` divides by) and ``reduce(grads)``,
    which reduces gradients across replicas once, inside a replica context.

    :param register: ``register(name, factory, config_cls)``.
    """


@hookspec
def gradpipe_register_problems(register: RegisterFn) -> None:
    """Contribute optimisation problems for ``gradpipe run``.

    Called once while the registry is built.

    A problem factory returns an object with ``variables`` (a list of
    ``tf.Variable``), ``loss(step) -> tensor`` (a scalar), and how a run
    succeeds: ``target_loss`` (a float: the final loss is at most this) or
    ``succeeded(final_loss) -> bool``. Optional: ``metrics() -> dict`` of
    numbers added to the run's summary.

    :param register: ``register(name, factory, config_cls)``.
    """
