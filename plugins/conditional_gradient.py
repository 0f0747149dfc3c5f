"""``conditional_gradient``: a Frank-Wolfe step toward the norm ball of radius
``lambda_`` (Frank and Wolfe 1956; the form of Ravi et al. 2018, "Constrained
Deep Learning using Conditional Gradient and Applications in Computer Vision",
arXiv:1803.06453), as TF Addons ``tfa.optimizers.ConditionalGradient``
computes it, per variable::

    s     = g / (norm(g) + epsilon)       # ord = "fro": the Frobenius norm
    s     = u v^T                         # ord = "nuclear": g's top singular pair
    w_new = learning_rate * w - (1 - learning_rate) * lambda_ * s

``-lambda_ s`` is the point of the ball (Frobenius or nuclear) that minimises
``<g, x>``, and ``w_new`` the convex combination of it with ``w``. So
``learning_rate`` is TF Addons' name for the weight kept on ``w``: 1 does not
move, 0 jumps to the ball's boundary, and a *smaller* rate is a *larger* step
(which is what a Keras callback that lowers the rate does to it).

For ``nuclear``, the gradient is read as a matrix: a scalar as ``[[g]]``, a
vector as one row (as TF Addons does; its top singular pair is then
``g / norm(g)``, computed so, without an SVD), a matrix as itself, and a tensor
of higher rank as ``[prod(shape[:-1]), shape[-1]]`` (a convolution kernel's
output channels are its columns).

Departures from TF Addons, each deliberate:

* Rank > 2 with ``nuclear``: TF Addons' SVD is batched over the leading axes
  and its reshape of ``u[:, 0]`` then fails (or, for one column, mixes the
  batches); here the tensor is one matrix, as above.
* A zero gradient with ``nuclear`` gives ``s = 0`` (the variable is scaled by
  ``learning_rate``, as ``fro`` does). The SVD of a zero matrix returns
  arbitrary unit vectors, and TF Addons steps toward whichever it got.
* ``epsilon = 0`` is 0. TF Addons' ``epsilon or backend.epsilon()`` turns it
  into 1e-7.
* ``learning_rate`` must lie in [0, 1] and ``lambda_`` be >= 0 (TF Addons checks
  neither; outside them the step leaves the convex combination).
* A sparse gradient steps as its dense sum: every row of ``w`` is scaled by
  ``learning_rate``. TF Addons' sparse apply changes only the touched rows:
  that is ``lazy = true``, where the norm and the singular pair of the
  touched rows (duplicates summed) are those of the dense gradient.

There is no state: TF Addons' slot ``conditional_gradient`` is never read.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    no_state,
    non_negative,
    one_of,
    rowwise,
)


@attrs.frozen(kw_only=True)
class ConditionalGradientConfig:
    """Config of ``conditional_gradient`` (TF Addons ``ConditionalGradient``; its
    names and defaults).

    Attributes:
        learning_rate: the weight kept on the variable, in [0, 1] (a number or
            a schedule): ``w = lr w - (1 - lr) lambda_ s``. Required, as in
            TF Addons; lower is a larger step.
        lambda_: radius of the norm ball the variable is drawn to (a number or
            a schedule).
        epsilon: added to the gradient's Frobenius norm (``fro`` only).
        ord: the ball's norm: ``fro`` (Frobenius) or ``nuclear`` (the sum of
            the singular values; its step is the gradient's top singular pair).
        lazy: with a sparse gradient, update only the rows it touches, as
            TF Addons' sparse apply does. Off: a sparse gradient steps as its
            dense sum, and every row is scaled by ``learning_rate``.
    """

    example: ClassVar[dict] = {"learning_rate": 0.99, "lambda_": 4.0}

    learning_rate: Any = hyperparameter(validator=in_range(0.0, 1.0))
    lambda_: Any = hyperparameter(default=0.01, validator=non_negative())
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    ord: Literal["fro", "nuclear"] = attrs.field(default="fro",
                                                 validator=one_of("fro", "nuclear"))
    lazy: bool = False


def top_singular_pair(g: Any) -> Any:
    """``u v^T`` of ``g``'s largest singular value, read as a matrix (see the
    module's docstring), in ``g``'s shape; 0 where ``g`` is 0."""
    import tensorflow as tf

    rank = g.shape.rank
    if rank < 2:  # one row: its singular pair is (1, g / norm(g))
        length = tf.sqrt(tf.reduce_sum(tf.square(g)))
        return tf.where(length > 0, g / length, tf.zeros_like(g))
    matrix = g if rank == 2 else tf.reshape(g, [-1, g.shape[-1]])
    sigma, u, v = tf.linalg.svd(matrix, full_matrices=False)
    outer = tf.matmul(u[:, :1], v[:, :1], transpose_b=True)  # the signs cancel
    outer = tf.where(sigma[0] > 0, outer, tf.zeros_like(outer))
    return tf.reshape(outer, tf.shape(g))


def conditional_gradient(cfg: ConditionalGradientConfig) -> Transform:
    """TF Addons ``ConditionalGradient``: ``w = lr w - (1 - lr) lambda_ s``."""
    lr, radius = hyper(cfg.learning_rate), hyper(cfg.lambda_)

    def step(g: Any, w: Any) -> Any:
        import tensorflow as tf

        dtype = w.dtype
        g = tf.cast(g, dtype)
        if cfg.ord == "fro":  # pow, as TF Addons' ``** 2`` and ``** 0.5``: not always
            # the last bit of ``square`` and ``sqrt``
            norm = tf.pow(tf.reduce_sum(tf.pow(g, 2)), 0.5)
            s = g / (norm + tf.constant(cfg.epsilon, dtype))
        else:
            s = top_singular_pair(g)
        rate = tf.cast(lr(), dtype)
        new = w * rate - (1 - rate) * tf.cast(radius(), dtype) * s
        return w - new, ()

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        updates: list[Any] = []
        for g, var in zip(grads, variables):
            if g is None:
                updates.append(None)
                continue
            w = tf.convert_to_tensor(var)
            u, _ = rowwise(step, g, [], lazy=cfg.lazy, extra=[w])
            updates.append(u)
        return updates, state

    return Transform(no_state, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("conditional_gradient", conditional_gradient, ConditionalGradientConfig,
             capabilities=Capabilities(update_rule=True))
