"""Which of gradpipe's own transforms the engine proves finite, and how.

The proofs live in :mod:`gradpipe._engine.proofs`,
:mod:`gradpipe._engine.rate_proofs`, :mod:`gradpipe._engine.weight_proofs` and
:mod:`gradpipe._engine.optax_proofs`;
this table names them for the plan and the build. Proofs are never taken from
a plugin: a plugin's word that its outputs are finite could be wrong, and a
wrong one would write NaN into the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..entry_points import BUILTIN_DIST
from ..spec import ComponentSpec
from .optax_proofs import (
    adabelief_proof,
    adabelief_provable,
    adamaxw_proof,
    adamaxw_provable,
    adan_proof,
    adan_provable,
    decays_weights,
    nadamw_proof,
    nadamw_provable,
    radam_proof,
    radam_provable,
)
from .proofs import (
    CheckedWhereItFails,
    Prove,
    adagrad_provable,
    adam_proof,
    adam_provable,
    clip_proof,
    clip_provable,
    float32,
    mean_square_proof,
    proximal_adagrad_proof,
    proximal_adagrad_provable,
    rmsprop_provable,
    sgd_proof,
    sgd_provable,
)
from .rate_proofs import (
    adamax_proof,
    adamax_provable,
    amsgrad_proof,
    amsgrad_provable,
    nadam_proof,
    nadam_provable,
    rprop_proof,
    rprop_provable,
    sign_proof,
    sign_provable,
    sm3_proof,
    sm3_provable,
    yogi_proof,
    yogi_provable,
)
from .weight_proofs import (
    adafactor_proof,
    adafactor_provable,
    adamw_proof,
    conditional_gradient_proof,
    conditional_gradient_provable,
    fromage_proof,
    fromage_provable,
    lamb_proof,
    lamb_provable,
)


class _Proof(NamedTuple):
    provable: Callable[[Any], bool]  # from the config alone
    build: Callable[[Any], Prove]  # the step's proof, from the config
    # what it reads each step besides its input's norm (from the config, where that varies)
    reads: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()
    limit: str = ""  # where it proves nothing, for the plan


_LARGEST_STATE = "its state's largest element"
_WEIGHTS = "its weights' norm"
_PREVIOUS = "its previous gradient's largest element"
_FIRST_MOMENT = "its first moment's largest element"


def _weights_where_decayed(config: Any) -> tuple[str, ...]:
    """An optax rule's proof reads the weights only where a weight decays."""
    return (_WEIGHTS,) if decays_weights(config) else ()


# CheckedWhereItFails: conditions training may fail (a large norm, a long run, a
# scheduled rate): a step that fails one is checked there, not skipped
_PROOFS: dict[str, _Proof] = {
    "clip_by_global_norm": _Proof(clip_provable, clip_proof),
    "sgd": _Proof(sgd_provable, sgd_proof),
    "adam": _Proof(adam_provable, adam_proof),
    "adagrad": _Proof(adagrad_provable,
                      lambda c: mean_square_proof(c, "accumulator", 1.0, 1.0),
                      reads=(_LARGEST_STATE,)),
    "rmsprop": _Proof(rmsprop_provable,
                      lambda c: mean_square_proof(c, "velocity", float32(c.rho),
                                                  float32(1.0 - c.rho)),
                      reads=(_LARGEST_STATE,)),
    "lamb": _Proof(lamb_provable, lambda c: CheckedWhereItFails(lamb_proof(c)),
                   reads=(_WEIGHTS,)),
    "adamax": _Proof(adamax_provable, lambda c: CheckedWhereItFails(adamax_proof(c))),
    "nadam": _Proof(nadam_provable, lambda c: CheckedWhereItFails(nadam_proof(c))),
    "lion": _Proof(sign_provable,
                   lambda c: CheckedWhereItFails(sign_proof(c, "beta_1", "beta_2"))),
    "adamw": _Proof(adam_provable, lambda c: CheckedWhereItFails(adamw_proof(c)),
                    reads=(_WEIGHTS,)),
    "adafactor": _Proof(adafactor_provable, lambda c: CheckedWhereItFails(adafactor_proof(c)),
                        reads=(_LARGEST_STATE, _WEIGHTS),
                        limit="variables of rank 2 or more are checked: their factored "
                              "moments can round to 0"),
    # optax's order: lr * (direction + weight_decay * w)
    "adamaxw": _Proof(adamaxw_provable, lambda c: CheckedWhereItFails(adamaxw_proof(c)),
                      reads=_weights_where_decayed),
    "nadamw": _Proof(nadamw_provable, lambda c: CheckedWhereItFails(nadamw_proof(c)),
                     reads=_weights_where_decayed),
    # its direction's bound per unit of its first moment's largest element (read)
    "adabelief": _Proof(adabelief_provable, lambda c: CheckedWhereItFails(adabelief_proof(c)),
                        reads=lambda c: (_FIRST_MOMENT,) + _weights_where_decayed(c)),
    # its direction's bound, and its look-ahead's square from the previous gradient's
    "adan": _Proof(adan_provable, lambda c: CheckedWhereItFails(adan_proof(c)),
                   reads=lambda c: (_PREVIOUS,) + _weights_where_decayed(c)),
    "radam": _Proof(radam_provable, lambda c: CheckedWhereItFails(radam_proof(c))),
    "sign_sgd": _Proof(sign_provable, lambda c: CheckedWhereItFails(sign_proof(c))),
    "signum": _Proof(sign_provable, lambda c: CheckedWhereItFails(sign_proof(c, "beta"))),
    # a step size times a sign: at its constant rate, its proof reads the input alone
    "rprop": _Proof(rprop_provable, lambda c: CheckedWhereItFails(rprop_proof(c))),
    # a multiple of its rate, and its second moment's largest element
    "amsgrad": _Proof(amsgrad_provable, lambda c: CheckedWhereItFails(amsgrad_proof(c)),
                      reads=(_LARGEST_STATE,)),
    # amsgrad's bound, from its input alone: its new second moment is at most (2 - b2) g**2
    "yogi": _Proof(yogi_provable, lambda c: CheckedWhereItFails(yogi_proof(c))),
    # a multiple of its rate, and its cover's largest element
    "sm3": _Proof(sm3_provable, lambda c: CheckedWhereItFails(sm3_proof(c)),
                  reads=(_LARGEST_STATE,)),
    "fromage": _Proof(fromage_provable, lambda c: CheckedWhereItFails(fromage_proof(c)),
                      reads=(_WEIGHTS,)),
    # its accumulator's largest element, and its weights' norm where it regularises
    "proximal_adagrad": _Proof(
        proximal_adagrad_provable, lambda c: CheckedWhereItFails(proximal_adagrad_proof(c)),
        reads=lambda c: (_LARGEST_STATE,) + ((_WEIGHTS,) if c.l1_regularization_strength > 0
                                             or c.l2_regularization_strength > 0 else ())),
    "conditional_gradient": _Proof(
        conditional_gradient_provable,
        lambda c: CheckedWhereItFails(conditional_gradient_proof(c)), reads=(_WEIGHTS,)),
}
#: gradpipe's own transforms whose outputs can be proved finite (their configs permitting)
PROVED = tuple(_PROOFS)
#: those whose proof bounds every element of their updates (``proofs.Proved``): a
#: bounded transform after one takes its inputs within that bound, reading nothing
BOUND_THEIR_UPDATES = frozenset(PROVED) - {
    "clip_by_global_norm"}  # its output's norm is known: no pass either


def proof_summary(name: str, config: Any) -> str:
    """What the plan says of a proved transform ``name`` with ``config``: what its
    proof reads."""
    proof = _PROOFS[name]
    reads = proof.reads(config) if callable(proof.reads) else proof.reads
    read = ["its input's norm", *reads]
    text = "proved from " + (", ".join(read[:-1]) + " and " if len(read) > 1 else "") + read[-1]
    return text + " (gradpipe knows its maths)" + (f"; {proof.limit}" if proof.limit else "")


def provable(spec: ComponentSpec, config: Any = None) -> bool:
    """Whether the engine proves ``spec``'s outputs finite (with ``config`` instead of
    the spec's own, for a learning rate set while training)."""
    proof = _PROOFS.get(spec.name) if spec.dist == BUILTIN_DIST else None
    return proof is not None and proof.provable(spec.config if config is None else config)


def bounds_updates(spec: ComponentSpec) -> bool:
    """Whether ``spec``'s proof bounds every element of its updates (where it holds)."""
    return spec.name in BOUND_THEIR_UPDATES and provable(spec)


def proof_for(spec: ComponentSpec) -> Prove | None:
    """The proof of ``spec``'s outputs, or ``None`` (they are checked). Call it in the
    pipeline's build scope: a scheduled hyperparameter reads the pipeline's step."""
    return _PROOFS[spec.name].build(spec.config) if provable(spec) else None
