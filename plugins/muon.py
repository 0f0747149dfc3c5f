"""``muon``: Keras 3 ``Muon`` (keras-team/keras ``optimizers/muon.py``).

Each variable takes one of two steps, decided once, when the pipeline is
built, exactly as Keras's ``Muon._should_use_adamw`` decides:

* AdamW, if the variable is not a matrix (rank != 2); or if
  ``exclude_embeddings`` and ``"embedding"`` occurs in its lower-cased path;
  or if one of the regexes of ``exclude_layers`` is found (``re.search``) in
  its path.
* Muon otherwise: Nesterov momentum, orthogonalised by five Newton-Schulz
  iterations, scaled by ``sqrt(max(rows, cols)) * rms_rate`` (Moonlight).

The path is :func:`gradpipe.plugin.variable_path`: Keras's ``variable.path``
(``dense/kernel``, ``embedding/embeddings``) for a Keras variable, whose
wrapped ``tf.Variable`` the engine updates is named by the same path; for a
plain ``tf.Variable``, its name without ``:0`` (Keras's ``Muon`` cannot take
those: they have no ``path``). Keras knows an embedding by that string only,
not by the layer's class: every ``Embedding`` layer's weight is named
``embeddings``, so it is caught whatever the layer is called, and so is any
variable whose path contains ``embedding`` (a ``Dense`` layer named
``embedding_proj``). gradpipe sees the same string, so it decides the same.

Weight decay is Keras's: ``var -= var * wd * learning_rate`` before the step,
``adam_weight_decay`` for the AdamW variables and ``weight_decay`` for the
Muon ones, both at the full learning rate (``adam_lr_ratio`` scales the AdamW
step only, as in Keras).

Both steps depend on the whole variable (the AdamW step is elementwise, but
which step a variable takes is not), so an IndexedSlices gradient is densified
first: the step of a sparse gradient equals that of its dense sum.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    at_least,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    non_negative,
    one_minus,
    path_matches,
    slot_dtype,
    value_of,
    variable_path,
    variable_patterns,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class MuonConfig:
    """Config of ``muon`` (Keras ``Muon``; names and defaults are Keras's).

    Attributes:
        learning_rate: step size (a number or a schedule).
        adam_beta_1: AdamW's first-moment decay.
        adam_beta_2: AdamW's second-moment decay.
        adam_weight_decay: decay of the AdamW variables.
        epsilon: AdamW's epsilon, added to the root of the second moment.
        weight_decay: decay of the Muon variables.
        exclude_layers: regexes of variable paths that take the AdamW step.
        exclude_embeddings: variables whose path contains ``embedding`` take AdamW.
        muon_a: Newton-Schulz coefficient a.
        muon_b: Newton-Schulz coefficient b.
        muon_c: Newton-Schulz coefficient c.
        adam_lr_ratio: AdamW's rate is ``learning_rate * adam_lr_ratio``.
        momentum: Muon's momentum.
        ns_steps: Newton-Schulz iterations.
        nesterov: Nesterov momentum for the Muon step.
        rms_rate: Muon steps are scaled by ``sqrt(max(rows, cols)) * rms_rate``;
            0 disables the scaling (Keras's ``rms_rate=None``: TOML has no null).
        exclude_from_weight_decay: regexes of variable paths that are not decayed
            (Keras's ``optimizer.exclude_from_weight_decay(var_names=...)``).
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    adam_beta_1: Any = hyperparameter(default=0.9,
                                      validator=in_range(0.0, 1.0, high_open=True))
    adam_beta_2: Any = hyperparameter(default=0.999,
                                      validator=in_range(0.0, 1.0, high_open=True))
    adam_weight_decay: Any = hyperparameter(default=0.004, validator=non_negative())
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    weight_decay: Any = hyperparameter(default=0.004, validator=non_negative())
    exclude_layers: tuple[str, ...] = variable_patterns()
    exclude_embeddings: bool = True
    muon_a: float = 3.4445
    muon_b: float = -4.7750
    muon_c: float = 2.0315
    adam_lr_ratio: float = attrs.field(default=1.0, validator=non_negative())
    momentum: float = attrs.field(default=0.95, validator=in_range(0.0, 1.0))
    ns_steps: int = attrs.field(default=5, validator=at_least(0))
    nesterov: bool = True
    rms_rate: float = attrs.field(default=0.2, validator=non_negative())
    exclude_from_weight_decay: tuple[str, ...] = variable_patterns()


def uses_adamw(cfg: MuonConfig, var: Any) -> bool:
    """Whether ``muon`` gives ``var`` the AdamW step (Keras ``_should_use_adamw``)."""
    if len(var.shape) != 2:
        return True
    path = variable_path(var)
    if cfg.exclude_embeddings and "embedding" in path.lower():
        return True
    return path_matches(cfg.exclude_layers, var)


class MuonState(NamedTuple):
    count: Any
    momentum: list[Any]  # both steps
    velocity: list[Any]  # AdamW variables; a scalar placeholder for Muon ones


def _transpose_last(x: Any) -> Any:
    import tensorflow as tf

    return tf.linalg.matrix_transpose(x)


def newton_schulz(x: Any, cfg: MuonConfig) -> Any:
    """Keras ``zeropower_via_newtonschulz5``: the quintic iteration towards ``U V^T``,
    in the order Keras multiplies (``(c * A) @ A``), on the wide orientation."""
    import tensorflow as tf

    a, b, c = cfg.muon_a, cfg.muon_b, cfg.muon_c
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = _transpose_last(x)
    # spectral norm <= 1: Keras divides by the Frobenius norm (plus 1e-7)
    x = x / (tf.norm(x, axis=(-2, -1), keepdims=True) + 1e-7)
    for _ in range(cfg.ns_steps):
        temp_a = x @ _transpose_last(x)
        temp_b = b * temp_a + (c * temp_a) @ temp_a
        x = a * x + temp_b @ x
    return _transpose_last(x) if tall else x


def muon(cfg: MuonConfig) -> Transform:
    """Keras ``Muon``: Newton-Schulz-orthogonalised momentum for matrices, AdamW else."""
    lr = hyper(cfg.learning_rate)
    beta_1, beta_2 = hyper(cfg.adam_beta_1), hyper(cfg.adam_beta_2)
    adam_decay, muon_decay = hyper(cfg.adam_weight_decay), hyper(cfg.weight_decay)

    def decay_for(var: Any, adamw: bool) -> Any:
        decay, value = (adam_decay, cfg.adam_weight_decay) if adamw else (muon_decay,
                                                                          cfg.weight_decay)
        if value == 0 or path_matches(cfg.exclude_from_weight_decay, var):
            return None  # Keras: var - var * 0 * lr is var, so skipping changes nothing
        return decay

    def init(variables: list[Any]) -> MuonState:
        import tensorflow as tf

        velocities = [tf.zeros(var.shape, slot_dtype(var)) if uses_adamw(cfg, var)
                      else tf.zeros([], slot_dtype(var)) for var in variables]
        return MuonState(tf.constant(0, tf.int64), zeros_like_vars(variables), velocities)

    def update(grads: list[Any], state: MuonState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        ms, vs = list(state.momentum), list(state.velocity)
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            dtype = ms[i].dtype
            g = tf.cast(dense(g), dtype)
            rate = tf.cast(lr(), dtype)
            adamw = uses_adamw(cfg, var)
            w = value_of(var, dtype)
            decayed: Any = 0.0
            if (decay := decay_for(var, adamw)) is not None:
                # Keras's _apply_weight_decay runs before the step, at the full rate
                decayed = w * tf.cast(decay(), dtype) * rate
            if adamw:
                step_count = tf.cast(count, dtype)
                adam_rate = rate * tf.cast(cfg.adam_lr_ratio, dtype)
                b1, b2 = tf.cast(beta_1(), dtype), tf.cast(beta_2(), dtype)
                alpha = (adam_rate * tf.sqrt(1 - tf.pow(b2, step_count))
                         / (1 - tf.pow(b1, step_count)))
                ms[i] = ms[i] + (g - ms[i]) * one_minus(beta_1, dtype)
                vs[i] = vs[i] + (tf.square(g) - vs[i]) * one_minus(beta_2, dtype)
                step = ms[i] * alpha / (tf.sqrt(vs[i]) + tf.cast(cfg.epsilon, dtype))
            else:
                # Keras: m += g + m * (momentum - 1), momentum - 1 in Python floats
                ms[i] = ms[i] + (g + ms[i] * tf.constant(cfg.momentum - 1, dtype))
                direction = g + cfg.momentum * ms[i] if cfg.nesterov else ms[i]
                step = rate * newton_schulz(direction, cfg)
                if cfg.rms_rate:  # Keras's lr_adjust (Moonlight)
                    rows, cols = var.shape
                    step = step * tf.sqrt(tf.cast(max(rows, cols), dtype)) * cfg.rms_rate
            updates.append(decayed + step)
        return updates, MuonState(count, ms, vs)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("muon", muon, MuonConfig, capabilities=Capabilities(update_rule=True))
