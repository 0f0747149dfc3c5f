"""The benchmarks' third-party plugin: a real distribution, installed for a run.

``installed_plugin()`` writes ``gradpipe-bench-plugin`` to a temporary
directory as an installed distribution (the module and its ``.dist-info`` with
the entry point) and puts that directory on the path of this process and of the
processes it starts, which find the plugin through its entry point as they
find any installed one. Nothing is installed into the environment, so runs
side by side do not disturb each other. Its transforms are written as the
plugin guide writes one, nothing declared:

* ``bench_scale``: ``g * factor``, stateless;
* ``bench_ema``: ``m = decay * m + g``, the update ``m``;
* ``bench_adabelief``: AdaBelief (Zhuang et al., 2020) as a user would write
  it from the paper, with ``tf.sqrt`` of the bias-corrected belief and no kernel.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

DIST = "gradpipe-bench-plugin"

PLUGIN = '''
"""A third-party plugin, written from the plugin guide: nothing declared."""
from typing import Any, NamedTuple

import attrs
from gradpipe.plugin import (Capabilities, Transform, hookimpl, hyper, hyperparameter, in_range,
                             map_grads, no_state, positive, zeros_like_vars)


@attrs.frozen(kw_only=True)
class ScaleConfig:
    factor: float = hyperparameter(default=1.0, validator=positive())


def bench_scale(cfg):
    factor = hyper(cfg.factor)

    def update(grads, state, variables):
        return map_grads(lambda g: g * factor(), grads), state

    return Transform(no_state, update)


@attrs.frozen(kw_only=True)
class EmaConfig:
    decay: float = hyperparameter(default=0.9, validator=in_range(0.0, 1.0))


def bench_ema(cfg):
    decay = hyper(cfg.decay)

    def update(grads, state, variables):
        d = decay()
        new = [m if g is None else d * m + g for g, m in zip(grads, state)]
        return [None if g is None else m for g, m in zip(grads, new)], new

    return Transform(zeros_like_vars, update)


@attrs.frozen(kw_only=True)
class AdaBeliefConfig:
    learning_rate: Any = hyperparameter(default=0.001, validator=positive())
    beta_1: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: float = attrs.field(default=0.999, validator=in_range(0.0, 1.0, high_open=True))
    epsilon: float = attrs.field(default=1e-16, validator=positive())


class AdaBeliefState(NamedTuple):
    count: Any
    m: list
    s: list


def bench_adabelief(cfg):
    lr = hyper(cfg.learning_rate)
    b1, b2, eps = cfg.beta_1, cfg.beta_2, cfg.epsilon

    def init(variables):
        import tensorflow as tf

        return AdaBeliefState(tf.constant(0, tf.int64), zeros_like_vars(variables),
                              zeros_like_vars(variables))

    def update(grads, state, variables):
        import tensorflow as tf

        count = state.count + 1
        t = tf.cast(count, tf.float32)
        updates, ms, ss = [], [], []
        for g, m, s in zip(grads, state.m, state.s):
            if g is None:
                updates.append(None)
                ms.append(m)
                ss.append(s)
                continue
            m = b1 * m + (1 - b1) * g
            s = b2 * s + (1 - b2) * tf.square(g - m) + eps
            m_hat = m / (1 - b1 ** t)
            s_hat = s / (1 - b2 ** t)
            updates.append(lr() * m_hat / (tf.sqrt(s_hat) + eps))
            ms.append(m)
            ss.append(s)
        return updates, AdaBeliefState(count, ms, ss)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register):
    register("bench_scale", bench_scale, ScaleConfig)
    register("bench_ema", bench_ema, EmaConfig)
    register("bench_adabelief", bench_adabelief, AdaBeliefConfig,
             capabilities=Capabilities(update_rule=True))
'''

METADATA = f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n"
ENTRY_POINTS = "[gradpipe]\nbench = gradpipe_bench_plugin\n"
_active: list[str] = []  # the site directory while a run has the plugin


@contextlib.contextmanager
def installed_plugin() -> Iterator[None]:
    """The plugin, installed while the block runs (already there: nothing more). In
    this process it is found only if gradpipe's registry is loaded after this."""
    if _active:
        yield
        return
    with tempfile.TemporaryDirectory() as site:
        (Path(site) / "gradpipe_bench_plugin.py").write_text(textwrap.dedent(PLUGIN))
        info = Path(site) / "gradpipe_bench_plugin-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(METADATA)
        (info / "entry_points.txt").write_text(ENTRY_POINTS)
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, before]))
        sys.path.insert(0, site)
        _active.append(site)
        try:
            yield
        finally:
            _active.clear()
            sys.path.remove(site)
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before
